"""Commit records of a versioned store (:mod:`.versions`): ``commits/<seq>.json``, one per
commit, created atomically and never rewritten; and the names of version folders."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

__all__ = [
    "Commit",
    "VersionError",
    "DamagedCommitError",
    "draft_seq",
    "version_folder_seq",
    "private_copy_of",
    "forget_lease_copies",
    "VERSIONS",
    "VERSION_NAME",
    "FORMAT",
]

VERSIONS = "versions"
FORMAT = 1
#: a version folder's name: its sequence number, then the token of the job attempt
VERSION_NAME = re.compile(r"([0-9]{8,})-[0-9a-f]{12}")
#: the private file that a local write fills before it links or renames it to ``<name>``
#: (:class:`~.local.LocalBackend`): ``<name>.<32 hex digits>.tmp``
PRIVATE_COPY = re.compile(r"(.+)\.[0-9a-f]{32}\.tmp")


class VersionError(ValueError):
    """A version that cannot be read as asked (never committed, pruned)."""


class DamagedCommitError(VersionError):
    """A commit record cannot be read, or its version folder does not match it."""


def _checksum(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Commit:
    """One commit record: version ``seq`` of a store is the folder ``version``."""

    seq: int
    version: str
    kind: str
    job: str
    host: str
    checksum: str  # sha256 of the version's zarr.json at commit
    created: str  # as the committing host wrote it: shown, never compared
    summary: dict
    source: str = ""  # "rollback to N" and the like
    token: str = ""  # unique per job attempt: a record read back is known as ours

    def to_json(self) -> bytes:
        fields = {k: getattr(self, k) for k in self.__dataclass_fields__}
        fields["format"] = FORMAT
        fields["record_checksum"] = _checksum(json.dumps(fields, sort_keys=True).encode())
        return json.dumps(fields, sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Commit:
        try:
            fields = json.loads(data)
            recorded = fields.pop("record_checksum")
            if _checksum(json.dumps(fields, sort_keys=True).encode()) != recorded:
                raise ValueError("its checksum does not match its content")
            fields.pop("format")
            # fields a later slem-dask adds are covered by the checksum, and not needed
            # here (this one's own ``token`` made records unreadable by the one before)
            commit = cls(**{k: v for k, v in fields.items() if k in cls.__dataclass_fields__})
        except (ValueError, KeyError, TypeError) as exc:
            raise DamagedCommitError(
                f"the commit record {where!r} cannot be read ({exc}); the store's history "
                f"is damaged: restore that file from a copy"
            ) from None
        seq = draft_seq(commit.version)
        if seq is None or not isinstance(commit.seq, int) or seq > commit.seq:
            raise DamagedCommitError(
                f"the commit record {where!r} names the version folder "
                f"{commit.version!r}, which is not a version of this store (expected "
                f"<sequence number>-<12 hex digits> directly under {VERSIONS}/, numbered "
                f"at most {commit.seq}); the store's history is damaged: nothing is read "
                f"through it: restore that file from a copy"
            )
        return commit


def draft_seq(version) -> int | None:
    """The sequence number a version folder was begun for, from its name
    ``<seq>-<12 hex digits>``; None for any other name (``..``, a path, a user's
    ``1-notes``): such a folder is never read or deleted as a version."""
    match = VERSION_NAME.fullmatch(version) if isinstance(version, str) else None
    return int(match.group(1)) if match else None


def version_folder_seq(path) -> int | None:
    """The sequence number of the version folder at ``path`` (``P/versions/<seq>-<hex>``),
    from the path alone (no request, so it can be said while the store fails); None for
    any other path."""
    *_, parent, name = ("/", *str(path).rstrip("/").split("/"))
    return draft_seq(name) if parent == VERSIONS else None


def private_copy_of(name: str) -> str | None:
    """The name whose private copy ``name`` is (``<name>.<32 hex digits>.tmp``, what a
    local write of ``<name>`` leaves when its process is killed before the link or
    rename), or None."""
    match = PRIVATE_COPY.fullmatch(name)
    return match.group(1) if match else None


def forget_lease_copies(backend, key: str, url: str, token: str) -> None:
    """Delete the private files of the lease ``key`` of the store ``url``
    (``<lease>.<32 hex>.tmp``) that a local write killed before its link or rename left
    beside the store, once the job of ``token`` holds that lease: their writers lost it
    (fenced). Each is trusted by its content alone, a whole lease record of this store
    with another token, as a marker is; anything else (an empty file of a process killed
    before its write) is left. Best effort: the lease is taken either way
    (docs/guarantees-garbage.md)."""
    if not getattr(backend, "private_copies", False):
        return
    try:
        for name in backend.list(""):
            if private_copy_of(name) != key:
                continue
            try:
                record = json.loads(backend.read(name) or b"")
            except ValueError:
                continue  # not a whole record: nothing proves it slem-dask's
            if (
                isinstance(record, dict)
                and record.get("store") == url
                and record.get("token") not in (None, token)
            ):
                backend.delete(name)
    except Exception:  # noqa: BLE001 - garbage: left to the next job that takes it
        pass
