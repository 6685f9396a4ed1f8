"""docs/your-data.md's SIFT1M-style flow runs as written: its script writes the tiny TEXMEX
files, its commands run, and what they print is what the page shows."""

import re
import shlex

from helpers import ROOT

from slem_dask.cli.main import main

SECTION = "## SIFT1M-style data"


def section_blocks() -> list[tuple[str, str]]:
    """(language, code) of every fenced block of the SIFT section."""
    text = (ROOT / "docs" / "your-data.md").read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start : end if end > 0 else len(text)]
    return re.findall(r"```(\w*)\n(.*?)```", section, flags=re.S)


def test_the_sift_flow_of_your_data_md_runs_as_written(tmp_path, monkeypatch, capsys):
    blocks = section_blocks()
    script = next(code for lang, code in blocks if code.startswith("# make_tiny_sift.py"))
    shell = next(code for lang, code in blocks if lang == "sh")
    table = next(code for lang, code in blocks if code.startswith("method  1-R@1"))
    recall = next(code for lang, code in blocks if "ann_recalls(ids, truth)" in code)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "make_tiny_sift.py").write_text(script)
    commands = [shlex.split(c) for c in shell.replace("\\\n", " ").strip().splitlines()]
    assert commands[0] == ["python", "make_tiny_sift.py"]
    exec(compile(script, "make_tiny_sift.py", "exec"), {"__name__": "__main__"})
    for command in commands[1:]:
        assert command[0] == "slem-dask"
        capsys.readouterr()
        assert main([*command[1:], "--no-progress"]) == 0, capsys.readouterr().err
        if command[1] == "evaluate":
            printed = capsys.readouterr().out
            # raw's figures are exact (unit rows searched exactly); the fitted methods'
            # encodings may round otherwise on another BLAS, so only their rows are checked
            raw = next(line for line in table.splitlines() if line.startswith("raw "))
            assert " ".join(raw.split()[:4]) in " ".join(printed.split()), printed
            assert table.splitlines()[0].split()[:4] == ["method", "1-R@1", "R@10", "10-R@10"]
            assert [line.split()[0] for line in table.splitlines()[2:]] == ["raw", "pca", "slem"]
            assert all(m in printed for m in ("pca ", "slem "))
    capsys.readouterr()
    exec(compile(recall, "recall.py", "exec"), {"__name__": "__main__"})
    said = recall.split("print(ann_recalls(ids, truth))  # ")[1].strip()
    assert capsys.readouterr().out.strip() == said
