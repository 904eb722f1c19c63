"""Inputs of the MetricAttention layer's tests."""

import torch

METRICS = ["mlp", "linear", "dot"]


def layer_inputs(n=2, length=4, src=5, e=6, dtype=torch.float64, seed=0, batch_first=True,
                 kdim=None, vdim=None):
    """``(query, key, value)`` of ``n`` sequences (batch first or not), seeded."""
    g = torch.Generator().manual_seed(seed)

    def shape(length, width):
        return (n, length, width) if batch_first else (length, n, width)

    return (
        torch.randn(shape(length, e), generator=g, dtype=dtype),
        torch.randn(shape(src, kdim or e), generator=g, dtype=dtype),
        torch.randn(shape(src, vdim or e), generator=g, dtype=dtype),
    )


# the constructor options of nn.MultiheadAttention beyond the defaults
OPTIONS = [
    {},
    {"kdim": 3},
    {"vdim": 5},
    {"kdim": 3, "vdim": 5, "add_bias_kv": True},
    {"add_zero_attn": True},
    {"kdim": 3, "add_bias_kv": True, "add_zero_attn": True},
]
