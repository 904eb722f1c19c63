"""An estimator's ``device`` reaches every engine call, training included."""

import sys

import pytest
import torch
from sklearn.datasets import make_blobs

import skattention._engine._device as engine_device
from tests.conftest import CHEAP, cheap

X, Y = make_blobs(90, centers=3, n_features=3, random_state=0)
TARGETS = {"MetricAttentionRegressor": X[:, 0]}
SUPERVISED = {
    "MetricAttentionClassifier",
    "MetricAttentionTransformer",
    "AttentionNetworkClassifier",
}


@pytest.fixture
def resolved_devices(monkeypatch):
    """Report CUDA as available, and record every device the engine resolves.

    With CUDA available, a call that forgets the estimator's device resolves ``"auto"`` to CUDA:
    on a GPU machine that is a device mismatch (tensors on the CPU and the GPU in one step),
    here it is recorded (and this CPU build of torch then fails to place tensors there).
    """
    real = engine_device.resolve_device
    seen = []

    def recording(device="auto"):
        resolved = real(device)
        seen.append(resolved)
        return resolved

    for name, module in list(sys.modules.items()):
        if name.startswith("skattention") and getattr(module, "resolve_device", None) is real:
            monkeypatch.setattr(module, "resolve_device", recording)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    return seen


@pytest.mark.parametrize("name", sorted(CHEAP))
def test_cpu_estimator_never_asks_for_cuda(name, resolved_devices):
    est = cheap(name, device="cpu")
    y = Y if name in SUPERVISED else TARGETS.get(name)
    est.fit(X, y)
    for method in ("predict", "predict_proba", "transform", "attention_weights"):
        if hasattr(est, method):
            getattr(est, method)(X[:7])
    assert resolved_devices, "the engine resolved no device"
    assert {d.type for d in resolved_devices} == {"cpu"}


@pytest.mark.parametrize("metric", ["mlp", "dot"])
def test_training_attends_on_the_estimator_device(metric, resolved_devices):
    # early stopping: the validation score's attention calls too
    cheap("MetricAttentionClassifier", metric=metric, early_stopping=True, device="cpu").fit(X, Y)
    assert {d.type for d in resolved_devices} == {"cpu"}


def test_network_classifier_defaults_to_auto_like_every_estimator():
    from skattention.utils import all_estimators

    defaults = {name: cls().get_params()["device"] for name, cls in all_estimators()}
    assert set(defaults.values()) == {"auto"}, defaults
