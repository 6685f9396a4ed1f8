"""gcsfs's file system with the deadlines of :mod:`.deadlines`: fsspec makes it for
every ``gs://`` URL once :func:`.deadlines.install` registered it (imported only then,
so that slem-dask imports neither gcsfs nor aiohttp before a gs:// path is used)."""

from __future__ import annotations

import gcsfs

from .deadlines import current

__all__ = ["DeadlineGCSFileSystem"]


class DeadlineGCSFileSystem(gcsfs.GCSFileSystem):  # the extended one where gcsfs picks it
    """Each request with a connect and a read timeout (gcsfs's default is none: a
    silent store held a request forever); ``requests_timeout`` given explicitly wins."""

    def __init__(self, *args, **kwargs):
        if kwargs.get("requests_timeout") is None:
            kwargs.update(current().gcsfs_options())
        super().__init__(*args, **kwargs)
