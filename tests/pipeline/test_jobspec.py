"""Job specs (`slem-dask run SPEC.toml`) and scheduled, incremental reprocessing."""

import numpy as np
import pytest
import zarr

from slem_dask import LinearSLEM, load_model, storage
from slem_dask.cli.main import main
from slem_dask.core.linear import condition_bound
from slem_dask.pipeline.jobspec import SpecError, load_spec, parse_spec
from slem_dask.storage.nodes import groups, model_reads
from helpers import ROOT
from reference import partitionwise

CLUSTER = ["--workers", "1", "--threads-per-worker", "2", "--no-progress"]


@pytest.mark.parametrize("spec", sorted((ROOT / "jobs").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_specs_parse(spec):
    parsed = load_spec(str(spec))
    assert parsed.model.type in ("linear", "kernel") and parsed.encode


@pytest.mark.parametrize(
    "data, message",
    [
        ({"fit": {"negatives": "x"}}, r"missing section \[model\]"),
        ({"model": {"path": "m"}, "fitt": {}}, r"unknown section \[fitt\]; allowed: cluster, "),
        (
            {"model": {"path": "m", "lamda": 1}},
            r"unknown key model.lamda; allowed keys in \[model\]: "
            r"path, type, lam, theta",
        ),
        ({"model": {"path": "m", "lam": 0}}, r"model.lam = 0: expected a number > 0"),
        ({"model": {"path": "m", "lam": "big"}}, r"model.lam = 'big': expected a number > 0"),
        (
            {"model": {"path": "m", "type": "quadratic"}},
            r"model.type = 'quadratic': expected one of "
            r"'linear', 'kernel'",
        ),
        ({"model": {"path": "m", "gamma": 0.5}}, r'model.gamma applies to type = "kernel" only'),
        (
            {"model": {"path": "m", "type": "kernel", "kernel": "sigmoid"}},
            r"model.kernel = 'sigmoid': expected one of 'linear', 'rbf', 'quad', 'poly', ",
        ),
        (
            {"model": {"path": "m", "type": "kernel", "tol": 1.0}},
            r"model.tol = 1.0: expected a "
            r"number in \[0, 1\)",
        ),
        ({"model": {"lam": 1.0}}, r"missing key model.path"),
        (
            {"model": {"path": "m"}, "fit": {"negatives": "n", "update": "yes"}},
            r"fit.update = 'yes': expected true or false",
        ),
        (
            {"model": {"path": "m"}, "encode": [{"positives": "p", "out": "o", "dtype": "f16"}]},
            r"encode\[0\].dtype = 'f16': expected one of 'float32', 'float64'",
        ),
        ({"model": {"path": "m"}, "encode": [{"positives": "p"}]}, r"missing key encode\[0\].out"),
        (
            {"model": {"path": "m"}, "cluster": {"workers": 0}},
            r"cluster.workers = 0: expected an "
            r"integer >= 1",
        ),
    ],
)
def test_spec_errors_name_the_key_and_allowed_values(data, message):
    with pytest.raises(SpecError, match=message):
        parse_spec(data)


def test_run_bad_spec_exits_nonzero_before_starting_a_cluster(tmp_path, capsys):
    spec = tmp_path / "bad.toml"
    spec.write_text('[model]\npath = "m.zarr"\nlam = -1\n')
    assert main(["run", str(spec)]) == 1
    assert "model.lam = -1: expected a number > 0" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "missing.toml")]) == 1


def _spec(tmp_path):
    text = f"""
[model]
path = "{tmp_path}/model.zarr"
lam = 0.01

[fit]
negatives = "{tmp_path}/data.zarr/negatives"
update = true

[[encode]]
positives = "{tmp_path}/data.zarr/positives"
out = "{tmp_path}/data.zarr/encoded"
partition_rows = 64
"""
    path = tmp_path / "job.toml"
    path.write_text(text)
    return str(path)


def _write(tmp_path, neg, pos):
    """Create the arrays, or append the rows past their current length (the way a corpus
    grows: rows already written are not rewritten)."""
    group = zarr.open_group(str(tmp_path / "data.zarr"), mode="a")
    for name, data in (("negatives", neg), ("positives", pos)):
        if name in group:
            arr = group[name]
            old = arr.shape[0]
            if len(data) > old:
                arr.resize(data.shape)
                arr[old:] = data[old:]
        else:
            arr = group.create_array(name, shape=data.shape, dtype=data.dtype, chunks=(64, 12))
            arr[...] = data


def _facts(out, step):
    """The 'action' and 'partitions' lines of the report of one step ('fit:' or 'encode:')."""
    lines = out.split(f"\n{step}:\n")[1].splitlines()
    block = [
        line
        for line in lines[
            : next((i for i, x in enumerate(lines) if not x.startswith("  ")), len(lines))
        ]
    ]
    return {line.split()[0]: " ".join(line.split()[1:]) for line in block}


def test_scheduled_reprocessing_is_incremental(tmp_path, capsys):
    rng = np.random.default_rng(3)
    neg = (rng.standard_normal((1000, 12)) * rng.uniform(0.5, 2, 12) + 50).astype("float32")
    pos = rng.standard_normal((300, 12)).astype("float32")
    _write(tmp_path, neg[:700], pos[:200])
    spec = _spec(tmp_path)

    assert main(["run", spec, *CLUSTER]) == 0
    out = capsys.readouterr().out
    assert _facts(out, "fit")["action"] == "fit"
    assert _facts(out, "encode")["action"] == "create"

    # nothing changed: nothing is read or written
    assert main(["run", spec, *CLUSTER]) == 0
    out = capsys.readouterr().out
    assert _facts(out, "fit")["action"] == "up to date"
    assert _facts(out, "encode")["partitions"] == "0 encoded of 4"

    # positives appended: only the new rows (and the partition they extend) are encoded
    _write(tmp_path, neg[:700], pos)
    assert main(["run", spec, *CLUSTER]) == 0
    out = capsys.readouterr().out
    assert _facts(out, "encode")["action"] == "append"
    assert _facts(out, "encode")["partitions"] == "2 encoded of 5"
    model = load_model(f"{tmp_path}/model.zarr")
    encoded = storage.open_output(f"{tmp_path}/data.zarr/encoded")[...]
    rows = storage.open_node(f"{tmp_path}/data.zarr/encoded", mode="r").chunks[0]
    np.testing.assert_array_equal(
        encoded, partitionwise(lambda p: model.transform(p, dtype="float32"), pos, rows)
    )

    # negatives appended: statistics merged (only new rows read), equal to a fit from scratch;
    # the changed model triggers re-encoding of every partition
    _write(tmp_path, neg, pos)
    assert main(["run", spec, *CLUSTER]) == 0
    out = capsys.readouterr().out
    assert _facts(out, "fit")["action"] == "update"
    assert _facts(out, "fit")["rows"] == "read 300"
    assert _facts(out, "encode")["action"] == "re-encode (model changed)"
    updated = load_model(f"{tmp_path}/model.zarr")
    scratch = LinearSLEM(lam=0.01).fit(neg)
    assert updated.n_samples_ == 1000
    np.testing.assert_allclose(updated.mean_, scratch.mean_, rtol=1e-13)
    # float32 negatives: each block is computed in float32 (the precision contract: 1e-5)
    scale = np.abs(scratch.covariance_).max()
    assert np.abs(updated.covariance_ - scratch.covariance_).max() <= 1e-5 * scale
    # A^-1 amplifies the covariance's error by at most cond(A)
    kappa = condition_bound(scratch.covariance_, 0.01)
    scale = np.abs(scratch.precision_).max()
    assert np.abs(updated.precision_ - scratch.precision_).max() <= 1e-5 * kappa * scale
    encoded = storage.open_output(f"{tmp_path}/data.zarr/encoded")[...]
    np.testing.assert_allclose(encoded, scratch.transform(pos), atol=1e-5)


def test_encode_refuses_output_of_another_model_without_overwrite(tmp_path, capsys):
    rng = np.random.default_rng(4)
    _write(
        tmp_path,
        rng.standard_normal((300, 12)).astype("float32"),
        rng.standard_normal((100, 12)).astype("float32"),
    )
    d = f"{tmp_path}/data.zarr"
    assert main(["fit", "--negatives", f"{d}/negatives", "--model", f"{tmp_path}/a", *CLUSTER]) == 0
    assert (
        main(
            [
                "fit",
                "--negatives",
                f"{d}/negatives",
                "--model",
                f"{tmp_path}/b",
                "--lam",
                "0.5",
                *CLUSTER,
            ]
        )
        == 0
    )
    enc = ["encode", "--positives", f"{d}/positives", "--out", f"{d}/enc"]
    assert main([*enc, "--model", f"{tmp_path}/a", *CLUSTER]) == 0
    before = storage.open_output(f"{d}/enc")[...]
    capsys.readouterr()
    assert main([*enc, "--model", f"{tmp_path}/b", *CLUSTER]) == 1
    assert "encoded with another model" in capsys.readouterr().err
    np.testing.assert_array_equal(storage.open_output(f"{d}/enc")[...], before)
    assert main([*enc, "--model", f"{tmp_path}/b", "--overwrite", *CLUSTER]) == 0
    assert not np.array_equal(storage.open_output(f"{d}/enc")[...], before)


def test_kernel_spec_runs_and_rerun_is_up_to_date(tmp_path, capsys):
    rng = np.random.default_rng(5)
    _write(
        tmp_path, rng.random((400, 12)).astype("float32"), rng.random((100, 12)).astype("float32")
    )
    spec = tmp_path / "kernel.toml"
    spec.write_text(f"""
[model]
path = "{tmp_path}/kmodel.zarr"
type = "kernel"
kernel = "chi2"
rank = 20
seed = 1

[fit]
negatives = "{tmp_path}/data.zarr/negatives"

[[encode]]
positives = "{tmp_path}/data.zarr/positives"
out = "{tmp_path}/data.zarr/kencoded"
""")
    assert main(["run", str(spec), *CLUSTER]) == 0
    out = capsys.readouterr().out
    assert _facts(out, "encode")["action"] == "create"
    model = load_model(f"{tmp_path}/kmodel.zarr")
    assert model.kernel == "chi2" and model.rank_ == 20
    encoded = storage.open_output(f"{tmp_path}/data.zarr/kencoded")[...]
    positives = storage.open_node(f"{tmp_path}/data.zarr/positives")[...]
    np.testing.assert_allclose(encoded, model.transform(positives), rtol=1e-5, atol=1e-6)
    assert main(["run", str(spec), *CLUSTER]) == 0
    out = capsys.readouterr().out
    assert _facts(out, "fit")["action"] == "up to date"
    assert _facts(out, "encode")["action"] == "up to date"


def test_theta_changes_no_encoding_so_outputs_are_kept(tmp_path, capsys):
    """theta scales w* only (docs/math.md#theta): a model refitted with another
    theta encodes identically, and its outputs stay valid."""
    rng = np.random.default_rng(6)
    _write(
        tmp_path,
        rng.standard_normal((300, 12)).astype("float32"),
        rng.standard_normal((100, 12)).astype("float32"),
    )
    d = f"{tmp_path}/data.zarr"
    enc = [
        "encode",
        "--model",
        f"{tmp_path}/m",
        "--positives",
        f"{d}/positives",
        "--out",
        f"{d}/enc",
        *CLUSTER,
    ]
    assert main(["fit", "--negatives", f"{d}/negatives", "--model", f"{tmp_path}/m", *CLUSTER]) == 0
    assert main(enc) == 0
    assert (
        main(
            [
                "fit",
                "--negatives",
                f"{d}/negatives",
                "--model",
                f"{tmp_path}/m",
                "--theta",
                "5",
                "--overwrite",
                *CLUSTER,
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(enc) == 0
    assert _facts(capsys.readouterr().out, "encode")["action"].startswith("up to date")
    meta = storage.output_meta(storage.open_node(f"{d}/enc"))
    assert meta["params"]["theta"] == 5.0
    # the model's identity: its inputs and parameters (docs/numerics.md)
    assert meta["model_fingerprint"] == load_model(f"{tmp_path}/m").identity_


def test_an_interrupted_generate_leaves_no_corpus_and_the_next_run_writes_it(
    tmp_path, capsys, monkeypatch
):
    # The [generate] step writes the corpus only if its path does not exist: a corpus
    # interrupted half-way must not be at the path, or every later run would fail on
    # its missing arrays.
    corpus = tmp_path / "corpus.zarr"
    spec = tmp_path / "gen.toml"
    spec.write_text(f"""
[generate]
path = "{corpus}"
n_negatives = 400
n_instances = 20
dim = 8

[model]
path = "{tmp_path}/model.zarr"

[fit]
negatives = "{corpus}/negatives"

[[encode]]
positives = "{corpus}/queries"
out = "{corpus}/slem_queries"
""")
    real_create = groups.write_member_documented_last  # each array of the corpus
    calls = []

    def interrupted(location, name, *args, **kwargs):
        calls.append(name)
        if name == "queries":  # negatives and database are written by now
            raise KeyboardInterrupt
        return real_create(location, name, *args, **kwargs)

    monkeypatch.setattr(groups, "write_member_documented_last", interrupted)
    assert main(["run", str(spec), *CLUSTER]) == 130
    assert calls[-1] == "queries"
    assert (
        "slem-dask run: interrupted; the steps reported above are complete; the one under "
        "way was not marked complete" in capsys.readouterr().err
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gen.toml"]  # no corpus, no parts
    monkeypatch.setattr(groups, "write_member_documented_last", real_create)
    capsys.readouterr()
    assert main(["run", str(spec), *CLUSTER]) == 0, capsys.readouterr().err
    assert sorted(storage.open_node(str(corpus), mode="r").array_keys()) == [
        "database",
        "database_labels",
        "negatives",
        "queries",
        "query_labels",
    ]
    assert storage.open_output(f"{corpus}/slem_queries").shape[0] > 0  # a store of its own
    assert main(["verify", f"{corpus}/slem_queries"]) == 0


def _spec_files(tmp_path):
    """Shards, a folder of shards and an HDF5 file: inputs a spec may spell many ways."""
    import h5py

    rng = np.random.default_rng(0)
    for folder, rows in (("neg", 60), ("pos", 10)):
        (tmp_path / folder).mkdir()
        for i in range(2):
            np.save(tmp_path / folder / f"s{i}.npy", rng.standard_normal((rows, 4)))
    with h5py.File(tmp_path / "pos.h5", "w") as f:
        f["x"] = rng.standard_normal((10, 4))


@pytest.mark.parametrize(
    "negatives, model, steps, message",
    [
        # a glob input and an output it would match on the next run
        (
            "neg",
            "m.zarr",
            [("pos/*.npy", "pos/e.npy")],
            r"encode\[0\].out '.*/pos/e.npy' matches the encode\[0\].positives glob",
        ),
        (
            "./neg/*.npy",
            "neg/m.npy",
            [],
            r"model.path '.*/neg/m.npy' matches the fit.negatives glob",
        ),
        # an HDF5 member's file, given as the output or as a folder above it
        (
            "neg",
            "m.zarr",
            [("pos.h5:/x", "pos.h5/e.zarr")],
            r"encode\[0\].out '.*/pos.h5/e.zarr' is inside the encode\[0\].positives '.*/pos.h5'",
        ),
        # a folder of shards: writing inside it adds a shard to the input
        (
            "neg/",
            "m.zarr",
            [("pos", "pos/e.zarr")],
            r"is inside the encode\[0\].positives folder of .npy shards .*would add files",
        ),
        # two spellings of one output
        (
            "neg",
            "m.zarr",
            [("pos", "e.zarr"), ("pos.h5:/x", "file://./e.zarr/")],
            r"encode\[0\].out '.*/e.zarr' is the encode\[1\].out '.*/e.zarr'; two steps cannot",
        ),
        (
            "neg",
            "./x/../m.zarr/",
            [("pos", "m.zarr")],
            r"model.path '.*/m.zarr' is the encode\[0\]",
        ),
    ],
)
def test_a_spec_whose_paths_overlap_in_any_spelling_is_refused_before_anything_runs(
    tmp_path, monkeypatch, capsys, negatives, model, steps, message
):
    _spec_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x").mkdir()
    encode = "".join(f'[[encode]]\npositives = "{p}"\nout = "{o}"\n' for p, o in steps)
    spec = tmp_path / "job.toml"
    spec.write_text(f'[model]\npath = "{model}"\n[fit]\nnegatives = "{negatives}"\n{encode}')
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert main(["run", str(spec), *CLUSTER]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "job.toml: " in err, err
    assert __import__("re").search(message, err), err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing ran


def test_the_shipped_demo_spec_runs_on_what_slem_dask_demo_wrote(
    tmp_path, monkeypatch, capsys, scheduler
):
    """The user guide's order: `slem-dask demo`, then `slem-dask run jobs/demo.toml` on the
    same slem-demo/. The demo fits at the default lambda (0.01x); a spec that gave lam =
    1e-3 was refused ("--update keeps parameters") instead of finding it up to date."""
    monkeypatch.chdir(tmp_path)
    where = ["--scheduler", scheduler, "--no-progress"]
    assert main(["demo", "--negatives", "2000", "--instances", "40", "--dim", "16", *where]) == 0
    capsys.readouterr()
    assert main(["run", str(ROOT / "jobs" / "demo.toml"), *where]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert _facts(out, "fit")["action"] == "up to date" and _facts(out, "fit")["lam"] == "0.01x"
    assert [line for line in out.splitlines() if "action" in line] == [
        "  action             up to date"
    ] * 3


def test_run_takes_several_specs_in_order_and_stops_at_the_first_that_fails(tmp_path, capsys):
    """`slem-dask run jobs/*.toml` (the README's table invites it): each spec runs as if
    alone, with its own report; one that fails stops the later ones, which are named."""
    rng = np.random.default_rng(5)
    specs = []
    for name in ("a", "b"):
        folder = tmp_path / name
        folder.mkdir()
        _write(folder, rng.standard_normal((300, 12)), rng.standard_normal((100, 12)))
        specs.append(_spec(folder))
    assert main(["run", *specs, *CLUSTER]) == 0
    captured = capsys.readouterr()
    assert f"slem-dask run: {specs[0]} (1 of 2)" in captured.out
    assert f"slem-dask run: {specs[1]} (2 of 2)" in captured.out
    assert captured.out.count("\nfit:\n") == 2 and captured.out.count("\nencode:\n") == 2
    for name in ("a", "b"):
        assert storage.open_output(f"{tmp_path}/{name}/data.zarr/encoded").shape == (100, 12)

    bad = tmp_path / "bad.toml"
    bad.write_text('[model]\npath = "m.zarr"\nlam = -1\n')
    assert main(["run", specs[0], str(bad), specs[1], *CLUSTER]) == 1
    captured = capsys.readouterr()
    assert "model.lam = -1: expected a number > 0" in captured.err
    assert f"{bad} did not finish, so 1 later spec(s) were not run ({specs[1]})" in captured.err
    assert f"{specs[1]} (3 of 3)" not in captured.out


def test_a_specs_check_learns_the_models_width_from_its_record_alone(tmp_path, monkeypatch):
    """A spec that encodes with a saved model checks every positive's width before
    anything runs, from the model's record: its arrays (1 GiB for a linear model at
    d = 8192) are read once, by the encode step, and not by the check as well."""
    from slem_dask.pipeline.jobspec import check_inputs

    rng = np.random.default_rng(0)
    LinearSLEM(lam=0.1).fit(rng.standard_normal((50, 6))).save(str(tmp_path / "m.zarr"))
    for name, width in (("fits", 6), ("wide", 7)):
        arr = zarr.create_array(
            str(tmp_path / f"{name}.zarr"), shape=(4, width), dtype="float32", chunks=(4, width)
        )
        arr[...] = rng.standard_normal((4, width))

    def spec(positives: str):
        path = tmp_path / "job.toml"
        path.write_text(
            f'[model]\npath = "{tmp_path}/m.zarr"\n[[encode]]\n'
            f'positives = "{tmp_path}/{positives}.zarr"\nout = "{tmp_path}/out.zarr"\n'
        )
        return load_spec(str(path))

    def no_array_read(*args, **kwargs):
        raise AssertionError("the check read the model's arrays")

    monkeypatch.setattr(model_reads, "read_model_store", no_array_read)
    monkeypatch.setattr(storage, "read_model_store", no_array_read)
    check_inputs(spec("fits"))
    with pytest.raises(SpecError, match="has 7 features but the model is fitted on 6"):
        check_inputs(spec("wide"))
    monkeypatch.setattr(storage, "read_model_meta", lambda p: {"model": "Cubic", "n_features": 6})
    with pytest.raises(ValueError, match="model.path: .* holds a 'Cubic' model, which this"):
        check_inputs(spec("fits"))
