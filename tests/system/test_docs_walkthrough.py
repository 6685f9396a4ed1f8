"""What the README and docs/ tell a new user to type works as they say."""

from pathlib import Path

import pytest

from slem_dask import LinearSLEM
from slem_dask.pipeline import demo_job
from slem_dask.pipeline.jobspec import load_spec, run_spec

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    """What `slem-dask demo` writes (a small corpus), in a folder holding slem-demo/."""
    root = tmp_path_factory.mktemp("walk")
    demo_job(None, workdir=str(root / "slem-demo"), n_negatives=600, n_instances=50, d=16)
    return root


@pytest.mark.parametrize("name", ["demo.toml", "demo_kernel.toml"])
def test_shipped_demo_specs_continue_the_demo_stores(name, demo_dir, monkeypatch):
    # `slem-dask run jobs/demo.toml` after `slem-dask demo` (both from the repository root)
    # finds the demo's models and outputs up to date, instead of refusing a model fitted
    # with other parameters
    monkeypatch.chdir(demo_dir)
    reports = run_spec(None, load_spec(str(ROOT / "jobs" / name)))
    assert [r.facts["action"] for r in reports] == ["up to date"] * 3


def test_a_worker_without_the_clients_s3_variables_is_told_to_set_them(monkeypatch):
    # README's cluster example with workers started without AWS_* said "mount it on that
    # worker, or use a URL (s3://...)": the path already was such a URL
    from slem_dask.storage import StorageViewError
    from slem_dask.storage.versioning import versions
    from slem_dask.storage.nodes import workers

    here = [{"metadata": "digest"}]
    monkeypatch.setattr(workers, "_worker_signatures", lambda locations: here)
    monkeypatch.setattr(versions, "resolve", lambda path: (path.location,))

    class Client:  # one worker, which cannot read the store
        class scheduler:  # what listed_workers asks: the scheduler's identity
            @staticmethod
            def identity(n_workers):
                return {"workers": {"tcp://10.0.0.9:40000": {}}}

        def sync(self, function, *args, **kwargs):
            return function(*args, **kwargs)

        def run(self, function, locations, **options):  # workers=, on_error= (ask_workers)
            return {"tcp://10.0.0.9:40000": [{"error": "NoCredentialsError: no credentials"}]}

    with pytest.raises(StorageViewError) as raised:
        workers.check_workers_see(Client(), {"negatives": "s3://bucket/neg.zarr"})
    message = str(raised.value)
    assert "tcp://10.0.0.9:40000" in message and "s3://bucket/neg.zarr" in message
    assert "NoCredentialsError" in message and "same variables" in message
    assert "mount it" not in message and "\n" not in message


@pytest.mark.parametrize(
    "command, option", [("encode", "--out"), ("fit", "--model"), ("search", "--out")]
)
@pytest.mark.parametrize("name", ["codes.npy", "codes.h5", "codes.fvecs"])
def test_a_new_store_named_as_a_file_format_is_refused(command, option, name, tmp_path, capsys):
    # `slem-dask encode ... --out codes.npy` made a folder codes.npy that np.load cannot
    # open; the user wanted a .npy file, which `slem-dask export` writes
    import numpy as np

    from slem_dask.cli.main import main

    rows = tmp_path / "rows.npy"
    np.save(rows, np.random.default_rng(0).standard_normal((50, 4)))
    if command == "encode":
        LinearSLEM().fit(np.load(rows)).save(str(tmp_path / "m.zarr"))
    given = {
        "fit": ["--negatives", str(rows)],
        "encode": ["--model", str(tmp_path / "m.zarr"), "--positives", str(rows)],
        "search": ["--queries", str(rows), "--database", str(rows), "--k", "3"],
    }[command]
    target = tmp_path / name
    assert main([command, *given, option, str(target)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{option} {str(target)!r}" in err
    assert "slem-dask export" in err and str(tmp_path / "codes.zarr") in err
    assert not target.exists()
    # such a file there already (`slem-dask export`'s) is named so too, and kept: it
    # was said to be "not written by slem-dask" and to be removed, only to be refused
    # by its name next
    target.write_bytes(b"an export")
    assert main([command, *given, option, str(target), "--overwrite"]) == 1
    err = capsys.readouterr().err.strip()
    assert f"{option} {str(target)!r}: slem-dask writes a versioned zarr store" in err, err
    assert target.read_bytes() == b"an export"


@pytest.mark.parametrize("given", ["model", "search result"])
def test_a_model_or_search_result_given_as_descriptors_is_named_as_such(given, tmp_path, capsys):
    # `slem-dask search --database model.zarr` said "give the path of an array inside it,
    # e.g. model.zarr/covariance": searching a covariance matrix is never what was meant
    import numpy as np

    from slem_dask.cli.main import main

    rows = np.random.default_rng(0).standard_normal((40, 4))
    model = str(tmp_path / "m.zarr")
    LinearSLEM().fit(rows).save(model)
    hits = str(tmp_path / "hits.zarr")
    np.save(tmp_path / "q.npy", rows)
    assert (
        main(
            [
                "search",
                "--queries",
                str(tmp_path / "q.npy"),
                "--database",
                str(tmp_path / "q.npy"),
                "--k",
                "3",
                "--out",
                hits,
            ]
        )
        == 0
    )
    capsys.readouterr()
    wrong = {"model": model, "search result": hits}[given]
    assert (
        main(
            [
                "search",
                "--queries",
                str(tmp_path / "q.npy"),
                "--database",
                wrong,
                "--k",
                "3",
                "--out",
                str(tmp_path / "h2.zarr"),
            ]
        )
        == 1
    )
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"database: {wrong!r} is a slem-dask {given}" in err
    assert "covariance" not in err and "indices" not in err and "slem-dask encode" in err


def test_a_chunk_missing_from_an_output_says_to_run_the_encode_again(tmp_path, capsys):
    # README's troubleshooting: "delete it and re-run (outputs)"; the message spoke of
    # zeros (outputs are NaN-filled) and of zarr's write_empty_chunks, which is for inputs
    import glob
    import os

    import numpy as np

    from slem_dask.cli.main import main

    rows = np.random.default_rng(0).standard_normal((40, 4))
    np.save(tmp_path / "p.npy", rows)
    model, out = str(tmp_path / "m.zarr"), str(tmp_path / "codes.zarr")
    LinearSLEM().fit(rows).save(model)
    encode = [
        "encode",
        "--model",
        model,
        "--positives",
        str(tmp_path / "p.npy"),
        "--out",
        out,
        "--partition-rows",
        "10",
    ]
    assert main(encode) == 0
    (chunk,) = glob.glob(f"{out}/versions/*/c/2/0")
    os.remove(chunk)
    capsys.readouterr()
    assert (
        main(
            [
                "search",
                "--queries",
                str(tmp_path / "p.npy"),
                "--database",
                out,
                "--k",
                "3",
                "--out",
                str(tmp_path / "hits.zarr"),
            ]
        )
        == 1
    )
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "chunk 'c/2/0' (rows 20-29) is missing" in err
    assert "write_empty_chunks" not in err and "zeros" not in err
    assert f"slem-dask verify {out}" in err and "run the command that wrote it again" in err
    assert main(encode) == 0  # as it says: the encode restores the partition
    assert main(["verify", out]) == 0


_INTERRUPT_INSIDE_AN_IMPORT = """
import sys

class Interrupt:  # one Ctrl-C while yaml (imported by dask) runs its own imports
    done = False

    def find_spec(self, name, path=None, target=None):
        if name == "yaml.reader" and not Interrupt.done:
            Interrupt.done = True
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, Interrupt())
from slem_dask.cli import main as cli
cli._EXECUTABLE = True  # the executable's import of dask.array, which the Ctrl-C cuts short
sys.exit(cli.main(sys.argv[1:]))
"""


def test_ctrl_c_inside_the_first_import_of_dask_is_one_line_for_an_encode(tmp_path):
    # docs/operations.md: Ctrl-C at any moment after Python's start-up gives one line and
    # status 130. Ctrl-C 0.3 s into `slem-dask encode` left yaml half-imported; saying what
    # the encode kept imported the jobs (and dask) again: an AttributeError's traceback
    import subprocess
    import sys

    import numpy as np

    rows = np.random.default_rng(0).standard_normal((40, 4))
    np.save(tmp_path / "p.npy", rows)
    LinearSLEM().fit(rows).save(str(tmp_path / "m.zarr"))
    out = tmp_path / "codes.zarr"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _INTERRUPT_INSIDE_AN_IMPORT,
            "encode",
            "--model",
            str(tmp_path / "m.zarr"),
            "--positives",
            str(tmp_path / "p.npy"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 130, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("slem-dask encode: interrupted; nothing was")
    assert not out.exists()


@pytest.mark.parametrize("command", [["versions"], ["rollback", "--to", "1"]])
@pytest.mark.parametrize("inside", ["member", "version folder"])
def test_versions_of_a_path_inside_a_store_name_that_store(command, inside, demo_dir, capsys):
    # docs/reading-outputs.md: commands take `corpus.zarr/negatives`; `slem-dask versions`
    # of it said "it was not written by this slem-dask", of a corpus slem-dask wrote
    from slem_dask.cli.main import main
    from slem_dask.storage.versioning import versions

    corpus = str(demo_dir / "slem-demo" / "corpus.zarr")
    head = versions.VersionedStore(corpus).head()
    path = {
        "member": f"{corpus}/negatives",
        "version folder": f"{corpus}/versions/{head.version}",
    }[inside]
    capsys.readouterr()
    assert main([command[0], path, *command[1:]]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"part of the slem-dask store {corpus!r}" in err, err
    assert f"slem-dask {command[0]} {corpus}" in err and "not written" not in err
    assert versions.VersionedStore(corpus).head() == head  # nothing was committed


def test_a_demo_workdir_that_is_a_file_is_refused_before_a_cluster_starts(tmp_path, capsys):
    # docs/operations.md: an output whose place is a file is refused in one line before
    # anything runs; `slem-dask demo --workdir queries.npy` started a cluster, then said
    # "[Errno 17] File exists: 'queries.npy'"
    from slem_dask.cli.main import main

    afile = tmp_path / "queries.npy"
    afile.write_bytes(b"not a folder")
    assert main(["demo", "--workdir", str(afile), "--negatives", "50"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # no "dask: ..." line: no cluster was started
    err = captured.err.strip()
    assert "\n" not in err and f"--workdir {str(afile)!r}" in err and "is a file" in err
    assert "Errno" not in err
    assert afile.read_bytes() == b"not a folder"


_EXIT_IMPORTS = """
import atexit, sys

# registered first, so it runs last: after slem-dask's own exit handlers
atexit.register(lambda: print(sorted(m for m in ("gcsfs", "adlfs") if m in sys.modules)))
import slem_dask.storage.backends.azure, slem_dask.storage.backends.gcs  # what every command imports
"""


def test_a_local_command_does_not_import_the_cloud_sdks_at_exit(tmp_path):
    # Ctrl-C just after `slem-dask run` finished printed an import's traceback (gcsfs,
    # grpc) and exited 0: the exit handlers that close gs:// and az:// clients imported
    # gcsfs and adlfs (0.3 s at every exit) when no such client could exist
    import importlib.util
    import subprocess
    import sys

    for sdk in ("gcsfs", "adlfs"):  # installed, or the check below would prove nothing
        if importlib.util.find_spec(sdk) is None:
            pytest.skip(f"{sdk} is not installed (pip install 'slem-dask[test]')")
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_IMPORTS],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_export_of_a_corpus_member_names_that_member(demo_dir, tmp_path, capsys):
    # README: `slem-dask export P --to OUT.npy`; of corpus.zarr/negatives it said
    # "corpus.zarr: version 1 (corpus (600, 16) float32)": the corpus is no such array
    import numpy as np

    from slem_dask import storage
    from slem_dask.cli.main import main

    corpus = str(demo_dir / "slem-demo" / "corpus.zarr")
    out = tmp_path / "neg.npy"
    capsys.readouterr()
    assert main(["export", f"{corpus}/negatives", "--to", str(out)]) == 0
    said = capsys.readouterr().out.strip()
    assert said == f"{corpus}: version 1 ('negatives' of the corpus (600, 16) float32) " + (
        f"exported to {out}"
    )
    np.testing.assert_array_equal(np.load(out), storage.read_all(f"{corpus}/negatives"))


def test_the_rechunk_hint_for_an_hdf5_input_gives_code_that_reads_hdf5(tmp_path):
    # docs/troubleshooting.md "Tiny chunks": said for HDF5 datasets stored in chunks too,
    # with dask.array.from_zarr(OLD) as the fix, which cannot open an HDF5 file
    h5py = pytest.importorskip("h5py")
    import numpy as np

    from slem_dask import storage
    from slem_dask.storage.nodes.chunks import small_chunks_hint

    rows = np.random.default_rng(2).standard_normal((1500, 8)).astype("float32")
    with h5py.File(tmp_path / "neg.h5", "w") as f:
        f.create_dataset("tiny", data=rows, chunks=(1, 8))
    tiny = storage.open_input(str(tmp_path / "neg.h5:/tiny"), "negatives")
    said = small_chunks_hint(tiny, "negatives", tmp_path / "neg.h5")
    assert "1,500 chunks of 1 row(s)" in said and "from_zarr" not in said
    assert "create_dataset(NAME, data=old_dataset[...], chunks=(1500, 8))" in said


def test_an_unquoted_glob_of_shards_is_told_to_be_quoted(tmp_path, monkeypatch, capsys):
    # docs/your-data.md: a glob of shards must be quoted, else the shell expands it; the
    # expanded one said only "unrecognized arguments: database/emb_1.npy ..."
    import numpy as np

    from slem_dask.cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "database").mkdir()
    for i in range(3):
        np.save(tmp_path / "database" / f"emb_{i}.npy", np.ones((2, 4)))
    shards = [f"database/emb_{i}.npy" for i in range(3)]  # as the shell expands the glob
    with pytest.raises(SystemExit) as exited:
        main(["encode", "--model", "m.zarr", "--positives", *shards, "--out", "x.zarr"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("slem-dask encode: error: --positives takes one PATH")
    assert "'dir/*.npy'" in err and "quote" in err and "database/emb_2.npy" in err
    assert not (tmp_path / "x.zarr").exists()
