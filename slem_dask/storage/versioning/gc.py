"""Garbage of a versioned store (:mod:`.versions`): what is deleted, when, and why it is
provably dead.

Storage under a store ``P`` stays within the kept versions, the draft of each running
job, and the draft a killed job left, until the next job that writes ``P`` begins: that
job (it holds ``P``'s lease) deletes every version folder that can never be read or
committed again, whatever its sequence number. Dead is decided from storage alone,
never from clocks:

* a folder of sequence ``s`` that ``commits/<s>`` does not name: its number is taken,
  its commit can only fail; deleted (:func:`remove_dead`);
* a folder older than the last ``keep`` commits that no kept commit names: pruned;
* a draft of a sequence not committed yet, found by a job that holds the lease: its
  writer is dead or fenced (one writer per store). It is *condemned*: its fate file
  ``fates/<folder>`` is created atomically with ``dead``, then the folder deleted. A job
  commits its draft only after creating the same file with ``commit`` (:func:`claim`);
  of the two creates exactly one wins, so a condemned draft is never committed, and a
  draft whose job won is never deleted. The fate file of a committed draft goes once
  its number is committed; that of a draft never committed (a few bytes) is kept until
  :data:`FATE_HORIZON` newer numbers are committed: it is the proof that lets a later
  collection delete what a fenced job's late write regrows under that folder name
  (:func:`_forget_settled_fates`). After that it goes too (:func:`_forget_old_fates`),
  so ``fates/`` stays bounded; a write landing later still regrows a folder that
  nothing proves slem-dask's, which is then left, never deleted.

A folder that is not a slem-dask draft (:func:`is_slem_dask_draft`) is never touched,
nor is a folder that any kept commit names.
"""

from __future__ import annotations

from .errors import IntegrityError
from .markers import MARKER, check_own_folders, is_link, marked, proves, trusted
from .records import VERSIONS, draft_seq, private_copy_of

__all__ = [
    "FATES",
    "COMMIT",
    "DEAD",
    "is_slem_dask_draft",
    "claim",
    "condemn",
    "remove_dead",
    "collect",
    "DraftFencedError",
    "draft_alive",
    "was_fenced",
    "fenced_message",
    "after_commit",
]

#: The folder of fate files: ``fates/<version folder>`` settles, once, whether that
#: draft is committed or deleted (outside the draft: no zarr reader ever lists it).
FATES = "fates"
COMMIT, DEAD = "commit", "dead"
#: Fate files are kept until this many newer sequence numbers are committed, then
#: deleted (:func:`_forget_old_fates`): ``fates/`` holds the drafts that failed since
#: the number ``head - FATE_HORIZON``, whatever the length of the history.
FATE_HORIZON = 8


class DraftFencedError(IntegrityError):
    """This job's draft was condemned by a job that took the store over: this job was
    fenced and must neither write nor commit."""


def is_slem_dask_draft(store, version: str, names: list[str] | None = None) -> bool:
    """Whether ``versions/<version>`` is a folder that slem-dask began, and so one that
    garbage collection may delete: its name is a version's (``<seq>-<12 hex>``) and
    slem-dask's marker for it, naming this store, is beside it (written before anything
    of the draft; trusted by its content: :func:`.markers.proves`), or its fate file
    exists (stray chunks a fenced job's worker wrote after its draft, marker included,
    was deleted). Never a symbolic link. ``names``: a listing of ``versions/`` made."""
    if store.seq_of(version) is None or is_link(store, version):
        return False
    names = store.backend.list(VERSIONS) if names is None else names
    if version in marked(names) and proves(store, version):
        return True
    return fate_of(store.backend, version) in (COMMIT, DEAD)


def claim(backend, version: str, fate: str) -> str:
    """Settle the fate of draft ``version`` (COMMIT or DEAD) by creating its fate file;
    return the fate that holds, this call's or the one an earlier call created. A lost
    reply or a retry is resolved by reading the file back: only the draft's own job
    ever claims COMMIT, only a job holding the lease claims DEAD."""
    key = f"{FATES}/{version}"
    for _ in range(3):
        try:
            if backend.create(key, fate.encode()):
                return fate
        except FileNotFoundError:  # an empty fates/ pruned beneath the create: again
            continue
        held = backend.read(key)
        if held is not None:
            return held.decode("ascii", "replace").strip()
    raise IntegrityError(
        f"the fate file {key!r} of a draft keeps appearing and vanishing: "
        f"another program deletes in this store; stop it"
    )


def fate_of(backend, version: str) -> str | None:
    data = backend.read(f"{FATES}/{version}")
    return None if data is None else data.decode("ascii", "replace").strip()


def condemn(store, version: str) -> bool:
    """Make draft ``version``, which no commit named when the caller looked, uncommittable,
    then delete it. False (nothing deleted) when its job claimed it for its commit first,
    or committed it meanwhile: a COMMIT fate file is forgotten only once its draft is
    committed, so a DEAD claim that wins after its job's COMMIT claim was forgotten
    finds the commit record, read here after the claim."""
    if claim(store.backend, version, DEAD) != DEAD:
        return False
    record = store.commit_at(store.seq_of(version))
    if record is not None and record.version == version:
        return False  # committed while the caller looked: a version, not a draft
    remove_dead(store, version, settled=True)
    return True


def remove_dead(store, version: str, settled: bool = False) -> None:
    """Delete a draft that can never be committed: its zarr.json first, so that its
    job's workers, if it still runs, stop writing into it (:func:`draft_alive`). Its
    fate file is created first (``settled``: the caller did) and kept: a write of its
    job still in flight may regrow the folder, without a marker, after any clean-up;
    that file proves the regrowth slem-dask's (:func:`_forget_settled_fates`)."""
    if not settled:
        claim(store.backend, version, DEAD)  # either fate proves it slem-dask's
    store.delete_version(version)  # zarr.json, the folder, then its marker


def collect(store, keep: int, mine: str | None = None, leased: bool = False) -> list[str]:
    """Delete what is dead under ``store`` (see the module docstring) and return the
    folders deleted or condemned. ``leased``: the caller holds the store's lease, so the
    drafts of sequences not committed yet, but ``mine``, are condemned. Reads only the
    commit records of the last ``keep`` versions and of the folders present. Refused,
    deleting nothing, where a folder of the store is a link (:func:`.markers.check_own_folders`)."""
    check_own_folders(store)
    last = store.head_seq()  # a few requests, not a listing of the whole history
    seqs = range(max(1, last - keep + 1), last + 1)  # the records run unbroken to it
    records: dict = {}

    def record(seq: int):
        if seq not in records:
            records[seq] = store.commit_at(seq)
        return records[seq]

    kept = {record(seq).version for seq in seqs if seq > last - keep and record(seq)}
    removed = []
    names = store.backend.list(VERSIONS)
    for version in store.listed_versions(names):  # by folder or marker, valid names only
        if version == mine or version in kept:
            continue
        seq = store.seq_of(version)
        if seq > last:  # beyond the commits listed above: judged by its fate file alone
            if leased and is_slem_dask_draft(store, version, names) and condemn(store, version):
                removed.append(version)  # its job is dead or fenced: one writer per store
            continue
        if record(seq) is not None and record(seq).version == version:
            store.delete_version(version)  # committed, too old: pruned (its record proves
            removed.append(version)  # slem-dask wrote it)
        elif is_slem_dask_draft(store, version, names):  # else not slem-dask's: kept
            remove_dead(store, version)  # its number was taken by another folder
            removed.append(version)
    settled = range(max(1, last - max(keep, 1) + 1), last + 1)  # the newest at least
    # a fate file of a committed draft that its own job did not forget: that job died
    # or failed between its record and its end (a private file of the hint, perhaps)
    died = _forget_settled_fates(store, settled, record, names)  # committed numbers
    _forget_old_fates(store, last - FATE_HORIZON, record, names)  # fates/ stays bounded
    _forget_private_copies(store, last - FATE_HORIZON, names, bool(removed) or died)
    return removed


def after_commit(store, seq: int, winner: str) -> None:
    """After ``winner`` was committed as ``seq``: the other drafts of ``seq`` are dead
    (one listing), and the fate files of sequences up to ``seq`` settled."""
    names = store.backend.list(VERSIONS)
    others = [v for v in trusted(store, names, seq) if v != winner]  # by their marker
    for version in others:
        remove_dead(store, version)
    _forget_settled_fates(store, range(seq, seq + 1), store.commit_at, names)
    if others:  # a job of this number failed or died: a private file of its record?
        _forget_private_copies(store, None, names, True)


def _forget_settled_fates(store, seqs: range, record, names: list[str]) -> bool:
    """Settle the fate files of the committed numbers ``seqs`` (``record``: seq ->
    its commit record). The fate file of a draft that was committed is deleted: its
    commit record is the proof now. The fate file of a draft that never was
    (condemned, abandoned, or beaten to its number) is KEPT, for
    :data:`FATE_HORIZON` commits (:func:`_forget_old_fates`): a write of its job that
    was in flight when the draft was deleted (a slow or timed-out request, a worker's
    task still running) may land later and regrow the folder, without a marker; that
    file is then the only proof that slem-dask wrote it, and :func:`collect` deletes
    the regrown folder. One listed again now (``names``: a
    listing of ``versions/``) goes here. Only ``seqs`` are read, so the cost of a
    collection does not grow with the fate files kept. True if the fate file of a
    committed draft was among them."""
    listed, committed = set(store.listed_versions(names)), False
    for version in store.backend.list(FATES):
        seq = store.seq_of(version)
        if seq not in seqs:
            continue  # not committed yet, or settled when it was among the kept
        if record(seq) is not None and record(seq).version == version:
            store.backend.delete(f"{FATES}/{version}")  # committed: its record proves it
            committed = True
        elif version in listed:
            remove_dead(store, version, settled=True)  # regrown: dead
    return committed


def _forget_old_fates(store, through: int, record, names: list[str]) -> None:
    """Delete the fate files of sequence numbers up to ``through`` (committed
    :data:`FATE_HORIZON` numbers ago or more), each read once: a folder of theirs still
    listed, regrown by a late write, goes first unless its record names it. What keeps
    ``fates/`` bounded (docs/guarantees-garbage.md, "What stays bounded"): such a number
    is taken, so a fenced job's commit claim can no longer commit anything (its record's
    create fails), and the proof against a late write is kept for that many commits.
    ``fates/`` is listed even while no number is that old: a collection then asks the
    same of a store whatever the length of its history (tests/storage/test_heads.py)."""
    listed = set(store.listed_versions(names))
    for version in store.backend.list(FATES):
        seq = store.seq_of(version)
        if seq is None or seq > through:
            continue  # not a fate file's name (left), or still within the horizon
        committed = record(seq) is not None and record(seq).version == version
        if version in listed and not committed:
            remove_dead(store, version, settled=True)  # regrown: dead
        store.backend.delete(f"{FATES}/{version}")


def _forget_private_copies(store, through: int | None, names: list[str], commits: bool) -> None:
    """Delete the private files (``<name>.<32 hex>.tmp``, :func:`.records.private_copy_of`)
    that a local write killed before its link or rename left in the store's own folders
    (:func:`.markers.check_own_folders`: no links): a fate file's or a marker's once its
    draft's number is ``through`` or older, as the fate files (:func:`_forget_old_fates`);
    with ``commits``, those of commit records and of the head hint. ``commits/`` grows
    with the history, so it is listed only where a job is known to have failed or died
    (a draft of it deleted, or its fate file left after its commit): the cost of a
    collection does not grow with the history otherwise (tests/storage/test_heads.py).
    Safe while a write is under way: ``LocalBackend.create`` whose private file went
    makes it again (the create alone decides), a put of the hint is best effort. Only
    backends that write such files (``Backend.private_copies``) are asked
    (docs/guarantees-garbage.md, "What stays bounded")."""
    if not getattr(store.backend, "private_copies", False):
        return
    for name in store.backend.list("commits") if commits else ():
        target = private_copy_of(name)
        if target is not None and (target == ".head" or _record_seq(target) is not None):
            store.backend.delete(f"commits/{name}")
    if through is None:
        return
    for folder, listing in ((FATES, store.backend.list(FATES)), (VERSIONS, names)):
        for name in listing:
            target = private_copy_of(name)
            if target is not None and folder == VERSIONS:
                target = target.removesuffix(MARKER) if target.endswith(MARKER) else None
            seq = draft_seq(target) if target is not None else None
            if seq is not None and seq <= through:
                store.backend.delete(f"{folder}/{name}")


def _record_seq(name: str) -> int | None:
    stem = name.removesuffix(".json")
    return int(stem) if stem != name and stem.isdigit() else None


def fenced_message(store, version: str) -> str:
    """What a job whose draft ``version`` was condemned or deleted says: it was fenced."""
    return (
        f"{str(store.path)!r}: this job was fenced: another slem-dask job took the "
        f"store over while this one ran (this job's lease was thought dead) and "
        f"deleted its draft {version}; nothing this job wrote was ever visible to "
        f"readers (a partition it was still writing may land in that draft's folder: the "
        f"next job that writes this store deletes it): see what that job wrote with "
        f"`slem-dask versions {store.path}` before you run this command again"
    )


def was_fenced(store, version: str) -> bool:
    """Whether draft ``version`` was condemned or deleted by another job (read from
    storage: its fate file, or a commit of its sequence number naming another folder)."""
    if fate_of(store.backend, version) == DEAD:
        return True
    seq = store.seq_of(version)
    record = store.commit_at(seq) if seq is not None else None
    return record is not None and record.version != version


def draft_alive(arr) -> bool:
    """Whether the draft that the zarr array ``arr`` (at a draft's root) was opened in
    still has its zarr.json: a condemned or dead draft has none, and its fenced job's
    workers must not grow it again."""
    from zarr.core.sync import sync

    key = f"{arr.path}/zarr.json" if arr.path else "zarr.json"
    return bool(sync(arr.store_path.store.exists(key)))
