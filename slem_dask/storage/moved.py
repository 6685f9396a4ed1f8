"""The flat ``slem_dask.storage.MODULE`` paths of before the split into subpackages
still import, as the module that now holds that code: user code and docs that name
``slem_dask.storage.versions.VersionedStore`` keep working, and a ``VersionStore`` (or
an error) pickled by a client of the flat layout still unpickles on a worker of this
one (pickle names a class by its module's path). New code imports the subpackages."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

#: {old module name: its subpackage now}. ``verify`` and ``rollback`` are left out (those
#: names of the package are the functions ``storage.verify`` and ``storage.rollback``,
#: which importing the modules would shadow), and
#: ``formats`` is the subpackage itself, whose face names what the module offered.
MOVED = {
    **dict.fromkeys(
        "azure azure_client backend cloud deadlines fsspec_backend gcs gcs_client local local_deadline "
        "outcomes paths registry s3 s3_client s3_messages".split(),
        "backends",
    ),
    **dict.fromkeys(
        "errors gc heads leases markers ownership publish records rootmarker versions".split(),
        "versioning",
    ),
    **dict.fromkeys("formats_detect format_messages".split(), "formats"),
    **dict.fromkeys(
        "checksums chunks dimensions export fingerprints groups inputs outputs readers "
        "recorded workers xarrays".split(),
        "nodes",
    ),
}

_PACKAGE = __name__.rsplit(".", 1)[0]


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module of its new one (the same module object)."""

    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec):
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module):
        # the new module ran already; the import system gave it the old path's spec:
        # its own back (its relative imports and its pickles name its new path)
        module.__spec__ = self.spec


class _OldPaths(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        package, _, name = fullname.rpartition(".")
        if package != _PACKAGE or name not in MOVED:
            return None
        new = f"{_PACKAGE}.{MOVED[name]}.{name}"
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    """Let the old paths import (once per process)."""
    if not any(isinstance(f, _OldPaths) for f in sys.meta_path):
        sys.meta_path.append(_OldPaths())
