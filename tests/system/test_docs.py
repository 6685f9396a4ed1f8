"""Citations of docs/math.md cannot rot: every cited label is an anchor there."""

import re

from helpers import ROOT

MATH = ROOT / "docs" / "math.md"
TEXT = {".py", ".md", ".sh", ".toml"}
# Where the code and the docs cite equations (tests cite them too).
CITING = [
    ROOT / "README.md",
    *(
        p
        for folder in ("slem_dask", "benchmarks", "jobs")
        for p in sorted((ROOT / folder).rglob("*"))
        if p.suffix in TEXT
    ),
    *(p for p in sorted((ROOT / "tests").rglob("*.py")) if p.name != "test_docs.py"),
]
CITATION = re.compile(r"docs/math\.md#([A-Za-z0-9_-]+)")


def anchors() -> list[str]:
    return re.findall(r'<a id="([^"]+)"></a>', MATH.read_text(encoding="utf-8"))


def citations() -> dict[str, list[str]]:
    """label -> the files (relative paths) that cite it."""
    found: dict[str, list[str]] = {}
    for path in CITING:
        for label in CITATION.findall(path.read_text(encoding="utf-8")):
            found.setdefault(label, []).append(str(path.relative_to(ROOT)))
    return found


def test_every_cited_label_is_an_anchor_of_math_md():
    cited = citations()
    # the code cites most sections; an empty scan would make this test pass vacuously
    assert len(cited) >= 15, sorted(cited)
    missing = {label: files for label, files in cited.items() if label not in anchors()}
    assert not missing, f"cited but not anchored in docs/math.md: {missing}"


def test_anchors_are_unique_and_internal_links_resolve():
    labels = anchors()
    assert len(labels) == len(set(labels)), labels
    internal = re.findall(r"\]\(#([^)]+)\)", MATH.read_text(encoding="utf-8"))
    assert internal and not set(internal) - set(labels), set(internal) - set(labels)


def test_code_and_readme_cite_math_md_not_the_papers():
    """The source documents are outside the repository: a clone would have dangling
    references. Cite docs/math.md#label instead."""
    paper = re.compile(r"\w+\.tex\b|shared/papers|papers README|\beq\. \w")
    offenders = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in CITING
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if paper.search(line)
    ]
    assert not offenders, "\n".join(offenders)
