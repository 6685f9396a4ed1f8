"""The jobs' library form (pipeline/options.py): an estimator and a frozen options
object, equal to the keyword form; invalid options refused in one line naming them."""

import dataclasses

import numpy as np
import pytest
import zarr

from slem_dask import KernelSLEM, LinearSLEM, load_model, pipeline, storage
from slem_dask.pipeline import EncodeOptions, FitOptions, SearchOptions
from slem_dask.pipeline.search import open_search_result
from slem_dask.pipeline.encode_plan import plan_encode
from slem_dask.pipeline.fit import plan_statistics
from slem_dask.parallel.blocks import statistics_partition_rows

from helpers import small_corpus


@pytest.fixture
def corpus(tmp_path):
    return small_corpus(tmp_path, seed=11)


def test_fit_with_an_estimator_and_options_equals_the_keyword_form(corpus, tmp_path):
    by_keywords = str(tmp_path / "k.zarr")
    by_objects = str(tmp_path / "o.zarr")
    pipeline.fit_job(
        None,
        corpus["negatives"],
        by_keywords,
        lam=0.2,
        theta=2.0,
        partition_rows=80,
        precision="float64",
    )
    estimator = LinearSLEM(lam=0.2, theta=2.0, precision="float64")
    report = pipeline.fit_job(
        None,
        corpus["negatives"],
        by_objects,
        estimator=estimator,
        options=FitOptions(partition_rows=80),
    )
    assert report.facts["partitions"] == "4 x 80 rows"
    got, ref = load_model(by_objects), load_model(by_keywords)
    assert got.get_params() == ref.get_params() == estimator.get_params()
    np.testing.assert_array_equal(got.mean_, ref.mean_)
    np.testing.assert_array_equal(got.covariance_, ref.covariance_)
    # an update in the options' form: nothing appended, nothing written
    again = pipeline.fit_job(
        None,
        corpus["negatives"],
        by_objects,
        estimator=LinearSLEM(lam=0.2, theta=2.0, precision="float64"),
        options=FitOptions(update=True),
    )
    assert again.facts["action"] == "up to date"
    assert storage.head_seq(storage.canonical(by_objects)) == 1


def test_kernel_fit_with_an_estimator_equals_the_keyword_form(corpus, tmp_path):
    pipeline.fit_job(
        None,
        corpus["negatives"],
        str(tmp_path / "k.zarr"),
        lam=1e-2,
        kernel="rbf",
        gamma=0.2,
        rank=6,
        seed=0,
    )
    pipeline.fit_job(
        None,
        corpus["negatives"],
        str(tmp_path / "o.zarr"),
        estimator=KernelSLEM(kernel="rbf", gamma=0.2, rank=6, lam=1e-2, random_state=0),
    )
    got, ref = load_model(str(tmp_path / "o.zarr")), load_model(str(tmp_path / "k.zarr"))
    assert got.get_params() == ref.get_params()
    np.testing.assert_array_equal(got.pivots_, ref.pivots_)


def test_encode_with_options_equals_the_keyword_form(corpus, tmp_path):
    by_keywords, by_objects = str(tmp_path / "k.zarr"), str(tmp_path / "o.zarr")
    pipeline.encode_job(
        None, corpus["model"], corpus["positives"], by_keywords, dtype="float64", partition_rows=40
    )
    report = pipeline.encode_job(
        None,
        corpus["model"],
        corpus["positives"],
        by_objects,
        options=EncodeOptions(dtype="float64", partition_rows=40),
    )
    assert report.facts["partitions"] == "5 encoded of 5"
    got = storage.open_output(by_objects)
    assert got.dtype == np.float64 and got.chunks == (40, 8)
    np.testing.assert_array_equal(got[...], storage.open_output(by_keywords)[...])


def test_encode_plan_reads_and_writes_nothing(corpus, tmp_path):
    out = storage.canonical(str(tmp_path / "codes.zarr"))
    model = load_model(corpus["model"])
    plan = plan_encode(
        model,
        storage.canonical(corpus["model"]),
        storage.canonical(corpus["positives"]),
        out,
        EncodeOptions(partition_rows=40),
    )
    assert (plan.action, plan.head, plan.rows, plan.n_rows, plan.n_parts, plan.width) == (
        "create",
        None,
        40,
        200,
        5,
        8,
    )
    assert len(plan.inputs) == 5 and plan.out_dtype == np.float32
    assert not (tmp_path / "codes.zarr").exists()
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.rows = 80


def test_statistics_plan_is_the_partitioning_of_the_store(corpus):
    arr = zarr.open_array(corpus["negatives"], mode="r")
    asked = []
    plan = plan_statistics(arr, 100, None, lambda: asked.append(1) or 2, "auto")
    assert asked == [1]  # the cluster's threads: asked once, for the store's partitioning
    rows = statistics_partition_rows(200, 8, 40, storage.row_partition(arr), 2)
    assert (plan.start, plan.n, plan.rows, plan.n_parts) == (100, 300, rows, -(-200 // rows))
    given = plan_statistics(arr, 0, 80, lambda: pytest.fail("threads asked"), "auto")
    assert (given.rows, given.n_parts) == (80, 4)


@pytest.mark.parametrize(
    "make, error, said",
    [
        (
            lambda: FitOptions(partition_rows=0),
            ValueError,
            "FitOptions.partition_rows must be an integer >= 1 or None",
        ),
        (lambda: FitOptions(partition_rows=2.5), ValueError, "got 2.5"),
        (
            lambda: FitOptions(update="yes"),
            TypeError,
            "FitOptions.update must be True or False, got 'yes' of type str",
        ),
        (
            lambda: EncodeOptions(on_model_change="rebuild"),
            ValueError,
            "on_model_change must be 'fail' or 'reencode', got 'rebuild'",
        ),
        (
            lambda: EncodeOptions(precision="float32"),
            ValueError,
            "EncodeOptions.precision must be one of ('auto', 'float64') or None",
        ),
        (lambda: EncodeOptions(overwrite=1), TypeError, "EncodeOptions.overwrite must be True"),
        (
            lambda: EncodeOptions(dtype="int8"),
            ValueError,
            "EncodeOptions.dtype must be a float dtype (float32 or float64) or None",
        ),
        (lambda: EncodeOptions(dtype="f8x"), ValueError, "EncodeOptions.dtype must be a float"),
        (lambda: FitOptions().replace(repivot=None), TypeError, "FitOptions.repivot must be"),
    ],
)
def test_an_invalid_option_is_refused_in_one_line_naming_it(make, error, said):
    with pytest.raises(error) as caught:
        make()
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_loose_keywords_beside_the_objects_are_refused(corpus, tmp_path):
    model = str(tmp_path / "m.zarr")
    with pytest.raises(
        ValueError,
        match=r"^lam=0\.5 was given beside "
        r"estimator=LinearSLEM\(\.\.\.\): set it on the ",
    ):
        pipeline.fit_job(None, corpus["negatives"], model, lam=0.5, estimator=LinearSLEM())
    with pytest.raises(
        ValueError,
        match=r"^overwrite=True was given beside options=: give "
        r"it in the FitOptions",
    ):
        pipeline.fit_job(None, corpus["negatives"], model, overwrite=True, options=FitOptions())
    with pytest.raises(TypeError, match=r"^options must be of type EncodeOptions, got FitOptions"):
        pipeline.encode_job(None, corpus["model"], corpus["positives"], model, options=FitOptions())
    with pytest.raises(TypeError, match=r"^estimator must be a LinearSLEM or a KernelSLEM"):
        pipeline.fit_job(None, corpus["negatives"], model, estimator="linear")
    with pytest.raises(ValueError) as caught:
        pipeline.fit_job(
            None,
            corpus["negatives"],
            model,
            estimator=LinearSLEM(),
            options=FitOptions(repivot=True),
        )
    assert str(caught.value) == (  # the fix of an estimator's caller, not kernel=...
        "repivot applies to kernel models only (estimator=KernelSLEM(...)), not to a linear "
        "SLEM, whose fit always streams its negatives: drop it from the FitOptions"
    )
    assert not (tmp_path / "m.zarr").exists()  # every refusal before anything was written


@pytest.mark.parametrize(
    "keywords, estimator, said",
    [
        (
            {"seed": 3},
            KernelSLEM(),
            "seed=3 was given beside estimator=KernelSLEM(...): set it on the estimator "
            "(e.g. KernelSLEM(..., random_state=...)), or give keywords without estimator=",
        ),
        (
            {"kernel_memory": "streaming"},
            KernelSLEM(),
            "kernel_memory='streaming' was given beside estimator=KernelSLEM(...): set it on "
            "the estimator (e.g. KernelSLEM(..., strategy=...)), or give keywords without "
            "estimator=",
        ),
        (
            {"gamma": 0.5},
            LinearSLEM(),
            "gamma=0.5 was given beside estimator=LinearSLEM(...), which takes no gamma: drop it",
        ),
        (
            {"precision": "float64"},
            KernelSLEM(),
            "precision='float64' was given beside estimator=KernelSLEM(...), which takes no "
            "precision: drop it",
        ),
    ],
    ids=["seed", "kernel_memory", "gamma of a linear model", "precision of a kernel model"],
)
def test_a_keyword_beside_an_estimator_is_refused_with_a_fix_the_estimator_takes(
    corpus, tmp_path, keywords, estimator, said
):
    # the fix named parameters the estimators do not have (KernelSLEM(..., seed=...))
    with pytest.raises(ValueError) as caught:
        pipeline.fit_job(
            None, corpus["negatives"], str(tmp_path / "m.zarr"), estimator=estimator, **keywords
        )
    assert str(caught.value) == said
    assert not (tmp_path / "m.zarr").exists()


def test_search_with_options_equals_the_keyword_form(corpus, tmp_path):
    codes = str(tmp_path / "codes.zarr")
    pipeline.encode_job(None, corpus["model"], corpus["positives"], codes, partition_rows=40)
    pipeline.search_job(None, codes, codes, str(tmp_path / "k.zarr"), k=7, partition_rows=40)
    report = pipeline.search_job(
        None, codes, codes, str(tmp_path / "o.zarr"), options=SearchOptions(k=7, partition_rows=40)
    )
    assert (report.facts["k"], report.facts["partitions"]) == (7, 5)
    for a, b in zip(
        open_search_result(str(tmp_path / "o.zarr")),
        open_search_result(str(tmp_path / "k.zarr")),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(
        ValueError,
        match=r"^SearchOptions\.k must be an integer >= 1 "
        r"\(results per query\), got 0$",
    ):
        SearchOptions(k=0)
    with pytest.raises(ValueError, match=r"^force=True was given beside options="):
        pipeline.search_job(
            None, codes, codes, str(tmp_path / "f.zarr"), force=True, options=SearchOptions()
        )
