"""The engine's one parser of ``device`` values, and the one clamp of a log-temperature."""

import math

import pytest
import torch

from skattention._engine import (
    clamp_log_temperature,
    device_available,
    is_auto_device,
    parse_device,
    resolve_device,
)


@pytest.mark.parametrize("device", ["auto", None])
def test_auto_is_cuda_when_available_else_the_cpu(device):
    assert is_auto_device(device)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert parse_device(device).type == expected == resolve_device(device).type


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1", torch.device("cpu")])
def test_parsing_does_not_ask_for_the_device(device):
    assert not is_auto_device(device)
    assert parse_device(device) == torch.device(device)


@pytest.mark.parametrize(("device", "match"), [
    ("gpu", "not a valid device"), (3.5, "not a valid device"), ("meta", "not supported"),
])
def test_values_that_name_no_supported_device(device, match):
    with pytest.raises(ValueError, match=match):
        parse_device(device)
    with pytest.raises(ValueError, match=match):
        resolve_device(device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_missing_accelerator_is_parsed_but_not_available():
    dev = parse_device("cuda:0")
    assert not device_available(dev)
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda:0")
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device(torch.device("cuda"))  # a device object is checked too


def test_a_resolved_cpu_device_passes_through():
    dev = torch.device("cpu")
    assert resolve_device(dev) is dev
    assert device_available(dev)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_clamp_of_a_log_temperature_keeps_its_exp_normal(dtype):
    info = torch.finfo(dtype)
    low, high = 0.5 * math.log(info.tiny), 0.5 * math.log(info.max)
    assert clamp_log_temperature(-1e6, dtype) == low
    assert clamp_log_temperature(1e6, dtype) == high
    assert clamp_log_temperature(0.25, dtype) == 0.25
    t = torch.tensor([-1e6, 0.25, 1e6], dtype=dtype, requires_grad=True)
    clamped = clamp_log_temperature(t)
    assert clamped.tolist() == torch.tensor([low, 0.25, high], dtype=dtype).tolist()
    assert torch.isfinite(torch.exp(clamped)).all() and (torch.exp(clamped) > 0).all()
    clamped.sum().backward()
    assert t.grad.tolist() == [0.0, 1.0, 0.0]
