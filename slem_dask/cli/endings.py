"""How a command ends when it does not finish: one line saying what it left, for an
interrupt, a reader of stdout that went away, or a stop before the end."""

from __future__ import annotations

import os
import sys

from .checks import STORE_COMMANDS
from .jobs import _print_results

#: Exit status when stdout's reader went away (`slem-dask ... | head -1`): 128 + SIGPIPE,
#: what a shell reports for a program that SIGPIPE ended, not 0: not all the output was
#: read, and a pipe closed while a job ran stops that job (`set -o pipefail` scripts see it).
EXIT_BROKEN_PIPE = 141


def _paths_of(args) -> list[str]:
    """The store paths a command names (for an object store's one-line errors)."""
    names = (
        "negatives",
        "model",
        "positives",
        "out",
        "queries",
        "database",
        "corpus",
        "path",
        "to",
    )
    paths = [getattr(args, n) for n in names if isinstance(getattr(args, n, None), str)]
    return paths + [p for p in getattr(args, "paths", None) or [] if isinstance(p, str)]


def _spec_paths(spec) -> list[str]:
    """The store paths a job spec names."""
    if spec is None:
        return []
    paths = [spec.model.path] + ([spec.fit.negatives] if spec.fit else [])
    return paths + [p for e in spec.encode for p in (e.positives, e.out)]


def _stdout_is_gone() -> bool:
    """Whether stdout's reader went away: a BrokenPipeError may also come from a socket of
    the cluster or of a store, an error to report. The write end of a pipe (or socket)
    without a reader polls as POLLERR (or POLLHUP), always reported, whatever is asked."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)
        return bool(poller.poll(0))
    except (AttributeError, ValueError, OSError):  # no poll (Windows), or not a file
        return False


def _reader_gone(args) -> int:
    """The reader of stdout went away: exit quietly, as Python's documentation says to
    (docs.python.org/3/library/signal.html, "Note on SIGPIPE"), saying only on stderr
    what a job cut short by it left."""
    _silence_stdout()
    if args.command not in STORE_COMMANDS and getattr(args, "finished", None) is None:
        print(
            f"slem-dask {args.command}: stopped: the reader of its output closed it "
            f"before the job finished; {_not_complete(args)}",
            file=sys.stderr,
        )
    return EXIT_BROKEN_PIPE


def _silence_stdout() -> None:
    """stdout to /dev/null, so that the flush at exit cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _flush_stdout(code: int) -> int:
    """Flush stdout; the exit status to use if its reader went away meanwhile (a pipe's
    output is buffered: that shows here), a failed job's own status first."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
        return code or EXIT_BROKEN_PIPE
    return code


def _interrupted(args) -> int:
    """What an interrupt (Ctrl-C) leaves behind, said in one line; exit status 130."""
    progress = getattr(args, "progress", None)
    if progress or (progress is None and sys.stdout.isatty()):
        sys.stdout.write("\n")  # end a progress line written with "\r" (kernel passes)
        sys.stdout.flush()
    if getattr(args, "finished", None) is not None:
        _print_results(args, *args.finished)
        print(
            f"slem-dask {args.command}: interrupted while the dask cluster was closing, "
            f"after the job had finished: what it wrote above is complete",
            file=sys.stderr,
        )
        return 130
    head_before = getattr(args, "head_before", None)
    # the interrupt may come after the job committed its output: complete only if this
    # job's commit moved the head past the one it began from (unknown: not begun)
    if args.command == "encode" and head_before is not None:
        finished = _finished_within(args.out, head_before, INTERRUPTED_LOOK_SECONDS)
        if finished:
            print(
                f"slem-dask encode: interrupted after the output was finished: "
                f"{args.out!r} is complete (`slem-dask verify {args.out}` checks it again)",
                file=sys.stderr,
            )
            return 130
        if finished is None:  # its store did not answer in time: say what is known
            print(
                f"slem-dask encode: interrupted; whether {args.out!r} was finished is "
                f"unknown: its store did not answer within {INTERRUPTED_LOOK_SECONDS:g} s "
                f"(`slem-dask verify {args.out}` tells once it answers; if it was not, "
                f"the same command resumes it)",
                file=sys.stderr,
            )
            return 130
    if args.command in WRITTEN and head_before is not None:
        said = _committed_line(args, getattr(args, WRITTEN[args.command]), head_before)
        if said:
            print(said, file=sys.stderr)
            return 130
    print(f"slem-dask {args.command}: interrupted; {_not_complete(args)}", file=sys.stderr)
    return 130


#: command -> the option naming the store it commits (encode's ending is its own)
WRITTEN = {"fit": "model", "search": "out", "rollback": "path"}


def _committed_line(args, path, head_before: int) -> str | None:
    """The line of a fit, search or rollback interrupted after its commit (the head of
    ``path`` moved past ``head_before``) or whose store did not say; else None (then
    nothing was committed: the usual line is true)."""
    # a store that fails to answer, like one that is silent, leaves it unknown
    from ..storage.backends import answer_within

    moved = answer_within(lambda: head_seq_after(path, head_before), INTERRUPTED_LOOK_SECONDS)
    verify = f"`slem-dask verify {path}` checks it"
    if moved:
        return (
            f"slem-dask {args.command}: interrupted after its commit: {path!r} holds the "
            f"new version {moved} ({verify}; `slem-dask versions {path}` lists it)"
        )
    if moved is None:
        return (
            f"slem-dask {args.command}: interrupted; whether it committed a version of "
            f"{path!r} is unknown: its store did not tell within "
            f"{INTERRUPTED_LOOK_SECONDS:g} s (`slem-dask versions {path}` tells once it "
            f"answers; if it did not, run the same command again)"
        )
    return None


def head_seq_after(path, head_before: int) -> int:
    """The head's sequence number of ``path`` if past ``head_before``, else 0."""
    from ..storage import VersionedStore

    seq = VersionedStore(path).head_seq()  # raises where the store cannot say
    return seq if seq > head_before else 0


#: The most seconds an interrupted encode waits to learn whether its output was finished.
INTERRUPTED_LOOK_SECONDS = 5.0


def _finished_within(out, head_before, seconds: float) -> bool | None:
    """Whether the encode's commit moved the head of ``out`` past ``head_before``; None
    if its store did not answer within ``seconds`` (Ctrl-C ends a job within seconds,
    whether its store answers or not)."""
    from ..storage.backends import answer_within
    from ..storage import marked_complete

    # unreadable: not known to be finished
    return answer_within(lambda: marked_complete(out, after=head_before), seconds, failed=False)


def _not_complete(args, short: bool = False, advice: bool = True) -> str:
    """What a command stopped before its end leaves, in its own words (``short``: without
    the advice to run it again; ``advice=False``: an encode's without it, for a message
    that ends with its own)."""
    if short:
        return (
            "the steps reported above are complete, the one under way was not marked complete"
            if args.command in ("run", "demo")
            else "nothing was marked complete"
        )
    if args.command == "encode":  # what the storage holds now, not what a job may leave
        try:
            from ..pipeline.encode import what_is_kept
        except Exception:  # noqa: BLE001 - an import cut short by Ctrl-C left modules
            # half-imported (dask's yaml): the job, in that module, cannot have begun
            return "nothing was written (the encode had not started)" + (
                ": run the same command again" if advice else ""
            )
        return what_is_kept(args.out, getattr(args, "head_before", None), advice=advice)
    # demo and run write several stores one after the other: the ones they had
    # finished are complete (and verified), only the one under way is not
    said = {
        "run": "the steps reported above are complete; the one under way was not marked "
        "complete (an unfinished output is kept and refused by readers): run the "
        "same spec again to resume",
        "demo": "the stores it had finished are complete (`slem-dask verify PATH` says "
        "which); the one under way was not marked complete: run `slem-dask demo` "
        "again to finish",
    }
    default = "nothing was marked complete (no model or output was written)"
    return said.get(args.command, default)
