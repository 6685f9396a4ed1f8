"""``python -m slem_dask``: the ``slem-dask`` command line."""

from .cli.main import console_main

if __name__ == "__main__":
    console_main()
