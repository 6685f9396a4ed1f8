"""Helpers for tests that reach inside versioned stores (slem_dask.storage.versions)."""

from __future__ import annotations

from pathlib import Path

from slem_dask.storage import versions


def head(path) -> Path:
    """The folder of the head version of the versioned store at ``path``."""
    store = versions.VersionedStore(str(path))
    return Path(store.location(store.head().version))


def recommit(path) -> None:
    """Re-record the head version's metadata checksum after a test edited it: what a
    writer that committed bad metadata would have left (to test the checks behind the
    commit record's)."""
    store = versions.VersionedStore(str(path))
    commit = store.head()
    data = (head(path) / "zarr.json").read_bytes()
    fields = {k: getattr(commit, k) for k in commit.__dataclass_fields__}
    fields["checksum"] = versions._checksum(data)
    store.backend.put(f"commits/{commit.seq:08d}.json", versions.Commit(**fields).to_json())
