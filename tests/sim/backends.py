"""Which backend a simulated world's protocol code gets for ``sim://bucket/...``.

``sim``: :class:`.server.SimBackend` (the S3-shaped in-memory store whose every fault is
an OSError); ``s3``, ``gcs``, ``azure``: the real backend classes of
:mod:`slem_dask.storage` over the fake client libraries of :mod:`.clients` and
:mod:`.buckets` (the backends' own code, their libraries' exception types); ``local``:
the real :class:`~slem_dask.storage.backends.local.LocalBackend` on a temporary folder, with
faults at the ``os`` calls it makes (:mod:`.disk`).
"""

from __future__ import annotations

import contextlib
import json

from .server import SimBackend, SimListingBackend

KINDS = ("sim", "s3", "gcs", "azure", "local")
#: the real backend's URL of a sim:// one
SCHEMES = {"s3": "s3://", "gcs": "gs://", "azure": "az://"}


def backend_for(world, url: str):
    if not url.startswith("sim://"):
        raise AssertionError(f"the simulation reached real storage: {url}")
    kind = world.backend_kind
    if kind == "sim":
        # half the seeds on a store that lists from a name (as S3 does): both ways of
        # finding the head from its hint (storage.heads) meet every fault
        return (SimListingBackend if world.seed % 2 else SimBackend)(world, url)
    if kind == "local":
        from . import disk

        return disk.backend(world, url)
    from slem_dask.storage.backends.azure import AzureBackend
    from slem_dask.storage.backends.gcs import GCSBackend
    from slem_dask.storage.backends.s3 import S3Backend

    cls = {"s3": S3Backend, "gcs": GCSBackend, "azure": AzureBackend}[kind]
    return cls(SCHEMES[kind] + url[len("sim://") :])


def configured(protocol: str, options: dict) -> dict:
    """The options the real file system of ``protocol`` would run with: fsspec's
    defaults for it (``fsspec.config.conf``, where slem-dask's deadlines put botocore's)
    under the options given, and ``deadlines`` (timeout, attempts) where fsspec's
    registry holds a slem-dask class for it that applies them itself."""
    import fsspec
    from fsspec.config import conf

    merged = _deep_merge(conf.get(protocol, {}), options)
    from fsspec.registry import known_implementations

    registered = fsspec.registry.get(protocol)
    name = (
        registered.__module__
        if registered is not None
        else known_implementations.get(protocol, {}).get("class", "")
    )
    if name.startswith("slem_dask."):
        from slem_dask.storage.backends import deadlines

        policy = deadlines.current()
        merged["deadlines"] = (policy.timeout, policy.attempts)
    return merged


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            _deep_merge(out[key], value)
            if isinstance(value, dict) and isinstance(out.get(key), dict)
            else value
        )
    return out


def _filesystem(world):
    """``cloud.cached_filesystem`` under the simulation: one fake per world, protocol
    and options (the options the backend gives its library, timeouts included)."""
    from .buckets import FakeAzureFileSystem, FakeGCSFileSystem
    from .clients import FakeS3FileSystem

    made = world.__dict__.setdefault("filesystems", {})

    def cached_filesystem(protocol, options, env_prefixes=()):
        token = (protocol, json.dumps(options, sort_keys=True, default=repr))
        if token not in made:
            cls = {"s3": FakeS3FileSystem, "gs": FakeGCSFileSystem, "az": FakeAzureFileSystem}
            made[token] = cls[protocol](world, configured(protocol, dict(options)))
        return made[token]

    return cached_filesystem


@contextlib.contextmanager
def clients(world):
    """Put the fake client libraries where the real backends find theirs."""
    if world.backend_kind == "sim":
        yield
        return
    if world.backend_kind == "local":
        from . import disk

        with _patched(disk.patches(world)):
            yield
        return
    import fsspec.asyn
    import s3fs.core

    from slem_dask.storage.backends import azure
    from slem_dask.storage.backends import cloud
    from slem_dask.storage.backends import s3

    from . import transport

    fake = transport.fake_asyncio(world)
    patches = {
        (fsspec.asyn, "sync"): transport.sync,
        (s3fs.core, "asyncio"): fake,
        (s3, "asyncio"): fake,
        (azure, "asyncio"): fake,
        (cloud, "cached_filesystem"): _filesystem(world),
        (s3, "cached_filesystem"): _filesystem(world),
    }
    with _patched(patches):
        yield


_ABSENT = object()


@contextlib.contextmanager
def _patched(patches: dict):
    saved = {target: getattr(*target, _ABSENT) for target in patches}
    for (module, name), value in patches.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for (module, name), value in saved.items():
            if value is _ABSENT:
                delattr(module, name)
            else:
                setattr(module, name, value)
