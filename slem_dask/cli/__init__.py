"""The ``slem-dask`` command line: options (:mod:`.parser`), the commands that run jobs
on a cluster (:mod:`.main`: checks before a cluster in :mod:`.checks`, the jobs and their
results in :mod:`.jobs`, errors, interrupts and a closed stdout in :mod:`.endings`) and
those that read or restore stores without one (:mod:`.stores`). The top layer: it may import every other package, and none imports it.
"""


def console_main():
    """The ``slem-dask`` executable (``[project.scripts]``): :func:`.main.console_main`,
    imported when run so that importing this package stays cheap."""
    from .main import console_main as run

    return run()
