"""A slem-dask job slowed down on purpose, for the fault tests (tests/system/test_faults.py):
``python _slow_job.py encode MODEL POSITIVES OUT``, ``... fit NEGATIVES MODEL`` or
``... search QUERIES DATABASE OUT``.

Each output partition (encode) or the read-back of a model or search result sleeps
``SLOW_JOB_DELAY`` seconds, so that a test can stop or kill the job at a known
moment; the job prints ``started`` once its draft is being written (and, with
``SLOW_JOB_SAY_PRUNED=1``, ``pruned`` once it has deleted older versions and drafts).
"""

import os
import sys
import threading
import time

from slem_dask import pipeline, storage

DELAY = float(os.environ.get("SLOW_JOB_DELAY", "0.5"))
_SAYING = threading.Lock()


def say(word: str) -> None:
    """One line, whole: ``print`` writes the word and its newline in two calls, and
    the pruning thread's ``pruned`` and a partition's ``started`` then came out as
    ``startedpruned`` (the test waited for both and the job ran to its end)."""
    with _SAYING:
        sys.stdout.write(word + "\n")
        sys.stdout.flush()


def main() -> int:
    kind, *paths = sys.argv[1:]
    if kind == "encode":
        real = storage.write_partition

        def slow(block, arr, index, block_info=None):
            say("started")
            time.sleep(DELAY)
            return real(block, arr, index)

        storage.write_partition = slow
        if os.environ.get("SLOW_JOB_SAY_PRUNED"):  # the older drafts' clean-up is over
            real_room = storage.versions.VersionedStore.make_room

            def room(self, mine=None):
                pruned = real_room(self, mine)
                say("pruned")
                return pruned

            storage.versions.VersionedStore.make_room = room
        model, positives, out = paths
        report = pipeline.encode_job(
            None,
            model,
            positives,
            out,
            partition_rows=40,
            overwrite=bool(os.environ.get("SLOW_JOB_OVERWRITE")),
        )
    else:  # fit or search: their model or result is read back before the commit
        real_check = storage.nodes.groups._check_written

        def slow_check(location, arrays, what):
            say("started")
            time.sleep(DELAY)
            return real_check(location, arrays, what)

        storage.nodes.groups._check_written = slow_check
        if kind == "search":
            from slem_dask.pipeline.evaluate import search_job

            queries, database, out = paths
            report = search_job(None, queries, database, out, k=3, overwrite=True)
        else:
            negatives, model = paths
            report = pipeline.fit_job(None, negatives, model, lam=0.1, overwrite=True)
    say("\n".join(report.lines()))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # noqa: BLE001 - the test reads the one line
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
