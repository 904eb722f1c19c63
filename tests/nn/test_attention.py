"""MetricAttention: shapes, masks, the metric it computes, gradients, MultiheadAttention parity."""

import math

import pytest
import torch
from torch import nn

from skattention import attention
from skattention.nn import MetricAttention

METRICS = ["mlp", "linear", "dot"]


def _inputs(n=2, length=4, src=5, e=6, dtype=torch.float64, seed=0, batch_first=True):
    g = torch.Generator().manual_seed(seed)
    shape_q = (n, length, e) if batch_first else (length, n, e)
    shape_k = (n, src, e) if batch_first else (src, n, e)
    return (
        torch.randn(shape_q, generator=g, dtype=dtype),
        torch.randn(shape_k, generator=g, dtype=dtype),
        torch.randn(shape_k, generator=g, dtype=dtype),
    )


def _randomise(layer, seed=1):
    """Random values everywhere (phi's output layer starts at zero, which would hide it)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return layer


def _reference(layer, q, k, v, mask=None):
    """Explicit float64 metric-attention, batch_first inputs, from the definition
    f = ||phi(x)-phi(y)||^2."""
    E, H = layer.embed_dim, layer.num_heads
    d = E // H
    W, b = layer.in_proj_weight, layer.in_proj_bias
    zq, zk = q @ W[:E].T + b[:E], k @ W[:E].T + b[:E]
    if layer.phi is not None:
        phi = lambda z: z + layer.phi.outer(torch.tanh(layer.phi.inner(z)))  # noqa: E731
        zq, zk = phi(zq), phi(zk)
    vv = v @ W[E:].T + b[E:]
    outs, ws = [], []
    for h in range(H):
        sl = slice(h * d, (h + 1) * d)
        f = ((zq[..., :, None, sl] - zk[..., None, :, sl]) ** 2).sum(-1)
        s = -f / math.exp(float(layer.log_temperature[h]))
        if mask is not None:
            s = s + mask
        w = torch.softmax(s, -1)
        ws.append(w)
        outs.append(w @ vv[..., sl])
    out = layer.out_proj(torch.cat(outs, -1))
    return out, torch.stack(ws, 1)


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("batch_first", [True, False])
def test_shapes(metric, batch_first):
    layer = MetricAttention(6, 2, metric, batch_first=batch_first, dtype=torch.float64)
    q, k, v = _inputs(batch_first=batch_first)
    out, w = layer(q, k, v)
    assert out.shape == q.shape and w.shape == (2, 4, 5)
    out2, w2 = layer(q, k, v, average_attn_weights=False)
    assert w2.shape == (2, 2, 4, 5)
    torch.testing.assert_close(w2.mean(1), w)
    out3, none = layer(q, k, v, need_weights=False)
    assert none is None
    torch.testing.assert_close(out3, out)  # fused and explicit paths agree
    # unbatched
    q1, k1, v1 = (t[0] if batch_first else t[:, 0] for t in (q, k, v))
    out1, w1 = layer(q1, k1, v1)
    assert out1.shape == (4, 6) and w1.shape == (4, 5)
    torch.testing.assert_close(out1, out[0] if batch_first else out[:, 0])


@pytest.mark.parametrize("metric", ["mlp", "linear"])
@pytest.mark.parametrize("need_weights", [True, False])
def test_computes_the_metric_attention_of_the_definition(metric, need_weights):
    layer = _randomise(
        MetricAttention(6, 2, metric, batch_first=True, temperature=0.7, dtype=torch.float64)
    )
    q, k, v = _inputs()
    mask = torch.zeros(4, 5, dtype=torch.float64)
    mask[0, 1] = -math.inf
    mask[2, 3] = 0.3
    ref_out, ref_w = _reference(layer, q, k, v, mask)
    out, w = layer(q, k, v, attn_mask=mask, need_weights=need_weights, average_attn_weights=False)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    if need_weights:
        torch.testing.assert_close(w, ref_w, rtol=1e-10, atol=1e-10)


def test_single_head_equals_the_engine():
    """One head, identity value/output maps: the engine's attention with phi as the metric."""
    layer = _randomise(MetricAttention(3, 1, "mlp", temperature=1.3, dtype=torch.float64))
    E = 3
    with torch.no_grad():
        layer.in_proj_weight[E:] = torch.eye(E)
        layer.in_proj_bias[E:] = 0
        layer.out_proj.weight.copy_(torch.eye(E))
        layer.out_proj.bias.zero_()
    g = torch.Generator().manual_seed(3)
    q, k = (
        torch.randn(7, E, generator=g, dtype=torch.float64),
        torch.randn(9, E, generator=g, dtype=torch.float64),
    )
    v = torch.randn(9, E, generator=g, dtype=torch.float64)

    def phi(x):
        return layer.phi(x @ layer.in_proj_weight[:E].T + layer.in_proj_bias[:E])

    with torch.no_grad():
        expected = attention(q, k, v, metric=phi, temperature=1.3, backend="stream")
        out, _ = layer(q, k, v, need_weights=False)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("metric", METRICS)
def test_masks(metric):
    layer = MetricAttention(6, 3, metric, batch_first=True, dtype=torch.float64)
    q, k, v = _inputs()
    bool_mask = torch.zeros(4, 5, dtype=torch.bool)
    bool_mask[:, 0] = True          # nobody may attend to key 0
    bool_mask[1, 2:] = True         # query 1 sees key 1 only
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    kpm[1, 4] = True                # key 4 of the second sequence is padding
    out, w = layer(q, k, v, attn_mask=bool_mask, key_padding_mask=kpm)
    assert torch.all(w[:, :, 0] == 0) and torch.all(w[1, :, 4] == 0)
    torch.testing.assert_close(w[:, 1, 1], torch.ones(2, dtype=torch.float64))
    # the float form of the same masks gives the same result, on both paths
    float_mask = torch.zeros(4, 5, dtype=torch.float64).masked_fill(bool_mask, -math.inf)
    float_kpm = torch.zeros(2, 5, dtype=torch.float64).masked_fill(kpm, -math.inf)
    out2, _ = layer(q, k, v, attn_mask=float_mask, key_padding_mask=float_kpm, need_weights=False)
    torch.testing.assert_close(out2, out)
    # masked keys do not influence the output
    k2, v2 = k.clone(), v.clone()
    k2[:, 0] += 100.0
    v2[1, 4] -= 50.0
    out3, _ = layer(q, k2, v2, attn_mask=bool_mask, key_padding_mask=kpm)
    torch.testing.assert_close(out3, out)
    # a per-(batch, head) 3-D mask
    mask3 = torch.zeros(2 * 3, 4, 5, dtype=torch.bool)
    mask3[4, :, 3] = True  # batch 1, head 1
    _, wh = layer(q, k, v, attn_mask=mask3, average_attn_weights=False)
    assert torch.all(wh[1, 1, :, 3] == 0) and torch.all(wh[0, :, :, 3] > 0)


@pytest.mark.parametrize("metric", METRICS)
def test_causal(metric):
    layer = MetricAttention(6, 2, metric, batch_first=True, dtype=torch.float64)
    x = _inputs(length=5)[1]
    out, w = layer(x, x, x, is_causal=True)
    assert torch.all(torch.triu(w, 1) == 0)
    out2, _ = layer(x[:, :3], x[:, :3], x[:, :3], is_causal=True, need_weights=False)
    torch.testing.assert_close(out2, out[:, :3])  # the future does not change the past


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
def test_dot_equals_multihead_attention(batch_first, need_weights):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(6, 3, batch_first=batch_first, dtype=torch.float64)
    layer = MetricAttention(6, 3, "dot", batch_first=batch_first, dtype=torch.float64)
    with torch.no_grad():
        for p in mha.parameters():  # non-zero biases too
            p.add_(0.1 * torch.randn_like(p))
    layer.load_state_dict(mha.state_dict())
    q, k, v = _inputs(batch_first=batch_first)
    bool_mask = torch.zeros(4, 5, dtype=torch.bool)
    bool_mask[0, :2] = True
    float_mask = torch.randn(2 * 3, 4, 5, dtype=torch.float64)
    kpm = torch.tensor([[False] * 5, [False, False, False, True, True]])
    for kwargs in [
        {},
        {"attn_mask": bool_mask},
        {"attn_mask": float_mask},
        {"key_padding_mask": kpm},
        {"attn_mask": bool_mask, "key_padding_mask": kpm},
    ]:
        for avg in [True, False]:
            expected = mha(q, k, v, need_weights=need_weights, average_attn_weights=avg, **kwargs)
            got = layer(q, k, v, need_weights=need_weights, average_attn_weights=avg, **kwargs)
            torch.testing.assert_close(got[0], expected[0], rtol=0, atol=1e-10)
            if need_weights:
                torch.testing.assert_close(got[1], expected[1], rtol=0, atol=1e-10)


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


def test_keys_are_centred_in_float32():
    """Keys far from the origin: without centring, ||k||^2 ~ 1e8 swamps the scores in float32."""
    layer64 = _randomise(MetricAttention(4, 1, "linear", batch_first=True, dtype=torch.float64))
    with torch.no_grad():
        layer64.in_proj_bias.zero_()
        layer64.in_proj_weight[:4] = torch.eye(4)
    layer32 = MetricAttention(4, 1, "linear", batch_first=True)
    layer32.load_state_dict({k: v.float() for k, v in layer64.state_dict().items()})
    q, k, v = _inputs(e=4)
    q, k, v = ((t + 1e4).float().double() for t in (q, k, v))  # exactly representable in float32
    expected, w_exp = layer64(q, k, v)
    for need_weights in [True, False]:
        out, w = layer32(q.float(), k.float(), v.float(), need_weights=need_weights)
        torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-2)


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("need_weights", [True, False])
def test_gradcheck(metric, need_weights):
    layer = _randomise(MetricAttention(4, 2, metric, batch_first=True, learn_temperature=True,
                                       dtype=torch.float64), seed=2)
    q, k, v = (t.requires_grad_() for t in _inputs(n=1, length=3, src=4, e=4))
    mask = torch.zeros(1, 4, dtype=torch.bool)
    mask[0, 2] = True
    params = dict(layer.named_parameters())
    names = list(params)

    def fn(q, k, v, *ps):
        out, w = torch.func.functional_call(
            layer,
            dict(zip(names, ps)),
            (q, k, v),
            {"key_padding_mask": mask, "need_weights": need_weights},
        )
        return out if w is None else (out, w)

    assert torch.autograd.gradcheck(
        fn, (q, k, v, *[p.detach().requires_grad_() for p in params.values()])
    )


def test_gradients_reach_phi_and_temperature():
    layer = MetricAttention(4, 2, "mlp", learn_temperature=True, batch_first=True)
    q, k, v = _inputs(dtype=torch.float32, e=4)
    layer(q, k, v, need_weights=False)[0].square().sum().backward()
    assert layer.phi.outer.weight.grad.abs().sum() > 0
    assert layer.log_temperature.grad.abs().sum() > 0
    assert layer.in_proj_weight.grad.shape == (8, 4)  # shared W and W_V only


def test_invalid_arguments():
    with pytest.raises(ValueError, match="metric"):
        MetricAttention(4, 1, "cosine")
    with pytest.raises(ValueError, match="multiple"):
        MetricAttention(5, 2)
    with pytest.raises(ValueError, match="temperature"):
        MetricAttention(4, 1, temperature=0.0)
    layer = MetricAttention(4, 2, batch_first=True)
    q, k, v = _inputs(dtype=torch.float32, e=4)
    with pytest.raises(ValueError, match="attn_mask"):
        layer(q, k, v, attn_mask=torch.zeros(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="key_padding_mask"):
        layer(q, k, v, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="bool or float"):
        layer(q, k, v, attn_mask=torch.zeros(4, 5, dtype=torch.long))


def test_layer_modules_are_torch_only():
    import ast
    import pathlib

    import skattention.nn

    for name in ["_attention.py", "_ipn.py", "_priors.py"]:
        tree = ast.parse((pathlib.Path(skattention.nn.__file__).parent / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] == "sklearn" for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                assert node.module.split(".")[0] != "sklearn", name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("metric", METRICS)
def test_fused_path_on_cuda_matches_the_explicit_path(metric, dtype):
    layer = MetricAttention(64, 4, metric, batch_first=True).cuda()
    x = torch.randn(2, 128, 64, device="cuda")
    kpm = torch.zeros(2, 128, dtype=torch.bool, device="cuda")
    kpm[1, 100:] = True
    with torch.no_grad():
        expected, _ = layer(x, x, x, key_padding_mask=kpm, need_weights=True)
        layer = layer.to(dtype)
        out, _ = layer(
            x.to(dtype), x.to(dtype), x.to(dtype), key_padding_mask=kpm, need_weights=False
        )
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), expected, rtol=tol, atol=tol)
