"""The long dense factorizations let the other threads of the process run (issue 39).

At d = 8192 scipy's f2py wrappers held the GIL for minutes (PCA whitening's eigh) or tens
of seconds (the Cholesky inverse of a linear fit): the dask workers that ``--local-cluster
auto`` runs on threads of the same process stopped answering, and the scheduler dropped
them. No timing here: with a switch interval far longer than the call, a thread that
holds the GIL through the call lets no other thread run until it returns, so another
thread sees the call in progress only if the call released the GIL; and the fits are
checked to call none of scipy's GIL-holding wrappers.
"""

import sys
import threading

import numpy as np
import pytest

from slem_dask.core import lapack


def _seen_running_during(call) -> int:
    """How many times another thread ran while ``call`` ran."""
    inside, finished, seen = threading.Event(), threading.Event(), [0]

    def run():
        inside.set()
        try:
            call()
        finally:
            inside.clear()
            finished.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)  # no forced switch: only a released GIL lets us run
    try:
        worker = threading.Thread(target=run)
        worker.start()
        while not finished.is_set():
            if inside.is_set():
                seen[0] += 1
            finished.wait(0.001)  # releases the GIL, as a worker's event loop does
        worker.join()
    finally:
        sys.setswitchinterval(interval)
    return seen[0]


@pytest.fixture(scope="module")
def spd():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1500, 1500))
    return x @ x.T / 1500 + np.eye(1500)


@pytest.mark.parametrize("routine", ["cholesky_inverse_in_place", "cholesky_lower", "eigh"])
def test_other_threads_run_during_the_gil_free_routines(spd, routine):
    work = spd.copy()
    call = {
        "cholesky_inverse_in_place": lambda: lapack.cholesky_inverse_in_place(work),
        "cholesky_lower": lambda: lapack.cholesky_lower(work),
        "eigh": lambda: lapack.symmetric_eigh(work),
    }[routine]
    assert _seen_running_during(call) > 0, f"{routine} held the GIL for the whole call"


def test_a_gil_holding_call_is_seen_as_such(spd):
    # the probe itself: scipy's f2py dpotrf holds the GIL, so nothing else ran
    from scipy.linalg import lapack as scipy_lapack

    work = np.asfortranarray(spd)  # f2py then copies nothing (a copy may release the GIL)
    assert _seen_running_during(lambda: scipy_lapack.dpotrf(work, overwrite_a=True)) == 0


def test_fits_call_no_factorization_that_holds_the_gil(monkeypatch):
    # linear SLEM's Cholesky inverse, PCA whitening's eigendecomposition (covariance and
    # Gram paths) and kernel SLEM's G factor went through scipy's f2py wrappers
    import scipy.linalg

    from slem_dask import KernelSLEM, LinearSLEM, PCAWhitening

    def holds_the_gil(*args, **kwargs):
        raise AssertionError("a factorization through scipy's f2py wrapper holds the GIL")

    for name in ("dpotrf", "dpotri", "dsyevr", "dsyevd"):
        monkeypatch.setattr(scipy.linalg.lapack, name, holds_the_gil)
    for name in ("eigh", "cholesky", "cho_factor"):
        monkeypatch.setattr(scipy.linalg, name, holds_the_gil)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((200, 40))
    LinearSLEM().fit(x)
    PCAWhitening().fit(x)
    PCAWhitening().fit(x[:20])  # fewer negatives than features: the Gram matrix
    KernelSLEM(gamma=0.1, rank=16).fit(x)


def test_the_gil_free_routines_give_scipys_results(spd):
    from scipy import linalg

    a = spd.copy()
    assert lapack.cholesky_inverse_in_place(a) == (0, 0)
    np.testing.assert_allclose(np.triu(a), np.triu(np.linalg.inv(spd)), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(
        lapack.cholesky_lower(spd), linalg.cholesky(spd, lower=True, check_finite=False)
    )
    with pytest.raises(np.linalg.LinAlgError, match="not positive definite"):
        lapack.cholesky_lower(-spd)
    values, vectors = lapack.symmetric_eigh(spd)
    np.testing.assert_allclose(values, linalg.eigvalsh(spd), rtol=1e-10)
    np.testing.assert_allclose((vectors * values) @ vectors.T, spd, atol=1e-9)
