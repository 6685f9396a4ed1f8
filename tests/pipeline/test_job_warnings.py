"""A job's warnings point at the line that called the job (fit_job, encode_job), not at a
line inside slem-dask: the jobs were split into steps, and each warning's stacklevel
counts those steps (issue 33)."""

import warnings

import pytest

from slem_dask import pipeline
from slem_dask.core.validation import LambdaScaleWarning
from slem_dask.models.kernel import TraceErrorWarning
from slem_dask.storage.nodes import chunks
from slem_dask.storage.nodes.chunks import SmallChunksWarning

from helpers import small_corpus


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    # the stores' 40-row chunks count as "many small chunks": every job hints to rechunk
    monkeypatch.setattr(chunks, "MANY_UNITS", 2)
    return small_corpus(tmp_path, seed=5)


def _caught(category, job, *args, **kwargs):
    """The warnings of ``category`` that ``job(*args, **kwargs)`` gave, called from here."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        job(*args, **kwargs)
    found = [w for w in caught if issubclass(w.category, category)]
    assert found, [str(w.message) for w in caught]
    return found


def _where(found) -> list[str]:
    return [f"{w.filename}:{w.lineno}" for w in found]


@pytest.mark.parametrize("kernel", [{}, {"kernel": "rbf", "rank": 4, "lam": 1e-2}])
def test_a_fit_hints_to_rechunk_at_the_line_that_called_fit_job(corpus, tmp_path, kernel):
    found = _caught(
        SmallChunksWarning,
        pipeline.fit_job,
        None,
        corpus["negatives"],
        str(tmp_path / "m.zarr"),
        **kernel,
    )
    assert [w.filename for w in found] == [__file__], _where(found)


def test_an_encode_hints_to_rechunk_at_the_line_that_called_encode_job(corpus, tmp_path):
    found = _caught(
        SmallChunksWarning,
        pipeline.encode_job,
        None,
        corpus["model"],
        corpus["positives"],
        str(tmp_path / "codes.zarr"),
    )
    assert [w.filename for w in found] == [__file__], _where(found)


def test_a_warning_that_names_the_negatives_points_at_the_caller_of_fit_job(corpus, tmp_path):
    # a lambda 1e6 times the negatives' mean variance: the model barely whitens
    found = _caught(
        LambdaScaleWarning,
        pipeline.fit_job,
        None,
        corpus["negatives"],
        str(tmp_path / "a.zarr"),
        lam=1e6,
    )
    assert str(found[0].message).startswith(f"negatives {corpus['negatives']!r}: lam=")
    assert [w.filename for w in found] == [__file__], _where(found)
    # kernel fits: a rank-1 factor of an rbf kernel on 8 spread features leaves most of
    # the trace unexplained
    found = _caught(
        TraceErrorWarning,
        pipeline.fit_job,
        None,
        corpus["negatives"],
        str(tmp_path / "k.zarr"),
        kernel="rbf",
        gamma=1.0,
        rank=1,
        lam=1e-2,
    )
    assert str(found[0].message).startswith(f"negatives {corpus['negatives']!r}: ")
    assert [w.filename for w in found] == [__file__], _where(found)
