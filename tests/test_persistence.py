"""Fitted models move between processes and machines: pickles, fresh processes, missing GPUs."""

import pickle
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch
from sklearn.datasets import make_blobs

from skattention import MetricAttentionClassifier
from tests.conftest import cheap

X, y = make_blobs(120, centers=3, n_features=4, random_state=0)


def output(est):
    for method in ("predict_proba", "transform", "predict"):
        if hasattr(est, method):
            return getattr(est, method)(X[:30])
    raise AssertionError(type(est).__name__)


FITTED = [
    cheap(name) for name in ["MetricAttentionClassifier", "AttentionDiffusionEmbedding",
                             "AttentionKMeans", "AttentionMeanShift", "AttentionNetworkClassifier"]
]


@pytest.mark.parametrize("est", FITTED, ids=lambda e: type(e).__name__)
def test_model_configured_for_a_missing_gpu_loads_on_the_cpu_with_a_warning(est, monkeypatch):
    est = est.fit(X, y)
    expected = output(est)
    est.device = "cuda:0"  # as fitted on a GPU machine: fitted state is NumPy / CPU modules
    blob = pickle.dumps(est)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(UserWarning, match=r"device='cuda:0'.*loaded with device='cpu'"):
        restored = pickle.loads(blob)
    assert restored.device == "cpu"
    np.testing.assert_array_equal(output(restored), expected)
    # a CPU model loads silently
    restored.device = "cpu"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pickle.loads(pickle.dumps(restored))


_FIT_AND_DUMP = textwrap.dedent(
    """
    import pickle, sys
    import numpy as np
    import torch
    from sklearn.datasets import make_blobs
    torch.set_num_threads(int(sys.argv[1]))  # float reductions depend on the thread count
    from skattention import MetricAttentionClassifier
    X, y = make_blobs(120, centers=3, n_features=4, random_state=0)
    est = MetricAttentionClassifier(max_iter=5, random_state=0).fit(X, y)
    sys.stdout.buffer.write(pickle.dumps((est, est.predict_proba(X[:30]))))
    """
)


def _run(code, stdin=None):
    # Same torch thread count as this process: bit-identity holds at a given thread count
    # (the order of floating-point reductions depends on it).
    threads = str(torch.get_num_threads())
    out = subprocess.run(
        [sys.executable, "-c", code, threads], input=stdin, capture_output=True, check=True
    )
    return out.stdout


def test_random_state_gives_bit_identical_models_across_processes_and_pickles_load_in_a_fresh_one():
    first_est, first = pickle.loads(_run(_FIT_AND_DUMP))
    second_est, second = pickle.loads(_run(_FIT_AND_DUMP))
    # bit-identical across processes (CPU), and equal to a fit in this process
    np.testing.assert_array_equal(first, second)
    here = MetricAttentionClassifier(max_iter=5, random_state=0).fit(X, y).predict_proba(X[:30])
    np.testing.assert_array_equal(first, here)
    for a, b in zip(first_est.map_.state_dict().values(), second_est.map_.state_dict().values()):
        assert torch.equal(a, b)
    # a pickle made here predicts the same in a fresh interpreter
    loaded = _run(
        "import pickle, sys; est, X = pickle.loads(sys.stdin.buffer.read()); "
        "sys.stdout.buffer.write(pickle.dumps(est.predict_proba(X)))",
        stdin=pickle.dumps((first_est, X[:30])),
    )
    np.testing.assert_array_equal(pickle.loads(loaded), first)


def test_device_cache_is_not_pickled_and_follows_refits():
    """predict keeps the keys, values, log-prior and the map ready per compute device/dtype
    with the fitted keys and the metric strategy: the estimator's __dict__ keeps its names,
    pickles carry none of it, and a refit (new fitted keys and map) is not served from the old
    entries."""
    X, y = make_blobs(n_samples=120, centers=3, random_state=0)
    model = MetricAttentionClassifier(max_iter=3, random_state=0).fit(X, y)
    state = dict(model.__dict__)
    first = model.predict_proba(X[:10])
    assert model.__dict__.keys() == state.keys()
    # the prepared keys, their values and log-prior; the map's inference copy
    assert len(model._keys._ready) == 3 and len(model._strategy._ready) == 1
    loaded = pickle.loads(pickle.dumps(model))
    assert not loaded._keys._ready and not loaded._strategy._ready
    np.testing.assert_array_equal(loaded.predict_proba(X[:10]), first)
    model.fit(X[::-1], y[::-1])
    fresh = MetricAttentionClassifier(max_iter=3, random_state=0).fit(X[::-1], y[::-1])
    np.testing.assert_array_equal(model.predict_proba(X[:10]), fresh.predict_proba(X[:10]))
    assert len(model._keys._ready) == 3
