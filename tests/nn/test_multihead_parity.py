"""MetricAttention where nn.MultiheadAttention runs: its calls, masks and shapes, the dot
product's parity with it, and inside torch's Transformer layers."""

import copy

import pytest
import torch
from torch import nn

from skattention.nn import MetricAttention

from .layer_inputs import METRICS, OPTIONS
from .layer_inputs import layer_inputs as _inputs

pytestmark = pytest.mark.usefixtures("one_thread")


def _call_variants(n=2, length=4, src=5, heads=3):
    """Keyword arguments of calls nn.MultiheadAttention accepts: masks of every kind and shape,
    is_causal with its mask, need_weights and average_attn_weights."""
    g = torch.Generator().manual_seed(5)
    bool_mask = torch.zeros(length, src, dtype=torch.bool)
    bool_mask[0, :2] = True
    float_mask = torch.randn(n * heads, length, src, generator=g, dtype=torch.float64)
    kpm = torch.zeros(n, src, dtype=torch.bool)
    kpm[-1, -2:] = True
    causal = torch.ones(length, src, dtype=torch.bool).triu(1)
    masks = [
        {},
        {"attn_mask": bool_mask},
        {"attn_mask": float_mask},
        {"key_padding_mask": kpm},
        {"attn_mask": bool_mask, "key_padding_mask": kpm},
        {"attn_mask": causal, "is_causal": True},
    ]
    for mask in masks:
        for need_weights in [True, False]:
            for average in [True, False]:
                yield {**mask, "need_weights": need_weights, "average_attn_weights": average}


def _unbatched(kwargs, batch_first):
    """The first batch element's masks, for unbatched inputs."""
    out = dict(kwargs)
    if "key_padding_mask" in out:
        out["key_padding_mask"] = out["key_padding_mask"][0]
    if "attn_mask" in out and out["attn_mask"].dim() == 3:
        out["attn_mask"] = out["attn_mask"][:3]  # (num_heads, L, S)
    return out


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("kdim", [None, 3])
@pytest.mark.parametrize("vdim", [None, 5])
@pytest.mark.parametrize("add_bias_kv", [False, True])
@pytest.mark.parametrize("add_zero_attn", [False, True])
def test_runs_where_multihead_attention_runs_with_its_shapes(
    metric, batch_first, kdim, vdim, add_bias_kv, add_zero_attn
):
    options = {"kdim": kdim, "vdim": vdim, "add_bias_kv": add_bias_kv,
               "add_zero_attn": add_zero_attn, "batch_first": batch_first,
               "dtype": torch.float64}
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(6, 3, **options)
    layer = MetricAttention(6, 3, metric, **options)
    assert (layer.kdim, layer.vdim, layer.add_zero_attn) == (mha.kdim, mha.vdim, add_zero_attn)
    assert (layer.bias_k is None) == (mha.bias_k is None)
    q, k, v = _inputs(batch_first=batch_first, kdim=kdim, vdim=vdim)
    unbatched = tuple(t[0] if batch_first else t[:, 0] for t in (q, k, v))
    for kwargs in _call_variants():
        for inputs, call in [((q, k, v), kwargs), (unbatched, _unbatched(kwargs, batch_first))]:
            expected = mha(*inputs, **call)
            got = layer(*inputs, **call)
            assert got[0].shape == expected[0].shape, call
            assert (got[1] is None) == (expected[1] is None), call
            if got[1] is not None:
                assert got[1].shape == expected[1].shape, call
                assert torch.isfinite(got[1]).all() and torch.isfinite(got[0]).all()
    out, w = layer(q, k, v)
    extra = add_bias_kv + add_zero_attn
    assert w.shape == (2, 4, 5 + extra)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, dtype=torch.float64))
    out.sum().backward()
    assert all(p.grad is not None for p in layer.parameters())


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("options", OPTIONS)
def test_dot_equals_multihead_attention(batch_first, options):
    """With copied weights, every option, every kind of mask, batched or not."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(6, 3, batch_first=batch_first, dtype=torch.float64, **options)
    layer = MetricAttention(6, 3, "dot", batch_first=batch_first, dtype=torch.float64, **options)
    with torch.no_grad():
        for p in mha.parameters():  # non-zero biases too
            p.add_(0.1 * torch.randn_like(p))
    layer.load_state_dict(mha.state_dict())
    assert set(layer.state_dict()) == set(mha.state_dict())
    q, k, v = _inputs(batch_first=batch_first, kdim=options.get("kdim"), vdim=options.get("vdim"))
    unbatched = tuple(t[0] if batch_first else t[:, 0] for t in (q, k, v))
    appended_keys = options.get("add_bias_kv", False) or options.get("add_zero_attn", False)
    for kwargs in _call_variants():
        for inputs, call in [((q, k, v), kwargs), (unbatched, _unbatched(kwargs, batch_first))]:
            reference = call
            if call.get("is_causal") and appended_keys and not call["need_weights"]:
                # torch's two paths differ here: its fused one drops the mask for SDPA's own
                # causal mask over S + 1 keys, which hides the appended key from every query;
                # its explicit one uses the mask as given, padded with zeros (as documented).
                # MetricAttention does the latter on both paths.
                reference = {**call, "need_weights": True}
            expected = mha(*inputs, **reference)
            got = layer(*inputs, **call)
            torch.testing.assert_close(got[0], expected[0], rtol=0, atol=1e-10)
            if call["need_weights"]:
                torch.testing.assert_close(got[1], expected[1], rtol=0, atol=1e-10)


def _transformer_inputs(batch_first, requires_grad=False):
    g = torch.Generator().manual_seed(4)
    tgt = torch.randn(3, 5, 8, generator=g, dtype=torch.float64)
    memory = torch.randn(3, 6, 8, generator=g, dtype=torch.float64)
    if not batch_first:
        tgt, memory = tgt.transpose(0, 1).contiguous(), memory.transpose(0, 1).contiguous()
    tgt_kpm = torch.zeros(3, 5, dtype=torch.bool)
    tgt_kpm[1, 4] = True
    tgt_kpm[2, 2] = True  # a hole in the middle: query 2 of sequence 2 still sees keys 0 and 1
    memory_kpm = torch.zeros(3, 6, dtype=torch.bool)
    memory_kpm[1, 3:] = True
    memory_mask = torch.zeros(5, 6, dtype=torch.bool)
    memory_mask[0, 0] = True
    masks = {
        "tgt_mask": torch.ones(5, 5, dtype=torch.bool).triu(1),
        "tgt_is_causal": True,
        "memory_mask": memory_mask,
        "tgt_key_padding_mask": tgt_kpm,
        "memory_key_padding_mask": memory_kpm,
    }
    return tgt.requires_grad_(requires_grad), memory.requires_grad_(requires_grad), masks


def _forward_backward(module, inputs, kwargs):
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    out = module(*inputs, **kwargs)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)).sum().backward()
    grads = {name: p.grad for name, p in module.named_parameters()}
    return out, [t.grad for t in inputs], grads


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_dot_is_a_drop_in_inside_transformer_layers(kind, batch_first):
    """Every attention of the layer replaced by MetricAttention("dot") with the same weights:
    same outputs and same gradients, masks included."""
    torch.manual_seed(0)
    options = {"dim_feedforward": 16, "dropout": 0.0, "batch_first": batch_first,
               "dtype": torch.float64}
    tgt, memory, masks = _transformer_inputs(batch_first)
    if kind == "encoder":
        reference = nn.TransformerEncoderLayer(8, 2, **options)
        inputs = (tgt,)
        kwargs = {"src_mask": masks["tgt_mask"], "is_causal": True,
                  "src_key_padding_mask": masks["tgt_key_padding_mask"]}
        names = ["self_attn"]
    else:
        reference = nn.TransformerDecoderLayer(8, 2, **options)
        inputs, kwargs, names = (tgt, memory), masks, ["self_attn", "multihead_attn"]
    layer = copy.deepcopy(reference)
    for name in names:
        dot = MetricAttention(8, 2, "dot", batch_first=batch_first, dtype=torch.float64)
        dot.load_state_dict(getattr(reference, name).state_dict())
        setattr(layer, name, dot)
    out, input_grads, grads = _forward_backward(layer, inputs, kwargs)
    expected, expected_input_grads, expected_grads = _forward_backward(reference, inputs, kwargs)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-10)
    for got, want in zip(input_grads, expected_input_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    assert grads.keys() == expected_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], expected_grads[name], rtol=0, atol=1e-10)


@pytest.mark.parametrize("batch_first", [True, False])
def test_metric_attentions_inside_a_transformer_decoder(batch_first):
    """"mlp" self-attention and "linear" cross-attention (with a zero key) in every layer of a
    TransformerDecoder: it trains, and the masks hold (the future and the padding of the
    target and of the memory do not reach the output)."""
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(8, 2, dim_feedforward=16, dropout=0.0,
                                       batch_first=batch_first, dtype=torch.float64)
    layer.self_attn = MetricAttention(8, 2, "mlp", batch_first=batch_first,
                                      learn_temperature=True, dtype=torch.float64)
    layer.multihead_attn = MetricAttention(8, 2, "linear", batch_first=batch_first,
                                           add_zero_attn=True, learn_temperature=True,
                                           dtype=torch.float64)
    decoder = nn.TransformerDecoder(layer, num_layers=2)
    tgt, memory, masks = _transformer_inputs(batch_first)
    out, (tgt_grad, memory_grad), grads = _forward_backward(decoder, (tgt, memory), masks)
    assert out.shape == tgt.shape and torch.isfinite(out).all()
    assert torch.isfinite(tgt_grad).all() and memory_grad.abs().sum() > 0
    for name in ["self_attn.phi.outer.weight", "self_attn.log_temperature",
                 "multihead_attn.in_proj_weight", "multihead_attn.log_temperature"]:
        for i in range(2):
            assert grads[f"layers.{i}.{name}"].abs().sum() > 0, name

    def batch(t, i):  # batch element i, (seq, feature)
        return t[i] if batch_first else t[:, i]

    with torch.no_grad():
        changed_tgt, changed_memory = tgt.clone(), memory.clone()
        batch(changed_tgt, 0)[4] += 10.0    # the last target position: the future of the others
        batch(changed_tgt, 2)[2] += 10.0    # a padded target position
        batch(changed_memory, 1)[3:] -= 10.0  # padded memory
        other = decoder(changed_tgt, changed_memory, **masks)
    torch.testing.assert_close(batch(other, 0)[:4], batch(out, 0)[:4].detach())
    torch.testing.assert_close(batch(other, 1), batch(out, 1).detach())
    keep = [0, 1, 3, 4]  # position 2 of sequence 2 is a query still: only it may change
    torch.testing.assert_close(batch(other, 2)[keep], batch(out, 2)[keep].detach())


def test_drop_in_for_transformer_encoder_layer():
    torch.manual_seed(0)
    enc = nn.TransformerEncoderLayer(
        8, 2, dim_feedforward=16, dropout=0.0, batch_first=True, dtype=torch.float64
    )
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    kpm = torch.tensor([[False] * 5, [False] * 4 + [True], [False] * 3 + [True] * 2])
    expected = enc(x, src_key_padding_mask=kpm)
    dot = MetricAttention(8, 2, "dot", batch_first=True, dtype=torch.float64)
    dot.load_state_dict(enc.self_attn.state_dict())
    enc.self_attn = dot
    torch.testing.assert_close(enc(x, src_key_padding_mask=kpm), expected, rtol=0, atol=1e-10)
    # in eval mode under no_grad the encoder's fused fast path must not bypass the module
    enc.self_attn = MetricAttention(8, 2, "mlp", batch_first=True, dtype=torch.float64)
    enc.eval()
    with torch.no_grad():
        a = enc(x)
        enc.self_attn.phi.outer.bias.fill_(1.0)   # cancels in f: no change
        b = enc(x)
        enc.self_attn.in_proj_weight[:8].mul_(3.0)  # changes the metric: the output changes
        c = enc(x)
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a, c)
