"""The test tree mirrors the package (issue 33, docs/architecture.md "The test tree"):
every test file sits in the folder of the package it tests, or in system/."""

from helpers import ROOT, TESTS

FOLDERS = {p.name for p in (ROOT / "slem_dask").iterdir() if (p / "__init__.py").exists()} | {
    "system"
}


def test_every_test_file_is_in_a_package_folder():
    assert {"core", "storage", "cli"} <= FOLDERS, FOLDERS  # the package was found
    misplaced = [
        str(p.relative_to(TESTS))
        for p in sorted(TESTS.rglob("test_*.py"))
        if p.parent.parent != TESTS or p.parent.name not in FOLDERS
    ]
    assert not misplaced, (
        f"tests/{misplaced[0]} is in no package folder: git mv it to "
        f"tests/<{'|'.join(sorted(FOLDERS))}>/ after the package it tests "
        f"({len(misplaced)} file(s): {', '.join(misplaced)})"
    )


def test_support_code_stays_at_the_top():
    """conftest.py puts tests/ on sys.path: support modules elsewhere are not found by
    name from every folder."""
    nested = [
        str(p.relative_to(TESTS))
        for p in sorted(TESTS.rglob("*.py"))
        if p.parent != TESTS
        and p.parent.name != "sim"
        and not p.name.startswith("test_")
        and "__pycache__" not in p.parts
    ]
    assert not nested, f"support modules outside tests/ or tests/sim/: {nested}"


def test_the_slow_jobs_words_come_out_whole_from_many_threads():
    """tests/_slow_job.py's ``started`` (a partition's thread) and ``pruned`` (the
    pruning thread) once came out as one line ``startedpruned``: ``print`` writes the
    word and its newline in two calls, and a test waiting for both words let the job run
    to its end (CI, test_sigkilled_encodes_on_s3_leave_one_draft)."""
    import os
    import subprocess
    import sys

    script = (
        "import threading, _slow_job\n"
        "def say(word):\n"
        "    for _ in range(5000):\n"
        "        _slow_job.say(word)\n"
        "ts = [threading.Thread(target=say, args=(w,)) for w in ('started', 'pruned')]\n"
        "[t.start() for t in ts]\n"
        "[t.join() for t in ts]\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=TESTS,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])},
    ).stdout.splitlines()
    assert sorted(set(out)) == ["pruned", "started"] and len(out) == 10000, sorted(set(out))
