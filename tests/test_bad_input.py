"""Property-based bad-input suite (issue 8): every public estimator and ``attention``.

Each generated case must end in a correct result (right shape, finite values) or in a clear
``ValueError``/``TypeError`` whose message names the problem; never an exception from inside
torch (``RuntimeError``, ``IndexError``, ...), NaN output or a hang.

Cost is bounded for CI: a fixed number of examples per test, ``derandomize=True`` (the same
examples on every run), no deadline (one core shared with other jobs), and cheap estimator
settings (``CHEAP`` in tests/conftest.py).
"""

import traceback
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sklearn.utils import get_tags

import skattention
from skattention import attention
from tests.conftest import CHEAP, ESTIMATORS
from tests.conftest import cheap as make

pd = pytest.importorskip("pandas")

settings.register_profile(
    "bad_input",
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
BAD_INPUT = settings.get_profile("bad_input")

SUPERVISED = {
    "MetricAttentionClassifier",
    "MetricAttentionTransformer",
    "AttentionNetworkClassifier",
}
REGRESSION = {"MetricAttentionRegressor"}
OUTPUT_METHODS = ("predict", "predict_proba", "transform")
# Words that name the problem with huge (finite) inputs.
OVERFLOW = ("nan", "inf", "large", "overflow", "scale", "dtype")


def test_every_estimator_has_cheap_settings():
    assert set(ESTIMATORS) == set(CHEAP)


def input_tags(name):
    """The estimator's declared input tags (missing values, sparse, strings)."""
    return make(name).__sklearn_tags__().input_tags


def make_y(name, n, rng):
    if name in SUPERVISED:
        return np.arange(n) % 2 if n else np.array([], dtype=int)
    if name in REGRESSION:
        return rng.normal(size=n)
    return None


# --------------------------------------------------------------------------- outcome checks


def _raised_inside(exc, package):
    """Whether the innermost frame of ``exc``'s traceback lies in ``package``."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and f"/{package}/" in frames[-1].filename.replace("\\", "/")


def check_clear_error(exc, *words):
    """``exc`` is a clear ValueError/TypeError, not from torch; its message names the problem."""
    if not isinstance(exc, (ValueError, TypeError)) or _raised_inside(exc, "torch"):
        raise AssertionError(f"unclear failure {type(exc).__name__}: {exc}") from exc
    msg = str(exc).lower()
    assert msg.strip(), f"empty message for {type(exc).__name__}"
    if words:
        assert any(w.lower() in msg for w in words), (
            f"message does not name the problem {words}: {exc}"
        )


def check_output(out, n):
    out = out[0] if isinstance(out, tuple) else out
    out = np.asarray(out)
    assert out.shape[0] == n, out.shape
    if out.dtype.kind == "f":
        assert np.isfinite(out).all(), "non-finite output"


def run_estimator(name, X, y, X_test=None, params=None):
    """Fit and call every output method; return the exception raised, or None."""
    est = make(name, **(params or {}))
    X_test = X if X_test is None else X_test
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            est.fit(X, y)
            for method in OUTPUT_METHODS:
                if hasattr(est, method):
                    check_output(getattr(est, method)(X_test), _n_rows(X_test))
        except AssertionError:
            raise
        except Exception as exc:  # noqa: BLE001 - every other exception is judged
            return exc
    return None


def _n_rows(X):
    return X.shape[0] if hasattr(X, "shape") else len(X)


# --------------------------------------------------------------------------- strategies

DTYPES = [np.float64, np.float32, np.float16, np.int64, np.int8, np.uint8, np.bool_]
CONTAINERS = ["ndarray", "list", "dataframe", "csr", "fortran"]
SCALES = [1.0, 1e-30, 1e4, 1e30, 1e300]


@st.composite
def matrices(draw, min_rows=0, max_rows=7, min_cols=0, max_cols=4):
    n = draw(st.integers(min_rows, max_rows))
    d = draw(st.integers(min_cols, max_cols))
    seed = draw(st.integers(0, 2**16))
    dtype = draw(st.sampled_from(DTYPES))
    scale = draw(st.sampled_from(SCALES))
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * scale
    if dtype == np.bool_:
        X = X > 0
    elif np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        X = np.clip(np.round(X), info.min // 2, info.max // 2)  # exactly representable bounds
    elif np.dtype(dtype).kind == "f":
        big = np.finfo(dtype).max / 4  # large but finite in its own dtype
        X = np.clip(X, -big, big)
    X = X.astype(dtype)
    return X, seed


def wrap(X, container):
    if container == "list":
        return X.tolist()
    if container == "dataframe":
        return pd.DataFrame(X, columns=[f"c{j}" for j in range(X.shape[1])])
    if container == "csr":
        return sp.csr_matrix(X if X.dtype != np.float16 else X.astype(np.float32))
    if container == "fortran":
        return np.asfortranarray(X)
    return X


def is_well_posed(X):
    """Inputs every estimator must accept (given enough rows for the cheap settings)."""
    return (
        X.shape[0] >= 6 and X.shape[1] >= 1 and X.dtype.kind in "fiub"
        and np.all(np.abs(X.astype(np.float64)) < 1e4)
    )


# --------------------------------------------------------------------------- estimators


@pytest.mark.parametrize("name", sorted(CHEAP))
@BAD_INPUT
@given(data=matrices(), container=st.sampled_from(CONTAINERS))
def test_random_inputs(name, data, container):
    """Shapes 0..7 x 0..4, numeric dtypes, tiny to huge magnitudes, five containers."""
    X, seed = data
    y = make_y(name, X.shape[0], np.random.default_rng(seed))
    exc = run_estimator(name, wrap(X, container), y)
    if exc is None:
        return
    if container == "csr" and not input_tags(name).sparse:
        check_clear_error(exc, "sparse", "dense")
    elif X.shape[0] < 6 or X.shape[1] == 0:
        check_clear_error(exc, "sample", "feature", "cluster", "class", "neighbor", "n_", *OVERFLOW)
    else:
        check_clear_error(exc, *OVERFLOW, "class", "cluster", "neighbor", "sample")
        if is_well_posed(X) and (container != "csr" or input_tags(name).sparse):
            raise AssertionError(f"well-posed input rejected: {exc}") from exc


@pytest.mark.parametrize("name", sorted(CHEAP))
@BAD_INPUT
@given(
    data=matrices(min_rows=6, min_cols=1),
    bad=st.sampled_from([np.nan, np.inf, -np.inf]),
    where=st.tuples(st.integers(0, 100), st.integers(0, 100)),
    at_predict=st.booleans(),
    container=st.sampled_from(["ndarray", "list", "dataframe"]),
)
def test_nan_and_inf(name, data, bad, where, at_predict, container):
    """A NaN or infinity anywhere, at fit or at predict/transform, is a ValueError naming it,
    except a NaN for estimators whose tags allow missing values: then a finite result."""
    X, seed = data
    X = X.astype(np.float64)
    X_bad = X.copy()
    X_bad[where[0] % X.shape[0], where[1] % X.shape[1]] = bad
    y = make_y(name, X.shape[0], np.random.default_rng(seed))
    assume(run_estimator(name, X, y) is None)  # e.g. mean shift on coinciding points
    if at_predict:
        exc = run_estimator(name, X, y, X_test=wrap(X_bad, container))
    else:
        exc = run_estimator(name, wrap(X_bad, container), y)
    if np.isnan(bad) and input_tags(name).allow_nan:
        assert exc is None, f"missing value rejected: {exc}"
        return
    assert exc is not None, "NaN/inf accepted"
    check_clear_error(exc, "nan", "inf")


@pytest.mark.parametrize("name", sorted(CHEAP))
@BAD_INPUT
@given(data=matrices(min_rows=6, min_cols=1), extra=st.sampled_from([-1, 1, 2]),
       container=st.sampled_from(["ndarray", "list", "dataframe"]))
def test_wrong_n_features_at_predict(name, data, extra, container):
    X, seed = data
    X = X.astype(np.float64)
    d = X.shape[1] + extra
    # d=0 is left out: scikit-learn's validate_data then fails before its n_features check,
    # with "at least one array or dtype is required".
    assume(d >= 1)
    assume(run_estimator(name, X, make_y(name, X.shape[0], np.random.default_rng(seed))) is None)
    X_test = np.random.default_rng(seed).normal(size=(3, max(d, 0)))
    y = make_y(name, X.shape[0], np.random.default_rng(seed))
    exc = run_estimator(name, X, y, X_test=wrap(X_test, container))
    assert exc is not None, f"{d} features accepted by a model fitted on {X.shape[1]}"
    check_clear_error(exc, "feature")


@pytest.mark.parametrize("name", sorted(CHEAP))
def test_dataframe_column_names(name):
    """Column names are recorded; reordered columns at predict are rejected by name."""
    rng = np.random.default_rng(0)
    X = pd.DataFrame(rng.normal(size=(12, 3)), columns=["a", "b", "c"])
    est = make(name).fit(X, make_y(name, 12, rng))
    assert list(est.feature_names_in_) == ["a", "b", "c"]
    for method in OUTPUT_METHODS:
        if hasattr(est, method):
            check_output(getattr(est, method)(X), 12)
            with pytest.raises(ValueError, match="feature names"):
                getattr(est, method)(X[["a", "c", "b"]])


@pytest.mark.parametrize("name", sorted(CHEAP))
@pytest.mark.parametrize("kind", ["strings", "numeric"])
def test_dataframe_categorical_column(name, kind):
    rng = np.random.default_rng(0)
    cats = ["x", "y", "z"] if kind == "strings" else [1.0, 2.0, 3.0]
    X = pd.DataFrame(
        {"a": rng.normal(size=12), "b": pd.Categorical([cats[i % 3] for i in range(12)])}
    )
    exc = run_estimator(name, X, make_y(name, 12, rng))
    if kind == "strings" and not input_tags(name).string:
        assert exc is not None, "string categories accepted"
        check_clear_error(exc, "string", "float", "convert", "numeric")
    else:
        assert exc is None, exc


@pytest.mark.parametrize("name", sorted(CHEAP))
@pytest.mark.parametrize(
    "X",
    [
        np.array([["a", "b"]] * 8, dtype=object),
        np.array([[1.0, None]] * 8, dtype=object),
        np.array([[1 + 2j, 0]] * 8),
        np.array([[i, i % 3] for i in range(8)], dtype=object),
        np.array(["1.0", "2.0", "3.5", "4.0"] * 2, dtype=object)[:, None],
    ],
    ids=["strings", "none", "complex", "object-ints", "object-numeric-strings"],
)
def test_object_and_complex_arrays(name, X):
    exc = run_estimator(name, X, make_y(name, 8, np.random.default_rng(0)))
    if exc is not None:
        check_clear_error(
            exc, "complex", "string", "float", "convert", "nan", "number", "numeric", "dtype"
        )


@pytest.mark.parametrize("name", sorted(CHEAP))
def test_list_and_sample_count_edge_cases(name):
    rng = np.random.default_rng(0)
    for X in ([], [[]], [1.0, 2.0, 3.0], np.zeros((4, 2, 2)), 3.0):
        n = len(X) if isinstance(X, list) else 0
        exc = run_estimator(name, X, make_y(name, n, rng))
        assert exc is not None, f"{X!r} accepted"
        check_clear_error(exc, "sample", "feature", "2d", "array", "dimension")
    for X in ([[1.0]], [[1.0, 2.0]]):  # one sample: a result (checked finite) or a clear error
        exc = run_estimator(name, X, make_y(name, 1, rng))
        if exc is not None:
            check_clear_error(exc, "sample", "cluster", "class", "neighbor")


def _bad_values():
    return st.sampled_from([-1, 0, 1.5, -0.5, "bogus", None, np.nan, np.inf, [1], True])


@pytest.mark.parametrize("name", sorted(CHEAP))
@BAD_INPUT
@given(data=st.data(), value=_bad_values())
def test_wrong_parameter_values(name, data, value):
    """A wrong parameter value is rejected with a message that names the parameter, or the
    estimator still produces a correct result."""
    param = data.draw(st.sampled_from(sorted(ESTIMATORS[name]().get_params())))
    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 3))
    exc = run_estimator(name, X, make_y(name, 12, rng), params={param: value})
    if exc is not None:
        check_clear_error(exc, param)



@pytest.mark.parametrize("name", sorted(CHEAP))
@pytest.mark.parametrize("value", ["bogus", -3, 2.5, None, object(), ["euclidean"]])
def test_tags_of_wrong_parameter_values(name, value):
    """Tags are read before fit validates the parameters (scikit-learn's cross-validation,
    pipelines, meta-estimators): a wrong value leaves them readable and fit names it."""
    for param in ESTIMATORS[name]().get_params():
        get_tags(ESTIMATORS[name](**{param: value}))

@pytest.mark.parametrize("bandwidth", [1e-300, 1e300])
def test_mean_shift_extreme_bandwidth(bandwidth):
    """2 * bandwidth**2 (the attention temperature) under- or overflows: the error names the
    bandwidth, not the engine's temperature."""
    X = np.random.default_rng(0).normal(size=(12, 2))
    est = make("AttentionMeanShift", bandwidth=bandwidth)
    with pytest.raises(ValueError, match="bandwidth"):
        est.fit(X)


# --------------------------------------------------------------------------- attention()


@BAD_INPUT
@given(
    q=matrices(max_rows=5), k=matrices(max_rows=5), v_cols=st.sampled_from([None, 0, 1, 3]),
    temperature=st.sampled_from([1.0, 0, np.inf, 1e-30, -1.0, np.nan, "1", None]),
    n_neighbors=st.sampled_from([None, 0, 1, 2, 10, 1.5]),
    radius=st.sampled_from([None, 0.5, 0.0, -1.0, np.nan]),
    container=st.sampled_from(["ndarray", "list", "tensor", "csr"]),
    on_empty=st.sampled_from(["raise", "zero"]),
)
def test_attention_function(q, k, v_cols, temperature, n_neighbors, radius, container, on_empty):
    (Q, _), (K, seed) = q, k
    rng = np.random.default_rng(seed)
    V = rng.normal(size=K.shape[0]) if v_cols is None else rng.normal(size=(K.shape[0], v_cols))

    def conv(a):
        if container == "tensor":
            return torch.from_numpy(np.ascontiguousarray(a))
        return wrap(a, container) if a.ndim == 2 else (a.tolist() if container == "list" else a)

    try:
        out = attention(conv(Q), conv(K), conv(V), temperature=temperature, n_neighbors=n_neighbors,
                        radius=radius, on_empty=on_empty)
    except Exception as exc:  # noqa: BLE001
        check_clear_error(exc)
        return
    out = out.numpy() if isinstance(out, torch.Tensor) else np.asarray(out)
    assert out.shape == ((Q.shape[0],) if v_cols is None else (Q.shape[0], v_cols))
    assert np.isfinite(out).all()
    # every output is a convex combination of the values (or 0 for an empty query)
    if out.size:
        V2, o2 = V.reshape(V.shape[0], -1), out.reshape(out.shape[0], -1)
        lo, hi = V2.min(0), V2.max(0)
        if on_empty == "zero":
            lo, hi = np.minimum(lo, 0), np.maximum(hi, 0)
        tol = 1e-3 * (1 + np.abs(V2).max())
        assert np.all(o2 <= hi + tol) and np.all(o2 >= lo - tol)

def test_attention_importable():
    assert skattention.attention is attention


@pytest.mark.parametrize("log_t", [-200.0, 200.0])
def test_training_with_a_temperature_outside_float32(log_t):
    """A learned temperature whose exp under- or overflows float32 (0 or inf: the limits without
    a gradient) used to end the backward pass with torch's "element 0 of tensors does not
    require grad"."""
    from skattention._engine import build_map, train_metric

    torch.manual_seed(0)
    X = torch.randn(10, 2)
    values = torch.nn.functional.one_hot(torch.arange(10) % 2).float()
    metric_map = build_map("linear", np.eye(2))
    log_temperature = torch.tensor(log_t, requires_grad=True)
    history, _ = train_metric(
        metric_map, log_temperature, X, values, "log_loss", torch.ones(10), max_iter=2,
        batch_size=5, n_candidates=10, learning_rate=1e-2, weight_decay=0.0,
        n_iter_no_change=10, tol=0.0, generator=torch.Generator().manual_seed(0),
    )
    assert history.n_iter == 2 and np.isfinite(history.loss_curve).all()


def test_training_whose_images_overflow_says_it_diverged():
    """A training step does not check its internal tensors (the map's images) as the public
    attention does; a map whose images overflow float32 gives a non-finite minibatch loss,
    which is a clear ValueError, not NaN parameters or a torch traceback."""
    from skattention._engine import build_map, train_metric

    X = torch.randn(10, 2, generator=torch.Generator().manual_seed(0))
    values = torch.nn.functional.one_hot(torch.arange(10) % 2).float()
    metric_map = build_map("linear", np.eye(2) * 1e30)  # squared distances overflow float32
    with pytest.raises(ValueError, match="Training diverged"):
        train_metric(
            metric_map, torch.tensor(0.0, requires_grad=True), X, values, "log_loss",
            torch.ones(10), max_iter=1, batch_size=5, n_candidates=8, learning_rate=1e-2,
            weight_decay=0.0, n_iter_no_change=10, tol=0.0,
            generator=torch.Generator().manual_seed(0),
        )


@pytest.mark.parametrize(
    "name", ["MetricAttentionClassifier", "MetricAttentionRegressor", "MetricAttentionTransformer"]
)
def test_learned_metric_on_tiny_scale_data(name):
    """Found by the suite: float32 data at scale 1e-31 has a float32 variance of 0, so it was left
    unscaled, its starting temperature underflowed to 0 and training raised torch's
    RuntimeError. The statistics are now float64 and the temperature stays in range."""
    rng = np.random.default_rng(0)
    X = (rng.normal(size=(8, 2)) * 1e-31).astype(np.float32)
    exc = run_estimator(name, X, make_y(name, 8, rng))
    assert exc is None, exc


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kmeans_values_too_large_for_distances(dtype):
    """Found by the suite: at |x| ~ 1e299 the squared distances overflow, and transform
    returned inf."""
    X = np.random.default_rng(0).normal(size=(8, 2)) * (np.finfo(dtype).max ** 0.5)
    X = X.astype(dtype)
    with pytest.raises(ValueError, match="too large"):
        make("AttentionKMeans").fit(X)
    est = make("AttentionKMeans").fit(np.random.default_rng(0).normal(size=(8, 2)).astype(dtype))
    with pytest.raises(ValueError, match="too large"):
        est.transform(X)


@pytest.mark.parametrize(("metric", "learning_rate"), [("mlp", 1e6), ("dot", 100.0)])
def test_training_that_diverges_by_its_learning_rate_says_so(metric, learning_rate):
    """A learning rate far too large sends the map's images out of float32's range by the
    first epoch's validation, whose attention then failed with advice about the data's scale
    ("rescale the data", "raise the temperature") on standard normal data."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 2))
    y = (X[:, 0] > 0).astype(int)
    model = skattention.MetricAttentionClassifier(metric, max_iter=5,
                                                  learning_rate=learning_rate, random_state=0)
    with pytest.raises(ValueError, match="Training diverged.*lower learning_rate"):
        model.fit(X, y)


def test_selection_and_budget_errors_name_only_what_applies():
    """kneighbors' count offered 'or None', which it refuses; dense attention's memory error
    advised 'a smaller n_neighbors' to a call without one."""
    rng = np.random.default_rng(0)
    Q, K, V = rng.normal(size=(5, 3)), rng.normal(size=(50, 3)), rng.normal(size=(50, 2))
    for k in (0, None):
        with pytest.raises(ValueError, match=r"n_neighbors must be a positive integer, got"):
            skattention.kneighbors(Q, K, k)
    with pytest.raises(MemoryError, match=r"raise working_memory") as error:
        attention(Q, K, V, working_memory=1e-6)
    assert "n_neighbors" not in str(error.value)


def test_attention_over_keys_without_features_is_an_error():
    """Keys of 0 features gave every query the values' mean (all distances 0); scikit-learn's
    neighbours refuse 0 features."""
    for fn, args in ((attention, (np.zeros((3, 0)), np.zeros((5, 0)), np.ones((5, 1)))),
                     (skattention.kneighbors, (np.zeros((3, 0)), np.zeros((5, 0)), 2))):
        with pytest.raises(ValueError, match="0 features"):
            fn(*args)
