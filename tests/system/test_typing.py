"""Users' type checkers see the public API's annotations (PEP 561: slem_dask/py.typed):
a user's script type-checked with mypy, as a project that imports slem-dask would be."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

USER_CODE = """
import numpy as np
from slem_dask import (KernelSLEM, LinearSLEM, load_model, mean_average_precision, open_zarr,
                       precision_recall_at_k, search)

X = np.zeros((10, 3))
reveal_type(LinearSLEM().fit(X))
reveal_type(KernelSLEM().fit(X, progress=print))
reveal_type(LinearSLEM().fit(X).transform(X))
reveal_type(load_model("model.zarr"))
reveal_type(search(X, X, 3))
reveal_type(mean_average_precision(np.zeros((2, 3), int), [[1], {2}]))
reveal_type(precision_recall_at_k(np.zeros((2, 3), int), [[1], [2]], k=2))
reveal_type(open_zarr("encodings.zarr"))
"""

# what each line reveals, as parts (numpy's and zarr's own spelling varies by version)
ARRAY = ("numpy.ndarray[", "dask.array.core.Array")
EXPECTED = [
    ("slem_dask.models.linear.LinearSLEM",),
    ("slem_dask.models.kernel.KernelSLEM",),
    ARRAY,
    ("slem_dask.models.base.SLEMEstimator",),
    ("tuple[", *ARRAY),
    ("float",),
    ("tuple[float, float]",),
    ("zarr.core.array.Array", "zarr.core.group.Group"),
]


@pytest.mark.slow
def test_users_type_checker_sees_the_public_annotations(tmp_path):
    pytest.importorskip("mypy")
    script = tmp_path / "user.py"
    script.write_text(USER_CODE)
    # this checkout first on the path, as an installed package (not the project's own
    # files): mypy reads a package's annotations there only if it ships py.typed
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MYPYPATH", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "c"),
            "--python-executable",
            sys.executable,
            "--no-error-summary",
            str(script),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = done.stdout.splitlines()
    revealed = [
        line.split('Revealed type is "', 1)[1].rstrip('"')
        for line in lines
        if "Revealed type is" in line
    ]
    errors = [line for line in lines if ": error:" in line]
    assert not errors, "\n".join(errors)
    assert len(revealed) == len(EXPECTED), done.stdout + done.stderr
    for got, parts in zip(revealed, EXPECTED, strict=True):
        assert got != "Any" and all(p in got for p in parts), (got, parts)
