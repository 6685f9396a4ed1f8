"""Tests of the band and floor helpers of the benchmarks (benchmarks/_common.band,
benchmarks/compare_bands.py): the benchmarks are scripts, not part of the package."""

import pytest
import json
import sys

from helpers import ROOT  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))

import _common as C  # noqa: E402
import compare_bands  # noqa: E402


def test_a_floor_slower_than_its_contender_gives_no_ratio(capsys):
    # the floor's best (0.30 s) is slower than slem-dask's best (0.25 s)
    out = C.band(
        "fit floor / slem-dask",
        [0.31, 0.30, 0.33],
        [0.25, 0.26, 0.27],
        0.15,
        names=("floor", "slem-dask"),
        floor=True,
    )
    text = capsys.readouterr().out
    assert out["ratio"] is None and out["not_a_floor"]
    assert "floor slower than slem-dask: not a floor in this run" in text
    assert "= 1.2" not in text  # no ratio above 1 presented as a result


def test_a_floor_is_its_best_run():
    out = C.band("floor", [0.40, 0.20, 0.35], [0.25, 0.26, 0.24], 0.15, floor=True)
    assert out["ratio"] == 0.20 / 0.24


def test_inside_needs_the_rounds_and_the_headline_within_the_band():
    steady = C.band("steady", [1.0, 1.02, 0.99, 1.01, 1.0], [0.5] * 5, 0.10)
    assert steady["inside"] and abs(steady["ratio"] - 1.98) < 1e-12
    # one stalled round in five is forgiven, two are not
    one = C.band("one stall", [1.0, 1.0, 1.0, 1.0, 3.0], [0.5] * 5, 0.10)
    two = C.band("two stalls", [1.0, 1.0, 1.0, 3.0, 3.0], [0.5] * 5, 0.10)
    assert one["inside"] and one["rounds_outside"] == 1
    assert not two["inside"] and two["rounds_outside"] == 2
    # a lucky best of one contender moves the headline away from the rounds' median
    lucky = C.band("lucky", [1.0, 1.0, 1.0, 1.0, 1.0], [0.5, 0.5, 0.5, 0.5, 0.3], 0.10)
    assert not lucky["inside"]


def test_runs_too_short_to_time_get_no_band_line(capsys):
    out = C.band("short", [0.04, 0.05], [0.02, 0.03], 0.2, shortest=0.05)
    text = capsys.readouterr().out
    assert out["ratio"] is None and "BAND {" not in text and not text.startswith("BAND")
    assert "short: no BAND line: a best run of 0.020 s is shorter than 0.05 s" in text
    # long enough on both sides: banded as usual
    assert C.band("long", [0.4, 0.5], [0.2, 0.3], 0.2, shortest=0.05)["ratio"] == 2.0
    assert "BAND long:" in capsys.readouterr().out


def test_one_round_is_checked_between_runs_only():
    assert C.band("once", [1.0], [2.0], 0.0)["inside"] is None


def _saved(tmp_path, name, ratios):
    path = tmp_path / name
    path.write_text(
        "".join(
            f"noise\nBAND {json.dumps({'label': label, 'ratio': r, 'band': 0.15, 'inside': True})}\n"
            for label, r in ratios.items()
        )
    )
    return str(path)


def test_compare_bands_pairs_two_runs(tmp_path, capsys):
    a = _saved(tmp_path, "a.txt", {"x": 1.00, "y": 2.0})
    b = _saved(tmp_path, "b.txt", {"x": 1.10, "y": 2.5})
    rows = {
        r["label"]: r for r in compare_bands.compare(compare_bands.bands(a), compare_bands.bands(b))
    }
    assert rows["x"]["between"] and not rows["y"]["between"]
    assert compare_bands.main([a, b]) == 1
    assert compare_bands.main([a, a, "--markdown"]) == 0
    assert "| x | 1.000 | 1.000 | +-15% | yes | yes/yes |" in capsys.readouterr().out


#: A physical floor of 2.0 s (decode 1 CPU s, product 3 CPU s, over 2 cores).
PHYSICAL_FLOOR_OF_2_S = {
    "total": 2.0,
    "decode_cpu": 1.0,
    "product_cpu": 3.0,
    "gflops_per_core": 50.0,
    "write_cpu": 0.0,
    "write_gbps": 0.0,
    "disk_gbps": 0.0,
    "cores": 2,
}


def test_a_physical_floor_slower_than_slem_dask_is_called_wrong(capsys):
    phys = dict(PHYSICAL_FLOOR_OF_2_S)
    result = {}
    C.physical_summary(result, "fit", "threads", phys, [1.5, 1.6])
    assert "WRONG FLOOR" in capsys.readouterr().out
    C.physical_summary(result, "fit", "threads", phys, [2.5, 2.6])
    text = capsys.readouterr().out
    assert "WRONG FLOOR" not in text and "RATIO physical_floor / slem_time = 0.800" in text
    assert result["threads_ratio_physical_best"] == 0.8


def test_a_physical_floor_slower_than_the_floor_contender_is_called_wrong(capsys):
    phys = dict(PHYSICAL_FLOOR_OF_2_S)
    C.physical_summary({}, "encode", "threads", phys, [2.5, 2.6], [1.9, 2.2])
    text = capsys.readouterr().out
    assert (
        "WRONG FLOOR: the physical floor (2.000 s) is slower than the floor contender's "
        "best run (1.900 s)" in text
    )
    C.physical_summary({}, "encode", "threads", phys, [2.5, 2.6], [2.1, 2.2])
    assert "WRONG FLOOR" not in capsys.readouterr().out


def test_the_physical_floor_keeps_the_least_of_each_part_over_measurements():
    """A shared VM's speed moves within minutes: measured again, each part of the floor
    is the least of all measurements, and the total is their sum over the cores."""
    import _physical

    slow_product = {
        "total": 5.0,
        "decode_cpu": 4.0,
        "product_cpu": 6.0,
        "gflops_per_core": 85.0,
        "write_cpu": 0.0,
        "write_gbps": 0.0,
        "disk_gbps": 1.0,
        "cores": 2,
        "measurements": 1,
    }
    slow_decode = {
        **slow_product,
        "decode_cpu": 4.4,
        "product_cpu": 4.0,
        "gflops_per_core": 127.5,
        "disk_gbps": 1.2,
    }
    merged = _physical.least_floor(slow_product, slow_decode)
    assert merged["decode_cpu"] == 4.0 and merged["product_cpu"] == 4.0
    assert merged["gflops_per_core"] == 127.5 and merged["disk_gbps"] == 1.2
    assert merged["total"] == 4.0 and merged["measurements"] == 2
    assert _physical.least_floor(slow_decode, slow_product) == merged


def test_the_physical_floor_adds_decode_product_and_write_over_the_cores(tmp_path):
    import dask.array as da
    import numpy as np

    x = da.from_array(np.ones((64, 8), dtype=np.float32), chunks=(16, 8))
    phys = C.physical_floor(x, lambda b: b @ np.eye(8, dtype=np.float32), 64 * 8 * 4, tmp_path)
    parts = phys["decode_cpu"] + phys["product_cpu"] + phys["write_cpu"]
    assert phys["total"] == parts / phys["cores"]
    assert phys["write_cpu"] > 0 and not list(tmp_path.iterdir())  # its probe file removed


def test_the_physical_floor_decodes_every_block_with_the_reader_and_no_dask(tmp_path, monkeypatch):
    """Given the store, the decode is slem-dask's reader on every block in turn (a dask
    compute per block put the physical floor of a 2e5 x 256 fit above its floor)."""
    import dask.array as da
    import numpy as np
    import zarr

    import _physical
    from slem_dask import storage

    arr = zarr.create_array(str(tmp_path / "x.zarr"), shape=(70, 8), chunks=(16, 8), dtype="f4")
    arr[...] = np.ones((70, 8), dtype=np.float32)
    x = storage.dask_rows(arr, 32)
    reads = []
    real = storage.read_rows
    monkeypatch.setattr(
        storage,
        "read_rows",
        lambda a, lo, hi, *r, **k: (reads.append((lo, hi)), real(a, lo, hi))[1],
    )
    monkeypatch.setattr(da.Array, "compute", lambda *a, **k: pytest.fail("dask computed"))
    _physical._read_every_block(x, arr)
    assert reads == [(0, 32), (32, 64), (64, 70)]


def test_same_start_reads_the_inputs_and_keeps_every_file(tmp_path):
    import _physical

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "chunk").write_bytes(b"x" * 5000)
    (tmp_path / "in.bin").write_bytes(b"y" * 7000)
    _physical.same_start([tmp_path / "out"], [tmp_path / "in.bin"], pause=0)
    assert (tmp_path / "out" / "chunk").read_bytes() == b"x" * 5000  # dropped from cache only
    assert _physical.read_through([tmp_path / "in.bin"]) == 7000
    assert _physical.drop_cached([tmp_path / "out"]) == 5000


def test_cpu_times_adds_every_workers_user_and_system_time():
    class Client:
        def run(self, func):
            return {"w1": (1.0, 0.25), "w2": (2.0, 0.5)}

    user0, system0 = C.cpu_times()
    user, system = C.cpu_times(Client())
    # the workers' 3.0 and 0.75 s, and whatever this process spent in between (sums of
    # floats: not compared exactly)
    assert 3.0 - 1e-9 <= user - user0 < 3.5
    assert 0.75 - 1e-9 <= system - system0 < 1.25


def test_the_cpu_ratio_compares_the_medians_of_user_time(capsys):
    import bench_encode

    floor = [{"user cpu": u, "system cpu": 0.5} for u in (1.2, 1.0, 9.0)]
    slem = [{"user cpu": u, "system cpu": s} for u, s in ((1.6, 0.4), (1.5, 2.0), (1.4, 0.3))]
    result = {}
    bench_encode._cpu_summary(result, "threads", floor, slem)
    assert result["threads_ratio_floor_user_cpu"] == 1.2 / 1.5
    assert result["threads_cpu_medians"] == {"floor": [1.2, 0.5], "slem": [1.5, 0.4]}
    assert "RATIO floor_user_cpu / slem_user_cpu = 0.800" in capsys.readouterr().out


def test_a_machine_without_a_balloon_device_reports_no_free_pages(monkeypatch):
    import _physical

    def listdir(path):
        raise FileNotFoundError(path)

    monkeypatch.setattr(_physical.os, "listdir", listdir)
    assert _physical.reports_free_pages() is False
    monkeypatch.setattr(_physical.os, "listdir", lambda path: ["bind", "virtio0"])
    monkeypatch.setattr(_physical.os.path, "exists", lambda path: True)
    assert _physical.reports_free_pages() is True
    monkeypatch.setattr(_physical.os, "listdir", lambda path: ["bind", "uevent"])
    assert _physical.reports_free_pages() is False


@pytest.fixture
def page_parameter(tmp_path, monkeypatch):
    """(a stand-in for the kernel's min_free_ms, at 0; the functions registered to run at
    exit, not run)."""
    import _physical

    parameter = tmp_path / "min_free_ms"
    parameter.write_text("0\n")
    at_exit: list = []
    monkeypatch.setattr(_physical, "MIN_FREE_MS", str(parameter))
    monkeypatch.setattr("atexit.register", at_exit.append)
    return parameter, at_exit


def test_hold_free_pages_sets_the_parameter_and_puts_it_back_at_exit(page_parameter):
    import _physical

    parameter, at_exit = page_parameter
    line = _physical.hold_free_pages()
    assert parameter.read_text() == str(_physical.HELD_MIN_FREE_MS)
    assert f"was 0; put back at exit; after a killed run: echo 0 > {parameter}" in line
    (put_back,) = at_exit
    put_back()
    assert parameter.read_text() == "0"


def test_of_two_runs_that_overlap_the_later_does_not_hold_the_pages_again(page_parameter):
    import _physical

    parameter, at_exit = page_parameter
    _physical.hold_free_pages()  # the first run
    assert "(was 300000;" in _physical.hold_free_pages()  # the second, while it runs
    first, second = at_exit
    first()  # the first ends: put back as it found it
    assert parameter.read_text() == "0"
    second()  # the second ends after it: what it found held is not held again
    assert parameter.read_text() == "0"


def test_hold_free_pages_without_the_parameter_says_why_in_one_line(tmp_path, monkeypatch):
    import _physical

    missing = tmp_path / "no-such-parameter"
    monkeypatch.setattr(_physical, "MIN_FREE_MS", str(missing))
    with pytest.raises(SystemExit) as stop:
        _physical.hold_free_pages()
    message = str(stop.value)
    assert message.startswith(f"--hold-free-pages: cannot set {missing} (No such file")
    assert "run as root, or omit --hold-free-pages" in message and "\n" not in message
    assert not missing.exists()


def test_bench_encode_parts_times_every_step_of_both_sides(tmp_path, capsys):
    import bench_encode_parts

    args = ["--n", "4000", "--d", "64", "--repeat", "2", "--workdir", str(tmp_path)]
    assert bench_encode_parts.main(args) == 0
    out = capsys.readouterr().out
    for step in {*bench_encode_parts.FLOOR_STEPS, *bench_encode_parts.SLEM_STEPS}:
        assert f"\n{step} " in out, step
    ratios = [line for line in out.splitlines() if line.startswith("RATIO floor / slem-dask")]
    assert [r.split("(")[1].split(")")[0] for r in ratios] == ["bests", "medians"]
    (result,) = [line for line in out.splitlines() if line.startswith("RESULT bench_encode_parts")]
    values = json.loads(result.split(" ", 2)[2])
    assert 0 < values["ratio_bests"] and set(values["steps_ms"]) >= set(
        bench_encode_parts.SLEM_STEPS
    )
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("bench-encode-parts-")]
