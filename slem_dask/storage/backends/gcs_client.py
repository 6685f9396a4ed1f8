"""gcsfs's file system with the deadlines of :mod:`.deadlines`: fsspec makes it for
every ``gs://`` URL once :func:`.deadlines.install` registered it (imported only then,
so that slem-dask imports neither gcsfs nor aiohttp before a gs:// path is used)."""

from __future__ import annotations

import gcsfs
import gcsfs.core
from gcsfs.retry import retry_request

from .deadlines import current

__all__ = ["DeadlineGCSFileSystem"]

# gcsfs's request, without its retries (six, fixed when gcsfs is imported), and the
# retry loop itself (which errors it retries, 1 + 2**i s apart): tried as often as set
_ONE_REQUEST = gcsfs.core.GCSFileSystem._request.__wrapped__
_RETRIED = retry_request.__wrapped__


class DeadlineGCSFileSystem(gcsfs.GCSFileSystem):  # the extended one where gcsfs picks it
    """Each request with a connect and a read timeout (gcsfs's default is none: a
    silent store held a request forever), tried ``attempts`` times;
    ``requests_timeout`` given explicitly wins."""

    def __init__(self, *args, **kwargs):
        policy = current()
        if kwargs.get("requests_timeout") is None:
            kwargs.update(policy.gcsfs_options())
        super().__init__(*args, **kwargs)
        self._slem_attempts = policy.attempts

    async def _request(self, *args, **kwargs):
        return await _RETRIED(_ONE_REQUEST, self._slem_attempts, self, *args, **kwargs)
