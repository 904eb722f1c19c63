"""Determinism: the ``non_deterministic`` tag and the CUDA-deterministic code paths
(docs/scaling.md)."""

import numpy as np
import pytest
import torch

from skattention import AttentionKMeans, MetricAttentionClassifier
from skattention._engine._kernels import _histc
from skattention.utils._device import _cuda_nondeterministic


@pytest.fixture
def deterministic_algorithms():
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


def test_cpu_is_deterministic(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not _cuda_nondeterministic("cpu")
    assert _cuda_nondeterministic("cuda") and _cuda_nondeterministic("cuda:0")
    assert _cuda_nondeterministic("auto")  # resolves to the GPU
    assert not MetricAttentionClassifier(device="cpu").__sklearn_tags__().non_deterministic
    assert MetricAttentionClassifier(device="cuda").__sklearn_tags__().non_deterministic
    # a fixed metric runs forward kernels only, which repeat exactly on a GPU too
    assert (
        not MetricAttentionClassifier("euclidean", device="cuda")
        .__sklearn_tags__()
        .non_deterministic
    )
    assert AttentionKMeans(device="cuda").__sklearn_tags__().non_deterministic
    assert not AttentionKMeans(device="cpu").__sklearn_tags__().non_deterministic


def test_no_gpu_means_deterministic(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not _cuda_nondeterministic("auto")
    assert not MetricAttentionClassifier().__sklearn_tags__().non_deterministic


def test_deterministic_algorithms_clear_the_tag(monkeypatch, deterministic_algorithms):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not _cuda_nondeterministic("cuda")
    assert not MetricAttentionClassifier(device="cuda").__sklearn_tags__().non_deterministic


def test_bincount_histogram_matches_histc():
    x = torch.from_numpy(np.random.default_rng(0).normal(size=10_000))
    lo, hi = float(x.min()), float(x.max())
    np.testing.assert_array_equal(_histc(x, 64, lo, hi, deterministic=True).numpy(),
                                  _histc(x, 64, lo, hi, deterministic=False).numpy())
    assert float(_histc(x, 64, lo, hi, deterministic=True).sum()) == x.numel()


def test_cpu_estimators_run_under_deterministic_algorithms(deterministic_algorithms):
    from skattention import AttentionDiffusionEmbedding

    X = np.random.default_rng(0).normal(size=(80, 3))
    y = (X[:, 0] > 0).astype(int)
    MetricAttentionClassifier("linear", max_iter=2, random_state=0, device="cpu").fit(X, y).predict(
        X
    )
    AttentionKMeans(n_clusters=2, random_state=0, device="cpu").fit(X)
    AttentionDiffusionEmbedding(n_components=2, device="cpu").fit(X)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_estimators_repeat_under_deterministic_algorithms(
    deterministic_algorithms, monkeypatch
):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    from skattention import AttentionDiffusionEmbedding

    X = np.random.default_rng(0).normal(size=(500, 5))
    y = (X[:, 0] > 0).astype(int)

    def run():
        clf = MetricAttentionClassifier("mlp", max_iter=5, random_state=0, device="cuda").fit(X, y)
        km = AttentionKMeans(n_clusters=4, random_state=0, device="cuda").fit(X)
        emb = AttentionDiffusionEmbedding(n_components=2, device="cuda").fit_transform(X)
        return clf.predict_proba(X), km.cluster_centers_, emb

    for a, b in zip(run(), run()):
        np.testing.assert_array_equal(a, b)
