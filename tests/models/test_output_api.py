"""scikit-learn's output API on the transformers: feature_names_in_,
get_feature_names_out, set_output (numpy, pandas, polars), in a Pipeline and a
ColumnTransformer; dask input stays lazy whatever the output setting."""

import warnings

import dask
import dask.array as da
import numpy as np
import pytest

pytest.importorskip("sklearn")
pd = pytest.importorskip("pandas")

from sklearn import config_context  # noqa: E402
from sklearn.base import clone  # noqa: E402
from sklearn.compose import ColumnTransformer  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

from slem_dask import ESVM, KernelSLEM, LinearSLEM, PCAWhitening, RawFeatures  # noqa: E402

D = 6
NAMES = [f"f{i}" for i in range(D)]


@pytest.fixture(scope="module")
def frame():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, D))
    return pd.DataFrame(X, columns=NAMES, index=[f"img{i}" for i in range(40)])


MODELS = [
    (LinearSLEM(lam=1e-2), [f"linearslem{i}" for i in range(D)]),
    (KernelSLEM(rank=4, random_state=0), [f"kernelslem{i}" for i in range(4)]),
    (ESVM(n_iter=20, random_state=0), [f"esvm{i}" for i in range(D)]),
    (PCAWhitening(n_components=3), ["pcawhitening0", "pcawhitening1", "pcawhitening2"]),
    (RawFeatures(), NAMES),  # output j is input j, normalized: the input's name
]
IDS = [type(m).__name__ for m, _ in MODELS]


@pytest.mark.parametrize("model, names", MODELS, ids=IDS)
def test_fit_on_a_dataframe_names_inputs_and_outputs(model, names, frame):
    fitted = clone(model).fit(frame)
    assert fitted.n_features_in_ == D
    assert fitted.feature_names_in_.dtype == object
    assert list(fitted.feature_names_in_) == NAMES
    out = fitted.get_feature_names_out()
    assert out.dtype == object and list(out) == names
    assert list(fitted.get_feature_names_out(NAMES)) == names
    with pytest.raises(ValueError, match="input_features is not equal to feature_names_in_"):
        fitted.get_feature_names_out([f"g{i}" for i in range(D)])
    # refitted on numpy: no names any more; the inputs are then x0, x1, ...
    refitted = fitted.fit(frame.to_numpy())
    assert not hasattr(refitted, "feature_names_in_")
    expected = [f"x{i}" for i in range(D)] if isinstance(model, RawFeatures) else names
    assert list(refitted.get_feature_names_out()) == expected
    with pytest.raises(ValueError, match=rf"input_features should have length equal .*\({D}\)"):
        refitted.get_feature_names_out(NAMES[:2])


@pytest.mark.parametrize("model, names", MODELS, ids=IDS)
def test_set_output_pandas_keeps_the_values_and_the_index(model, names, frame):
    plain = clone(model).fit(frame.to_numpy()).transform(frame.to_numpy())
    out = clone(model).set_output(transform="pandas").fit(frame).transform(frame)
    assert isinstance(out, pd.DataFrame)
    assert list(out.columns) == names and list(out.index) == list(frame.index)
    np.testing.assert_array_equal(out.to_numpy(), plain)
    # fit_transform too, and numpy in gives a DataFrame with a range index
    both = clone(model).set_output(transform="pandas").fit_transform(frame.to_numpy())
    assert isinstance(both, pd.DataFrame) and list(both.index) == list(range(len(frame)))
    # "default" again: numpy
    back = clone(model).set_output(transform="pandas").set_output(transform="default")
    assert isinstance(back.fit(frame).transform(frame), np.ndarray)


def test_set_output_polars(frame):
    pl = pytest.importorskip("polars")
    X = pl.from_pandas(frame)
    model = LinearSLEM().set_output(transform="polars").fit(X)
    assert list(model.feature_names_in_) == NAMES  # polars columns are names too
    out = model.transform(X)
    assert isinstance(out, pl.DataFrame) and out.columns == [f"linearslem{i}" for i in range(D)]
    np.testing.assert_array_equal(out.to_numpy(), LinearSLEM().fit(frame).transform(frame))


def test_global_config_reaches_the_models(frame):
    model = PCAWhitening().fit(frame)
    with config_context(transform_output="pandas"):
        assert isinstance(model.transform(frame), pd.DataFrame)
    assert isinstance(model.transform(frame), np.ndarray)
    # the model's own setting wins over the global one, as for scikit-learn's
    with config_context(transform_output="pandas"):
        assert isinstance(model.set_output(transform="default").transform(frame), np.ndarray)


def test_pipeline_set_output_pandas(frame):
    pipe = make_pipeline(StandardScaler(), LinearSLEM()).set_output(transform="pandas")
    out = pipe.fit(frame).transform(frame)
    assert isinstance(out, pd.DataFrame)
    assert list(out.columns) == [f"linearslem{i}" for i in range(D)]
    assert list(out.index) == list(frame.index)
    assert list(pipe.get_feature_names_out()) == list(out.columns)
    scaled = StandardScaler().fit_transform(frame.to_numpy())
    np.testing.assert_allclose(out.to_numpy(), LinearSLEM().fit(scaled).transform(scaled))
    assert list(pipe[-1].feature_names_in_) == NAMES  # the scaler passes the names on


def test_column_transformer_names_its_features(frame):
    ct = ColumnTransformer(
        [("slem", LinearSLEM(), NAMES[:4]), ("pca", PCAWhitening(n_components=2), NAMES[4:])],
        remainder="drop",
    )
    Z = ct.fit_transform(frame)
    names = list(ct.get_feature_names_out())
    assert names == [f"slem__linearslem{i}" for i in range(4)] + [
        "pca__pcawhitening0",
        "pca__pcawhitening1",
    ]
    assert Z.shape == (len(frame), len(names))
    out = ct.set_output(transform="pandas").fit_transform(frame)
    assert list(out.columns) == names and list(out.index) == list(frame.index)
    np.testing.assert_array_equal(out.to_numpy(), Z)


def test_wrong_names_at_transform_are_refused(frame):
    model = LinearSLEM().fit(frame)
    renamed = frame.rename(columns={"f0": "other"})
    with pytest.raises(ValueError, match="(?s)should match those that were passed.*- other"):
        model.transform(renamed)
    with pytest.warns(UserWarning, match="X does not have valid feature names, but LinearSLEM"):
        model.transform(frame.to_numpy())
    with pytest.raises(TypeError, match="all input features have string names"):
        LinearSLEM().fit(frame.set_axis([0, 1, 2, "f3", "f4", "f5"], axis=1))


def _refuse_to_compute(*args, **kwargs):
    raise AssertionError("computed: a dask input must give a lazy output")


@pytest.mark.parametrize("model, names", MODELS, ids=IDS)
def test_dask_input_stays_lazy_whatever_the_output(model, names, frame):
    X = frame.to_numpy()
    fitted = clone(model).fit(X).set_output(transform="pandas")
    lazy = da.from_array(X, chunks=(7, D))
    with dask.config.set(scheduler=_refuse_to_compute), config_context(transform_output="pandas"):
        Z = fitted.transform(lazy)
    assert isinstance(Z, da.Array)
    np.testing.assert_allclose(Z.compute(), fitted.transform(X).to_numpy(), rtol=1e-12)


def test_similarity_stays_an_array_under_set_output(frame):
    model = LinearSLEM().fit(frame).set_output(transform="pandas")
    S = model.similarity(frame.to_numpy()[:3], frame.to_numpy()[:5])
    assert isinstance(S, np.ndarray) and S.shape == (3, 5)


def test_set_output_refuses_an_unknown_container_in_one_line():
    with pytest.raises(ValueError, match=r"transform='numpy' is not one of \['default'") as e:
        LinearSLEM().set_output(transform="numpy")
    assert "\n" not in str(e.value)
    model = LinearSLEM()
    assert model.set_output() is model and not hasattr(model, "_sklearn_output_config")


def test_clone_keeps_the_output_setting(frame):
    copy = clone(LinearSLEM().set_output(transform="pandas"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert isinstance(copy.fit(frame).transform(frame), pd.DataFrame)


def test_without_sklearn_set_output_says_what_to_install():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['sklearn'] = None\n"
        "import numpy as np, pandas as pd\n"
        "from slem_dask import LinearSLEM\n"
        "X = pd.DataFrame(np.random.default_rng(0).standard_normal((20, 3)), columns=list('abc'))\n"
        "m = LinearSLEM().set_output(transform='default').fit(X)\n"
        "print(list(m.feature_names_in_), type(m.transform(X)).__name__)\n"
        "try:\n"
        "    m.set_output(transform='pandas')\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "['a', 'b', 'c'] ndarray",
        "set_output: transform='pandas' needs scikit-learn, which is not installed; "
        "pip install scikit-learn, or use transform='default'",
    ]
