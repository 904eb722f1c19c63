"""torch's intra-op thread count follows the joblib / threadpoolctl conventions.

torch's CPU kernels run on an OpenMP pool (libgomp) whose size is a per-thread OpenMP setting,
which is what ``threadpoolctl`` sets and what joblib's process backends set through
``OMP_NUM_THREADS`` in their workers. So ``GridSearchCV(n_jobs=2)`` gives each worker
``cpu_count // 2`` torch threads, with no code in skattention; these tests keep it that way.
"""

import threading

import joblib
import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_limits

from skattention import MetricAttentionClassifier
from tests.conftest import cheap


def _torch_threads(estimator=None, X=None, y=None):
    return float(torch.get_num_threads())


def _worker_thread_share(n_jobs):
    # loky workers get cpu_count // n_jobs threads (joblib keeps an OMP_NUM_THREADS the parent
    # already has in their environment, but torch in a worker was seen to use fewer still).
    return max(1, joblib.cpu_count() // n_jobs)


def test_threadpool_limits_sets_torch_threads():
    before = torch.get_num_threads()
    with threadpool_limits(limits=1):
        assert torch.get_num_threads() == 1
        X = np.random.default_rng(0).normal(size=(60, 3))
        y = (X[:, 0] > 0).astype(int)
        clf = MetricAttentionClassifier("euclidean", device="cpu").fit(X, y)
        clf.predict(X)
        assert torch.get_num_threads() == 1  # the estimator does not reset it
    assert torch.get_num_threads() == before


def test_threadpool_limits_openmp_only():
    with threadpool_limits(limits=1, user_api="openmp"):
        assert torch.get_num_threads() == 1


def test_grid_search_loky_workers_split_the_cores():
    from sklearn.model_selection import GridSearchCV

    X = np.random.default_rng(0).normal(size=(60, 3))
    y = (X[:, 0] > 0).astype(int)
    search = GridSearchCV(
        MetricAttentionClassifier("euclidean", device="cpu"), {"temperature": [0.5, 1.0]}, cv=2,
        n_jobs=2, scoring={"acc": "accuracy", "threads": _torch_threads}, refit=False,
    )
    with joblib.parallel_config(backend="loky"):
        search.fit(X, y)
    threads = {search.cv_results_[f"split{i}_test_threads"][j] for i in range(2) for j in range(2)}
    assert len(threads) == 1 and 1 <= threads.pop() <= _worker_thread_share(
        2
    )  # no oversubscription


def test_threads_started_after_set_num_threads_inherit_it():
    # The recipe for joblib's threading backend (docs/scaling.md): threadpoolctl limits only
    # the calling thread, so set torch's process default before the search starts its threads.
    before = torch.get_num_threads()
    seen = {}

    def worker(key):
        seen[key] = torch.get_num_threads()

    try:
        torch.set_num_threads(1)
        t = threading.Thread(target=worker, args=("after",))
        t.start()
        t.join()
    finally:
        torch.set_num_threads(before)
    assert seen["after"] == 1


@pytest.mark.skipif(joblib.cpu_count() < 2, reason="needs 2 cores to tell the limits apart")
def test_threadpool_limits_do_not_reach_new_threads():
    # Documented limitation: OpenMP thread counts are per thread.
    seen = {}

    def worker():
        seen["thread"] = torch.get_num_threads()

    with threadpool_limits(limits=1):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
    assert seen["thread"] == torch.get_num_threads()


def test_concurrent_sdpa_leaves_backends_enabled():
    # torch's sdpa_kernel() flags are process-wide; without the engine's lock, two threads in the
    # SDPA path could leave the math kernel disabled, and skattention.nn (and any user code) would
    # then fail with "No available kernel" (seen in CI after a threading-backend grid search).
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from skattention import attention
    from skattention.nn import MetricAttention

    rng = np.random.default_rng(0)
    keys, values = rng.normal(size=(300, 5)), rng.normal(size=(300, 3))

    def run(seed):
        q = np.random.default_rng(seed).normal(size=(64, 5))
        return attention(q, keys, values, temperature=1.0, backend="sdpa", device="cpu")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(run, range(200)))
    assert torch.backends.cuda.math_sdp_enabled()
    assert torch.backends.cuda.flash_sdp_enabled()
    assert torch.backends.cuda.mem_efficient_sdp_enabled()
    # the metric layer's augmented queries are wider than its values: only the math kernel runs it
    layer = MetricAttention(6, 1, batch_first=True)
    x = torch.randn(2, 7, 6)
    out, _ = layer(x, x, x, need_weights=False)
    assert out.shape == (2, 7, 6)


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_concurrent_seeded_fits_are_reproducible(dropout):
    # torch's global RNG (module initialisation, dropout) is process-wide: fits running in threads
    # at once (joblib's threading backend) must not draw from each other's seeded stream, nor
    # leave the caller's RNG state changed.
    from concurrent.futures import ThreadPoolExecutor

    from sklearn.datasets import make_classification

    X, y = make_classification(200, 6, random_state=0)
    models = [
        cheap("MetricAttentionClassifier", max_iter=3, dropout=dropout, device="cpu"),
        cheap("AttentionNetworkClassifier", max_iter=3, device="cpu"),
    ]

    def fit(model):
        return model.__class__(**model.get_params()).fit(X, y).predict_proba(X)

    torch.manual_seed(123)
    state = torch.get_rng_state()
    # the reference is fitted in a worker thread too, so that torch's thread count is the same
    with ThreadPoolExecutor(1) as pool:
        reference = list(pool.map(fit, models))
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(fit, models * 4))
    for i, proba in enumerate(results):
        np.testing.assert_array_equal(proba, reference[i % 2])
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("n_jobs, limit, expected", [
    (1, 2, 1), (-1, 2, 2), (-2, 2, 1),
    # a negative n_jobs counts from the threads the caller allows, as scikit-learn's OpenMP
    # loops do (it took every core: a grid search's workers each on every core)
    (-1, 1, 1),
    # more threads than CPUs are the CPUs (64 threads on 2 cores waited for each other)
    (64, 1, None),
])
def test_n_jobs_sets_the_engine_threads_for_the_call(monkeypatch, n_jobs, limit, expected):
    import skattention.neighbors._keys as keys
    import skattention.neighbors._temperature as temperature

    seen = []

    def recording(engine_function):
        def call(*args, **kwargs):
            seen.append(torch.get_num_threads())
            return engine_function(*args, **kwargs)
        return call

    monkeypatch.setattr(temperature, "attention", recording(temperature.attention))
    monkeypatch.setattr(keys, "attention", recording(keys.attention))
    monkeypatch.setattr(keys, "kneighbors", recording(keys.kneighbors))
    X = np.random.default_rng(0).normal(size=(60, 3))
    y = (X[:, 0] > 0).astype(int)
    expected = joblib.cpu_count() if expected is None else expected
    with threadpool_limits(limits=limit, user_api="openmp"):
        before = torch.get_num_threads()
        clf = MetricAttentionClassifier("euclidean", n_neighbors=3, n_jobs=n_jobs).fit(X, y)
        clf.predict(X)
        clf.kneighbors(X[:5])
        assert torch.get_num_threads() == before  # restored after each call
    assert len(seen) >= 3 and set(seen) == {expected}


def _recording(seen, function):
    def call(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return function(*args, **kwargs)
    return call


@pytest.mark.parametrize("batch_size, expected", [(64, 1), (2048, 2)])
def test_network_training_of_small_steps_runs_on_one_thread(monkeypatch, batch_size, expected):
    # a small step's kernels are too short for a parallel region to pay (and each waited for a
    # descheduled thread on a busy machine); a large step keeps the caller's threads
    from skattention.nn import AttentionNetworkClassifier
    from skattention.nn._ipn import IPN

    seen = []
    monkeypatch.setattr(IPN, "forward", _recording(seen, IPN.forward))
    X = np.random.default_rng(0).normal(size=(2048, 4))
    y = (X[:, 0] > 0).astype(int)
    with threadpool_limits(limits=2, user_api="openmp"):
        AttentionNetworkClassifier(max_iter=1, batch_size=batch_size, width=8, random_state=0,
                                   device="cpu").fit(X, y)
        assert torch.get_num_threads() == 2  # restored
    assert seen and set(seen) == {expected}


def test_kmeans_of_small_steps_runs_on_one_thread(monkeypatch):
    import skattention._engine._anneal as anneal
    import skattention._engine._cluster as cluster
    from skattention import AttentionKMeans

    seen = []
    monkeypatch.setattr(cluster, "kmeans_step", _recording(seen, cluster.kmeans_step))
    monkeypatch.setattr(anneal, "kmeans_step", cluster.kmeans_step)
    X = np.random.default_rng(0).normal(size=(500, 3))
    with threadpool_limits(limits=2, user_api="openmp"):
        AttentionKMeans(3, random_state=0, device="cpu").fit(X)  # annealing, then Lloyd
        assert torch.get_num_threads() == 2
    assert len(seen) > 2 and set(seen) == {1}
