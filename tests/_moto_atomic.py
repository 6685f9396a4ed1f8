"""moto's S3 server with its conditional writes made atomic, for the tests.

moto (5.x) checks ``If-None-Match: *`` and then stores the object with no lock
between the two (``S3Response.put_object``, and the same in a multipart
upload's completion), while its server answers each request on its own thread.
Under load two racing creates of one key can then both succeed, which AWS S3 and
SeaweedFS never allow. The tests check slem-dask's protocol, not moto's
threading, so this launcher serialises the two handlers that can write a key
conditionally and then runs moto's own server: ``python tests/_moto_atomic.py
-H HOST -p PORT``.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any


def _serialised(method: Callable[..., Any], lock: threading.Lock) -> Callable[..., Any]:
    @functools.wraps(method)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return method(*args, **kwargs)

    return locked


def make_conditional_writes_atomic() -> None:
    from moto.s3.responses import S3Response

    # one lock for both: a PUT and a multipart completion may race for one key
    lock = threading.Lock()
    for name in ("put_object", "_key_response_post"):
        setattr(S3Response, name, _serialised(getattr(S3Response, name), lock))


if __name__ == "__main__":
    make_conditional_writes_atomic()
    from moto.server import main

    main(sys.argv[1:])
