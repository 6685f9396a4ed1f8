"""A dask worker preload for the namespace tests (tests/system/test_partitions.py): every
read of rows and every write of an output partition on this worker sleeps
``SLEM_NS_DELAY`` seconds and leaves a marker file in ``SLEM_NS_PROGRESS``, so that a
test can cut a link while a job is known to be under way."""

import os
import sys
import time
import uuid

import slem_dask.storage  # noqa: F401  (the modules whose functions are slowed)

DELAY = float(os.environ.get("SLEM_NS_DELAY", "0.2"))
PROGRESS = os.environ.get("SLEM_NS_PROGRESS")


def _slowed(real, what):
    def slow(*args, **kwargs):
        if PROGRESS:
            open(
                os.path.join(
                    PROGRESS, f"{what}-{os.environ.get('SLEM_HOST')}-{uuid.uuid4().hex[:8]}"
                ),
                "w",
            ).close()
        time.sleep(DELAY)
        return real(*args, **kwargs)

    slow.__wrapped__ = real
    return slow


# every module that holds the functions, whether it looked them up at import or not
for name in ("read_rows", "write_partition"):
    real = getattr(slem_dask.storage, name)
    slow = _slowed(real, name)
    for module in list(sys.modules.values()):
        if (
            getattr(module, "__name__", "").startswith("slem_dask")
            and getattr(module, name, None) is real
        ):
            setattr(module, name, slow)
