"""Imports run one way, from the command line down to the math (docs/architecture.md,
"Import layers"): no module imports a higher layer, and no modules import each other in
a circle, function-level imports included. Read from the sources with ast: nothing of
slem_dask is imported."""

import ast
from pathlib import Path

import slem_dask

PACKAGE = Path(slem_dask.__file__).parent

#: The layers of docs/architecture.md, lowest first: a module (or a package, for all of
#: its modules) and its layer. A module may import its own layer or lower ones.
LAYERS = {
    "_version": 1,
    "core": 2,
    "storage": 3,
    "parallel": 4,
    "models": 5,
    "retrieval": 6,
    "cluster": 6,
    "datasets": 6,
    "pipeline": 7,
    "cli": 8,
    "__main__": 8,
    "__init__": 8,
}


def _modules() -> dict[str, Path]:
    """{dotted name: file} of every module of slem_dask (a package by its name)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("slem_dask",) + path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules) -> set[str]:
    """The slem_dask modules ``name`` imports, anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if base not in modules:
                continue
            subs = {f"{base}.{a.name}" for a in node.names} & modules.keys()
            out.update(subs or {base})
            if len(subs) < len(node.names):
                out.add(base)  # names defined in the package's __init__
    out.discard(name)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _layer(name: str) -> int:
    top = name.split(".")[1] if "." in name else "__init__"
    assert top in LAYERS, (
        f"slem_dask.{top} is in no import layer: place it in LAYERS here and in "
        f"docs/architecture.md's 'Import layers' table"
    )
    return LAYERS[top]


def test_no_module_imports_a_higher_layer():
    upward = [
        f"{a} (layer {_layer(a)}) imports {b} (layer {_layer(b)})"
        for a, targets in _graph().items()
        for b in sorted(targets)
        if _layer(b) > _layer(a)
    ]
    assert not upward, "\n".join(upward)


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    # storage/ included since its split into subpackages (issue 41): before it, its own
    # modules were left out of this check
    assert not _circles(_graph()), _circles(_graph())


#: storage/'s subpackages (docs/architecture.md, "Import layers"): what each may import
#: of the others. Its face (``storage/__init__``) and ``moved`` may import them all.
STORAGE_SUBPACKAGES = {
    "backends": set(),
    "versioning": {"backends"},
    "formats": {"backends"},
    "nodes": {"backends", "versioning", "formats"},
}


def _storage_part(name: str) -> str:
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "storage" else ""


def test_storage_subpackages_import_one_way():
    wrong = [
        f"{a} imports {b}"
        for a, targets in _graph().items()
        if _storage_part(a) in STORAGE_SUBPACKAGES
        for b in sorted(targets)
        if b == "slem_dask.storage"
        or (
            _storage_part(b) not in ("", _storage_part(a))
            and _storage_part(b) not in STORAGE_SUBPACKAGES[_storage_part(a)]
        )
    ]
    assert not wrong, "\n".join(wrong)


def test_every_storage_module_is_in_a_subpackage():
    loose = [
        name
        for name in _modules()
        if name.startswith("slem_dask.storage.")
        and _storage_part(name) not in STORAGE_SUBPACKAGES
        and name != "slem_dask.storage.moved"
    ]
    assert not loose, f"place these in a subpackage of STORAGE_SUBPACKAGES: {loose}"


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


#: The faces of storage/ (issue 41): the package and its subpackages, each an ``__init__``
#: that names what it offers. The jobs import storage through these only.
STORAGE_FACES = {"slem_dask.storage"} | {f"slem_dask.storage.{s}" for s in STORAGE_SUBPACKAGES}

#: The jobs: the batch jobs and the command line that runs them.
JOBS = ("slem_dask.pipeline", "slem_dask.cli")


def _deep_storage_uses(name: str, path: Path, modules) -> list[str]:
    """Where ``name`` reaches past storage's faces: an import of a storage module that is
    no face, an import of a module through a face (``from ..storage.nodes import
    chunks``), or an attribute path into one (``storage.nodes.checksums.chunk_key``)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("slem_dask.storage.")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if base == "slem_dask" and any(a.name == "storage" for a in node.names):
                continue  # the face itself
            if base != "slem_dask.storage" and not base.startswith("slem_dask.storage."):
                continue
            if base not in STORAGE_FACES:
                found.append(f"from {base} import {', '.join(a.name for a in node.names)}")
            found += [
                f"from {base} import {a.name}"
                for a in node.names
                if f"{base}.{a.name}" in modules and f"{base}.{a.name}" not in STORAGE_FACES
            ]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "storage"
            and f"slem_dask.storage.{node.attr}" in modules
            and f"slem_dask.storage.{node.attr}" not in STORAGE_FACES
        ):
            found.append(f"storage.{node.attr} (line {node.lineno})")
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "storage"
            and f"slem_dask.storage.{node.value.attr}" in STORAGE_FACES
            and f"slem_dask.storage.{node.value.attr}.{node.attr}" in modules
        ):
            found.append(f"storage.{node.value.attr}.{node.attr} (line {node.lineno})")
    return found


def test_the_jobs_reach_storage_through_its_faces():
    modules = _modules()
    deep = [
        f"{name}: {use}"
        for name, path in sorted(modules.items())
        if name.startswith(JOBS)
        for use in _deep_storage_uses(name, path, modules)
    ]
    assert not deep, (
        "the jobs import storage through its faces (slem_dask.storage and its subpackages' "
        "__init__), not its modules: hand the name on from the face, then use it there:\n"
        + "\n".join(deep)
    )
