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
