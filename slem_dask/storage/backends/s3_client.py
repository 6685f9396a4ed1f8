"""s3fs's file system with the deadlines of :mod:`.deadlines`: fsspec makes it for every
``s3://`` URL once :func:`.deadlines.install` registered it (imported only then)."""

from __future__ import annotations

import s3fs

from .deadlines import current

__all__ = ["DeadlineS3FileSystem"]


class DeadlineS3FileSystem(s3fs.S3FileSystem):
    """botocore tries each request as often as set (its timeouts and retries come with
    fsspec's defaults, :func:`.deadlines.install`); s3fs's own loop, which tried
    botocore's whole call 5 times more after a timeout, tries it once."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.retries = 1
        current()  # a bad setting is refused here, in one line


# one instance cache with s3fs's: clearing s3fs's (a test that changed the endpoint)
# forgets these too
DeadlineS3FileSystem._cache = s3fs.S3FileSystem._cache
