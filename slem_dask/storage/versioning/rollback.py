"""Rolling a versioned store back: the content of an old version committed again as
the new head, through a draft of its own, in a transaction
(:meth:`.versions.VersionedStore.rollback` opens it)."""

from __future__ import annotations

from collections.abc import Callable

from .records import Commit, VersionError

__all__ = ["rollback_to"]


def rollback_to(tx, seq: int, check: Callable[[str], None] | None = None) -> Commit:
    """Commit version ``seq``'s content again as the head of the store of ``tx`` (a
    :class:`.transaction.Transaction`, which holds its lease): the head itself if it
    already holds that content (readers already see it). Under the lease, like every
    job that commits: a writer's ``make_room`` could otherwise prune the old folder
    between this check and the record that names it again, leaving a head with nothing
    behind it. ``check(location)``: called on the old version's folder before it is
    copied, to refuse a version whose content is damaged by raising (storage's
    ``rollback`` checks it end to end, as ``slem-dask verify`` does)."""
    store = tx.store
    old = store.commit_at(seq)
    if old is None:
        raise ValueError(
            f"{str(store.path)!r} has no version {seq}; list them with "
            f"`slem-dask versions {store.path}`"
        )
    head = store.head()
    assert head is not None  # the record of ``old`` was read: the store has a head
    source = f"rollback to {seq}"
    if head.version == old.version or (head.source == source and head.checksum == old.checksum):
        return head  # a new commit would change nothing but the history
    store.check(old)  # still there, unchanged
    # a copy in a draft of its own, committed as any draft is: a job whose lease was
    # taken over may still prune the old folder, never a draft that a record names
    draft = tx.begin()
    with tx.discarded_on_failure():  # kept if its commit's outcome is unknown
        if check is not None:  # its chunks too: a damaged version is never made current
            check(store.location(old.version))  # (after begin: a shared folder is refused)
        try:
            store.backend.copy_tree(store._folder(old.version), store._folder(draft.version))
        except FileNotFoundError:
            raise VersionError(
                f"{str(store.path)!r}: version {seq} was pruned while this rollback "
                f"copied it; nothing was committed: roll back to a version listed by "
                f"`slem-dask versions {store.path}`"
            ) from None
        # deleting a version begins with its zarr.json: if it is still there and
        # unchanged, nothing of the version was deleted while it was copied
        store.check(old)
        record = tx.commit(old.kind, old.summary, source)
    tx.collect_garbage()  # the rollback is committed: what is left goes with the next job
    return record
