"""Attention priors: T5's buckets, ALiBi's slopes, masks and biases as one additive log-prior."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from skattention import attention
from skattention.nn import (
    ALiBi,
    AttentionPrior,
    CausalMask,
    KeyPaddingMask,
    MetricAttention,
    PriorSum,
    RelativePositionBias,
    alibi_slopes,
    relative_position_bucket,
)

METRICS = ["mlp", "linear", "dot"]


def _t5_bucket(relative_position, bidirectional, num_buckets, max_distance):
    """T5's bucket of one relative position, transcribed from Mesh TensorFlow's
    ``_relative_position_bucket`` (which takes ``n = query - key``), in NumPy float32 scalars."""
    n = -int(relative_position)
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        bucket += num_buckets if n < 0 else 0
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return bucket + n
    f32 = np.float32
    scaled = (
        np.log(f32(n) / f32(max_exact))
        / f32(math.log(max_distance / max_exact))
        * f32(num_buckets - max_exact)
    )
    return bucket + min(max_exact + int(scaled), num_buckets - 1)


def _alibi_slopes(n):
    """The slopes of ALiBi's reference code (ofirpress/attention_with_linear_biases)."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + _alibi_slopes(2 * closest)[0::2][: n - closest]


def _inputs(n=2, length=5, src=7, e=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(n, length, e, generator=g, dtype=dtype),
        torch.randn(n, src, e, generator=g, dtype=dtype),
        torch.randn(n, src, e, generator=g, dtype=dtype),
    )


def _random_bias(num_heads=2, seed=1, **kwargs):
    bias = RelativePositionBias(num_heads, **kwargs)
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        bias.weight.copy_(torch.randn(bias.weight.shape, generator=g))
    return bias


def _buckets(query_length, key_length, num_buckets=8, max_distance=16):
    relative = torch.arange(key_length)[None, :] - torch.arange(query_length)[:, None]
    return relative_position_bucket(relative, True, num_buckets, max_distance)


# ------------------------------------------------------------------ T5's buckets


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(
    "num_buckets, max_distance", [(32, 128), (8, 16), (4, 5), (64, 1000), (33, 77), (10, 100)]
)
def test_relative_position_bucket_is_t5s(bidirectional, num_buckets, max_distance):
    if not bidirectional and num_buckets == 4:
        num_buckets = 2
    positions = torch.arange(-3 * max_distance - 5, 3 * max_distance + 6)
    got = relative_position_bucket(positions, bidirectional, num_buckets, max_distance)
    expected = [_t5_bucket(p, bidirectional, num_buckets, max_distance) for p in positions.tolist()]
    assert got.dtype == torch.int64 and got.shape == positions.shape
    assert got.tolist() == expected
    assert int(got.min()) >= 0 and int(got.max()) < num_buckets


def test_relative_position_bucket_edge_cases():
    # defaults (T5): 16 buckets per side, 8 exact, logarithmic up to 128
    bucket = relative_position_bucket
    assert bucket(torch.tensor(0)).item() == 0
    assert bucket(torch.arange(-7, 0)).tolist() == [7, 6, 5, 4, 3, 2, 1]  # exact, keys before
    assert bucket(torch.arange(1, 8)).tolist() == list(range(17, 24))  # exact, keys after
    assert bucket(torch.tensor([-8, 8])).tolist() == [8, 24]  # the first logarithmic bucket
    assert bucket(torch.tensor([-127, -128, -129, -10**6])).tolist() == [15, 15, 15, 15]
    assert bucket(torch.tensor([127, 128, 10**6])).tolist() == [31, 31, 31]
    # the logarithmic buckets widen and never go back
    far = bucket(-torch.arange(8, 200))
    assert torch.all(far.diff() >= 0) and far.unique().numel() == 8
    # unidirectional: every later key shares the query's bucket; 32 buckets on one side
    assert bucket(torch.tensor([1, 5, 500]), bidirectional=False).tolist() == [0, 0, 0]
    assert bucket(torch.arange(-15, 1), bidirectional=False).tolist() == list(range(15, -1, -1))
    assert bucket(torch.tensor([-128, -10**6]), bidirectional=False).tolist() == [31, 31]
    # any shape, array-likes, int32
    grid = bucket(torch.arange(4)[None, :] - torch.arange(3)[:, None])
    assert grid.shape == (3, 4) and grid[1, 0] == 1 and grid[0, 1] == 17
    assert bucket(np.array([-3, 3], dtype=np.int32)).tolist() == [3, 19]


def test_relative_position_bucket_bad_input():
    with pytest.raises(TypeError, match="integer"):
        relative_position_bucket(torch.tensor([0.5]))
    with pytest.raises(TypeError, match="integer"):
        relative_position_bucket(torch.tensor([True]))
    with pytest.raises(ValueError, match="at least 4"):
        relative_position_bucket(torch.tensor([1]), num_buckets=3)
    with pytest.raises(ValueError, match="at least 2"):
        relative_position_bucket(torch.tensor([1]), bidirectional=False, num_buckets=1)
    with pytest.raises(ValueError, match="max_distance"):
        relative_position_bucket(torch.tensor([1]), num_buckets=32, max_distance=8)
    with pytest.raises(TypeError, match="num_buckets"):
        relative_position_bucket(torch.tensor([1]), num_buckets=32.0)


# ------------------------------------------------------------------ ALiBi's slopes


@pytest.mark.parametrize("num_heads", range(1, 34))
def test_alibi_slopes_are_the_papers(num_heads):
    assert alibi_slopes(num_heads) == pytest.approx(_alibi_slopes(num_heads), rel=1e-15)


def test_alibi_slopes_values():
    assert alibi_slopes(8) == [2.0**-k for k in range(1, 9)]
    assert alibi_slopes(6) == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]
    with pytest.raises(ValueError, match="num_heads"):
        alibi_slopes(0)


def test_alibi_table_and_causal_form():
    alibi = ALiBi(3, dtype=torch.float64)
    table = alibi(4, 6)
    slopes = torch.tensor(alibi_slopes(3), dtype=torch.float64)
    for h in range(3):
        for i in range(4):
            for j in range(6):
                assert table[h, i, j] == -slopes[h] * abs(j - i)
    assert not table.requires_grad and not list(alibi.parameters())
    # + CausalMask: the paper's m (j - i) on keys j <= i, masked after
    causal = (alibi + CausalMask(dtype=torch.float64))(4, 6)
    i, j = torch.arange(4)[:, None], torch.arange(6)[None, :]
    expected = torch.where(j <= i, slopes[:, None, None] * (j - i), -math.inf)
    torch.testing.assert_close(causal, expected, rtol=0, atol=0)


# ------------------------------------------------------------------ the priors' tables


def test_relative_position_bias_is_the_table_of_its_buckets():
    bias = _random_bias(3, num_buckets=10, max_distance=20)
    table = bias(6, 9)
    assert table.shape == (3, 6, 9)
    for i in range(6):
        for j in range(9):
            b = _t5_bucket(j - i, True, 10, 20)
            torch.testing.assert_close(table[:, i, j], bias.weight[b], rtol=0, atol=0)
    causal = _random_bias(2, num_buckets=8, max_distance=16, bidirectional=False)
    table = causal(3, 5)
    torch.testing.assert_close(table[:, 0, 1:], causal.weight[0][:, None].expand(2, 4))
    # zero at the start: the uniform prior
    assert not RelativePositionBias(2)(4, 4).any()
    with pytest.raises(ValueError, match="num_heads"):
        RelativePositionBias(0)
    with pytest.raises(ValueError, match="query_length"):
        bias(-1, 3)


def test_causal_mask_is_is_causal():
    expected = torch.zeros(4, 6).masked_fill(torch.ones(4, 6, dtype=torch.bool).triu(1), -math.inf)
    torch.testing.assert_close(CausalMask()(4, 6), expected[None], rtol=0, atol=0)
    assert torch.equal(
        torch.isneginf(CausalMask()(5, 5)[0]),
        nn.Transformer.generate_square_subsequent_mask(5).isneginf(),
    )


def test_key_padding_mask_and_sums():
    kpm = torch.tensor([[False, False, False, True], [False, True, True, True]])
    padding = KeyPaddingMask(kpm)
    table = padding(3, 4)
    assert table.shape == (2, 1, 3, 4)
    assert torch.equal(torch.isneginf(table[:, 0]), kpm[:, None, :].expand(2, 3, 4))
    bias = _random_bias(2, num_buckets=8, max_distance=16)
    total = bias + CausalMask() + padding
    assert isinstance(total, PriorSum) and len(total.priors) == 3 and total.num_heads == 2
    got = total(3, 4)
    expected = bias(3, 4)[None] + CausalMask()(3, 4)[None] + table
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # the learned table is still a parameter of the sum
    assert [p is bias.weight for p in total.parameters()] == [True]
    with pytest.raises(ValueError, match="different numbers of heads"):
        _ = bias + ALiBi(3)
    with pytest.raises(TypeError):
        _ = bias + 1.0
    with pytest.raises(ValueError, match="beyond"):
        padding(3, 5)
    with pytest.raises(ValueError, match="bool"):
        KeyPaddingMask(torch.zeros(2, 4))
    with pytest.raises(NotImplementedError):
        AttentionPrior()(2, 2)


def test_to_attn_mask_is_the_layout_of_multihead_attention():
    bias = _random_bias(2, num_buckets=8, max_distance=16)
    mask = bias.to_attn_mask(4, 5, batch_size=3)
    torch.testing.assert_close(mask, bias(4, 5).repeat(3, 1, 1), rtol=0, atol=0)
    padding = KeyPaddingMask(torch.tensor([[False] * 5, [False] * 3 + [True] * 2]))
    mask = (CausalMask() + padding).to_attn_mask(4, 5, batch_size=2, num_heads=3)
    assert mask.shape == (6, 4, 5)
    assert torch.isneginf(mask[3:, :, 3:]).all() and not torch.isneginf(mask[:3, 3, :4]).any()
    with pytest.raises(ValueError, match="cannot mask"):
        bias.to_attn_mask(4, 5, batch_size=1, num_heads=4)


# ------------------------------------------------------------------ in the layer


@pytest.mark.parametrize("metric", METRICS)
def test_prior_in_the_layer_is_its_table_as_attn_mask(metric):
    """``prior=`` adds the table; the same table, repeated over the batch, is an ``attn_mask``."""
    q, k, v = _inputs()
    bias = _random_bias(2, num_buckets=8, max_distance=16).double()
    plain = MetricAttention(8, 2, metric, batch_first=True, dtype=torch.float64)
    layer = MetricAttention(8, 2, metric, batch_first=True, dtype=torch.float64, prior=bias)
    layer.load_state_dict(plain.state_dict(), strict=False)
    mask = bias.to_attn_mask(5, 7, batch_size=2)
    for need_weights in (True, False):
        expected = plain(q, k, v, attn_mask=mask, need_weights=need_weights)
        got = layer(q, k, v, need_weights=need_weights)
        torch.testing.assert_close(got[0], expected[0], rtol=0, atol=1e-12)
    out, w = layer(q, k, v, average_attn_weights=False)
    # the weights are softmax(scores + table): the prior's log-odds show up in them
    _, w0 = plain(q, k, v, average_attn_weights=False)
    expected = torch.softmax(torch.log(w0) + bias(5, 7)[None], -1)
    torch.testing.assert_close(w, expected)


def test_prior_table_equals_multihead_attention_mask():
    """A T5 bias as the float attn_mask of nn.MultiheadAttention and of MetricAttention("dot")."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64)
    bias = _random_bias(2, num_buckets=8, max_distance=16).double()
    layer = MetricAttention(8, 2, "dot", batch_first=True, dtype=torch.float64, prior=bias)
    layer.load_state_dict(mha.state_dict(), strict=False)
    q, k, v = _inputs()
    mask = bias.to_attn_mask(5, 7, batch_size=2)
    for need_weights in (True, False):
        expected = mha(q, k, v, attn_mask=mask, need_weights=need_weights)
        got = layer(q, k, v, need_weights=need_weights)
        torch.testing.assert_close(got[0], expected[0], rtol=0, atol=1e-10)


def _priors():
    kpm = torch.tensor([[False] * 7, [False] * 5 + [True] * 2])
    return {
        "t5": _random_bias(2, num_buckets=8, max_distance=16),
        "t5-causal": _random_bias(2, num_buckets=8, max_distance=16, bidirectional=False)
        + CausalMask(),
        "alibi": ALiBi(2),
        "alibi-causal": ALiBi(2) + CausalMask(),
        "causal": CausalMask(),
        "padding": KeyPaddingMask(kpm),
        "all": _random_bias(2, num_buckets=8, max_distance=16) + ALiBi(2) + KeyPaddingMask(kpm),
    }


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("name", list(_priors()))
def test_fused_and_explicit_paths_agree_under_every_prior(metric, name):
    prior = _priors()[name]
    layer = MetricAttention(8, 2, metric, batch_first=True, dtype=torch.float64, prior=prior)
    q, k, v = _inputs()
    explicit, w = layer(q, k, v, need_weights=True, average_attn_weights=False)
    fused, _ = layer(q, k, v, need_weights=False)
    torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-12)
    # masked entries get weight 0; a masked prior is a mask
    assert torch.all(w[torch.isneginf(prior(5, 7)).expand_as(w)] == 0)


@pytest.mark.parametrize("metric", METRICS)
def test_causal_prior_is_is_causal(metric):
    q, _, _ = _inputs(src=5)
    plain = MetricAttention(8, 2, metric, batch_first=True, dtype=torch.float64)
    layer = MetricAttention(8, 2, metric, batch_first=True, dtype=torch.float64,
                            prior=CausalMask())
    layer.load_state_dict(plain.state_dict())
    for need_weights in (True, False):
        expected, _ = plain(q, q, q, is_causal=True, need_weights=need_weights)
        got, _ = layer(q, q, q, need_weights=need_weights)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("need_weights", [True, False])
def test_gradients_reach_the_table(need_weights):
    bias = RelativePositionBias(2, num_buckets=8, max_distance=16)  # float32 in a float64 layer
    layer = MetricAttention(8, 2, "mlp", batch_first=True, dtype=torch.float64, prior=bias)
    assert any(p is bias.weight for p in layer.parameters())
    q, k, v = _inputs()
    out, _ = layer(q, k, v, need_weights=need_weights)
    (out**2).sum().backward()
    grad = bias.weight.grad
    assert grad is not None and grad.dtype == torch.float32 and grad.abs().sum() > 0
    # buckets no relative position of a 5 x 7 table reaches get no gradient
    used = _buckets(5, 7)
    unused = sorted(set(range(8)) - set(used.unique().tolist()))
    assert unused and torch.all(grad[unused] == 0)
    assert torch.all(grad[used.unique()].abs().sum(1) > 0)


@pytest.mark.parametrize("need_weights", [True, False])
def test_gradcheck_through_the_table(need_weights):
    bias = _random_bias(2, num_buckets=8, max_distance=16).double()
    layer = MetricAttention(4, 2, "mlp", batch_first=True, dtype=torch.float64, prior=bias)
    q, k, v = _inputs(length=3, src=4, e=4)

    def output(weight):
        args, kwargs = (q, k, v), {"need_weights": need_weights}
        return torch.func.functional_call(layer, {"prior.weight": weight}, args, kwargs)[0]

    assert torch.autograd.gradcheck(output, (bias.weight.detach().clone().requires_grad_(True),))


def test_bad_priors_in_the_layer():
    with pytest.raises(TypeError, match="AttentionPrior"):
        MetricAttention(8, 2, prior=torch.zeros(5, 5))
    with pytest.raises(ValueError, match="heads"):
        MetricAttention(8, 2, prior=ALiBi(4))
    layer = MetricAttention(8, 2, batch_first=True, prior=KeyPaddingMask(torch.zeros(3, 7).bool()))
    q, k, v = (t.float() for t in _inputs())
    with pytest.raises(ValueError, match="batch of 3"):
        layer(q, k, v)


# ------------------------------------------------------------------ in the engine


@pytest.mark.parametrize("name", ["t5", "t5-causal", "alibi-causal", "all"])
def test_prior_as_the_engines_callable_log_prior(name):
    """One head of a prior, evaluated block by block by the engine, equals its table."""
    prior = _priors()[name].double()
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(5, 3, generator=g, dtype=torch.float64), torch.randn(7, 3, generator=g,
                                                                              dtype=torch.float64)
    v = torch.randn(7, 2, generator=g, dtype=torch.float64)
    table = prior(5, 7)
    for head in range(2):
        rows = table[1, head] if table.dim() == 4 else table[min(head, table.shape[0] - 1)]
        expected = torch.softmax(-torch.cdist(q, k) ** 2 / 1.5 + rows, -1) @ v
        got = attention(q, k, v, temperature=1.5, log_prior=prior.as_log_prior(head, batch=1),
                        working_memory=1e-3)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_gradients_reach_the_table_through_the_engine():
    bias = _random_bias(2, num_buckets=8, max_distance=16).double()
    g = torch.Generator().manual_seed(5)
    # the engine records a graph when its tensor inputs (here the queries) require grad; a
    # learned callable prior alone does not switch it on
    q = torch.randn(5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = torch.randn(7, 3, generator=g, dtype=torch.float64), torch.randn(7, generator=g,
                                                                            dtype=torch.float64)
    attention(q, k, v, log_prior=bias.as_log_prior(head=1)).sum().backward()
    table = bias.weight.detach().clone().requires_grad_(True)
    s = -torch.cdist(q.detach(), k) ** 2 + table[_buckets(5, 7)][..., 1]
    (torch.softmax(s, -1) @ v).sum().backward()
    torch.testing.assert_close(bias.weight.grad, table.grad)
    assert bias.weight.grad[:, 1].abs().sum() > 0 and torch.all(bias.weight.grad[:, 0] == 0)


@pytest.mark.parametrize("metric", METRICS)
def test_priors_keep_the_fused_kernel(metric):
    """Every prior reaches SDPA as one float mask, which the CPU's fused (flash) kernel takes
    (for the squared-distance metrics too: their augmented coordinates are padded to the values'
    width); only a mask that needs a gradient (a learned prior, in training) sends SDPA to its
    math kernel, which differentiates the mask."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (t.float() for t in _inputs())
    for name, prior in {"none": None, **_priors()}.items():
        layer = MetricAttention(8, 2, metric, batch_first=True, prior=prior)
        expected, _ = layer(q, k, v, need_weights=True)
        learned = prior is not None and any(p.requires_grad for p in prior.parameters())
        for grad in [False] if learned else [False, True]:
            with torch.set_grad_enabled(grad), sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                fused, _ = layer(q, k, v, need_weights=False)  # no fallback to the math kernel
            torch.testing.assert_close(fused, expected, msg=name)
        if learned:
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), pytest.raises(RuntimeError):
                layer(q, k, v, need_weights=False)
