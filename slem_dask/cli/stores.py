"""The commands that read or restore stores without a cluster: ``verify``, ``versions``,
``rollback`` and ``export`` (:mod:`slem_dask.cli.main` runs them)."""

from __future__ import annotations

import errno
import os

__all__ = ["verify", "versions", "export"]


def verify(paths) -> bool:
    """Check each store end to end, one line each (and one per problem): all fine?"""
    from .. import storage

    fine = True
    for path in paths:
        what, problems = storage.verify(path)
        if problems:
            fine = False
            print(f"{path}: {what}: {len(problems)} problem(s)")
            for problem in problems:
                print(f"  - {problem}")
            if getattr(problems, "fix", ""):
                print(f"  fix: {problems.fix}")
        else:
            print(f"{path}: {what}: ok")
    return fine


def _rollback(store, seq: int):
    """``storage.rollback``: version ``seq`` checked whole, then made current, with a
    store that this user cannot write said in one line (not the errno of the private
    file that a commit record is first written to)."""
    from .. import storage

    try:
        return storage.rollback(store.path, seq)
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        why = "read-only file system" if exc.errno == errno.EROFS else "permission denied"
        raise PermissionError(
            f"{str(store.path)!r}: cannot write there ({why}): a rollback commits a new "
            f"record under its commits/; nothing was changed: run it as a user who may "
            f"write to the store, or where it is mounted read-write"
        ) from None


def versions(args) -> None:
    """`versions PATH`: the history, one line per commit; `rollback PATH --to N`: version N
    made current by a new commit, or nothing committed if the current one holds it."""
    from ..storage import shown_path
    from ..storage import versioning as versioned

    store = versioned.VersionedStore(args.path)
    if not store.has_history():
        raise _no_history(store, args)
    if args.command == "rollback":
        before = store.head()
        args.head_before = before.seq if before else 0  # what an interrupt says is committed
        commit = _rollback(store, args.to)
        if commit.seq == before.seq:  # the current version already holds version N
            held = f" (as version {commit.seq}, {commit.source})" if commit.seq != args.to else ""
            print(
                f"{store.path}: version {args.to} is already current{held}; nothing to "
                f"roll back, no version committed"
            )
        else:
            print(f"{store.path}: version {commit.seq} is now current ({commit.source})")
        return
    commits = store.commits()
    head = commits[-1].seq if commits else None
    if commits:
        print(
            f"{store.path}: {len(commits)} version(s) committed, oldest first; readers "
            f"read the current one; a pruned one keeps only its record"
        )
        print(
            f"{'N':>5}  {'kind':<9} {'state':<8} {'committed (UTC)':<20}  by, then what it holds and its folder"
        )
    for c in commits:
        state = (
            "current" if c.seq == head else ("readable" if store.exists(c.version) else "pruned")
        )
        where = store.location(c.version) if state != "pruned" else "-"
        summary = c.summary if isinstance(c.summary, dict) else {}
        encodes, model = summary.get("positives"), summary.get("model_fingerprint")
        print(
            f"{c.seq:>5}  {c.kind:<9} {state:<8} {c.created}  {c.job} on {c.host}"
            f"{'  (' + c.source + ')' if c.source else ''}"
            f"{f'  encodes {shown_path(encodes)!r}' if isinstance(encodes, str) else ''}"
            # as fit and encode print a model, and a refusal of another model names it
            f"{f' with model identity {model}' if isinstance(model, str) else ''}"
            f"  {where}"
        )
    if not commits:
        print(f"{store.path}: no committed version (an unfinished first write)")


def _no_history(store, args) -> ValueError:
    """The error of `versions P` / `rollback P` for a ``P`` without a history of its own:
    a member or a version folder of a store names that store; anything else is no store."""
    from ..storage import versioning as versioned

    try:
        owner = versioned.resolve(args.path)[1]
    except Exception:  # noqa: BLE001 - a damaged store around it: say what is sure
        owner = None
    if owner is not None and str(owner.path) != str(store.path):
        fix = (
            f"roll that store back: slem-dask rollback {owner.path} --to {args.to}"
            if args.command == "rollback"
            else f"list them with `slem-dask versions {owner.path}`"
        )
        return ValueError(
            f"{str(store.path)!r} is part of the slem-dask store {str(owner.path)!r} and "
            f"has no versions of its own: the store's versions hold it; {fix}"
        )
    if "://" not in str(args.path) and not os.path.lexists(args.path):
        return ValueError(
            f"{str(store.path)!r} does not exist: check the path (a job that has not run "
            f"yet writes nothing there)"
        )
    return ValueError(
        f"{str(store.path)!r} has no versions: it was not written by this slem-dask (or "
        f"not at all); `slem-dask verify {args.path}` says what it is"
    )


def export(args) -> None:
    """`export PATH --to OUT`: one committed version copied out as plain zarr or .npy."""
    from ..cluster.preflight import check_writable
    from ..storage.nodes import export_version as copy_out

    check_writable({"--to": args.to})  # a file as its parent, a read-only folder: one line
    facts = copy_out(args.path, args.to, args.export_version, args.overwrite)
    kind = facts["kind"]
    if facts.get("member"):  # corpus.zarr/negatives: that array, not the whole corpus
        kind = f"{facts['member']!r} of the {kind}"
    what = kind + (f" {facts['shape']} {facts['dtype']}" if "shape" in facts else "")
    print(f"{facts['path']}: version {facts['version']} ({what}) exported to {facts['to']}")
