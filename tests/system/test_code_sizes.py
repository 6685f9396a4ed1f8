"""The house's size rules (docs/development.md): no function of slem_dask over 60 lines and
no module over 500, counted as formatted (`ruff format`), docstrings and comments included:
what a reader scrolls through. Read with ast; nothing of slem_dask is imported."""

import ast
from pathlib import Path

import slem_dask

PACKAGE = Path(slem_dask.__file__).parent

MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 500


def _sources():
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_is_over_500_lines():
    long = [
        f"{path.relative_to(PACKAGE.parent)}: {n} lines"
        for path in _sources()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, "split by concern into sibling modules:\n" + "\n".join(long)


def test_no_function_is_over_60_lines():
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(
                        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}: {n}"
                    )
    assert not long, "split into named steps:\n" + "\n".join(long)
