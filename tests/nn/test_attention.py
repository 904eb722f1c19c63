"""MetricAttention: shapes, masks, the metric it computes, gradients, its parameter layout."""

import math
import pickle
import subprocess
import sys

import pytest
import torch
from torch import nn

from skattention import attention
from skattention.nn import MetricAttention

from .layer_inputs import METRICS, OPTIONS
from .layer_inputs import layer_inputs as _inputs

pytestmark = pytest.mark.usefixtures("one_thread")


def _randomise(layer, seed=1):
    """Random values everywhere (phi's output layer starts at zero, which would hide it)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return layer


def _projections(layer):
    """((W_Q, b_Q), (W_K, b_K), (W_V, b_V)) read off the documented parameter layout."""
    E = layer.embed_dim
    shared = layer.metric != "dot" and layer.kdim == E
    if layer.in_proj_weight is not None:
        weights = list(layer.in_proj_weight.split(E))
    else:
        weights = [layer.q_proj_weight, layer.k_proj_weight, layer.v_proj_weight]
        weights = [w for w in weights if w is not None]
    pairs = list(zip(weights, layer.in_proj_bias.split(E)))
    assert len(pairs) == (2 if shared else 3)
    return (pairs[0], pairs[0], pairs[1]) if shared else tuple(pairs)


def _reference(layer, q, k, v, mask=None):
    """Explicit float64 metric-attention, batch_first inputs, from the definition
    f = ||phi(x)-phi(y)||^2, with the appended keys of add_bias_kv and add_zero_attn."""
    E, H = layer.embed_dim, layer.num_heads
    d = E // H
    (wq, bq), (wk, bk), (wv, bv) = _projections(layer)
    zq, zk, vv = q @ wq.T + bq, k @ wk.T + bk, v @ wv.T + bv
    if layer.phi is not None:
        phi = lambda z: z + layer.phi.outer(torch.tanh(layer.phi.inner(z)))  # noqa: E731
        zq, zk = phi(zq), phi(zk)
    n, extra = q.shape[0], 0
    if layer.bias_k is not None:
        zk = torch.cat([zk, layer.bias_k.expand(n, 1, E)], 1)
        vv = torch.cat([vv, layer.bias_v.expand(n, 1, E)], 1)
        extra += 1
    if layer.add_zero_attn:  # a key and a value at the origin
        zk = torch.cat([zk, torch.zeros(n, 1, E, dtype=zk.dtype)], 1)
        vv = torch.cat([vv, torch.zeros(n, 1, E, dtype=vv.dtype)], 1)
        extra += 1
    if mask is not None:
        mask = torch.nn.functional.pad(mask, (0, extra))  # the appended keys are never masked
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
@pytest.mark.parametrize("options", OPTIONS)
def test_computes_the_metric_attention_of_the_definition(metric, need_weights, options):
    layer = _randomise(MetricAttention(
        6, 2, metric, batch_first=True, temperature=0.7, dtype=torch.float64, **options
    ))
    q, k, v = _inputs(kdim=options.get("kdim"), vdim=options.get("vdim"))
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
def test_a_query_with_every_key_masked_as_in_multihead_attention(metric):
    # torch's explicit path gives NaN there, its SDPA path zeros (the output projection's bias
    # after out_proj)
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(6, 3, batch_first=True, dtype=torch.float64)
    layer = MetricAttention(6, 3, metric, batch_first=True, dtype=torch.float64)
    q, k, v = _inputs()
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    kpm[1] = True  # every key of the second sequence
    for need_weights in [True, False]:
        ours = layer(q, k, v, key_padding_mask=kpm, need_weights=need_weights)[0]
        ref = mha(q, k, v, key_padding_mask=kpm, need_weights=need_weights)[0]
        assert ours[1].isnan().all() == ref[1].isnan().all() == need_weights
        if not need_weights:
            torch.testing.assert_close(ours[1], layer.out_proj.bias.expand(4, 6))


@pytest.mark.parametrize("metric", METRICS)
def test_causal(metric):
    layer = MetricAttention(6, 2, metric, batch_first=True, dtype=torch.float64)
    x = _inputs(length=5)[1]
    out, w = layer(x, x, x, is_causal=True)
    assert torch.all(torch.triu(w, 1) == 0)
    out2, _ = layer(x[:, :3], x[:, :3], x[:, :3], is_causal=True, need_weights=False)
    torch.testing.assert_close(out2, out[:, :3])  # the future does not change the past


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
    # (a KeyError, 0 taken as None, a negative dimension inside torch)
    with pytest.raises(ValueError, match="activation must be one of"):
        MetricAttention(4, 1, activation="foo")
    for hidden_size in (0, -3, 2.5):
        with pytest.raises(ValueError, match="hidden_size must be a positive integer"):
            MetricAttention(4, 1, hidden_size=hidden_size)
    layer = MetricAttention(4, 2, batch_first=True)
    q, k, v = _inputs(dtype=torch.float32, e=4)
    with pytest.raises(ValueError, match="attn_mask"):
        layer(q, k, v, attn_mask=torch.zeros(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="key_padding_mask"):
        layer(q, k, v, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="bool or float"):
        layer(q, k, v, attn_mask=torch.zeros(4, 5, dtype=torch.long))
    for name in ["kdim", "vdim"]:
        with pytest.raises(ValueError, match=name):
            MetricAttention(4, 1, **{name: 0})
    cross = MetricAttention(4, 2, kdim=3, vdim=5, batch_first=True)
    q, k, v = _inputs(dtype=torch.float32, e=4, kdim=3, vdim=5)
    with pytest.raises(ValueError, match="key has 4 features; the layer expects 3 .kdim."):
        cross(q, q, v)
    with pytest.raises(ValueError, match="value has 3 features; the layer expects 5 .vdim."):
        cross(q, k, k)
    with pytest.raises(ValueError, match="query has 3 features; the layer expects 4"):
        cross(k, k, v)
    with pytest.raises(ValueError, match="all be 2-D .unbatched. or all 3-D"):
        cross(q, k[0], v)
    with pytest.raises(ValueError, match="same batch size"):
        cross(q, k, v[:1])


@pytest.mark.parametrize("metric", METRICS)
def test_parameter_layout_follows_multihead_attention(metric):
    E = 6
    same = MetricAttention(E, 2, metric)
    rows = 3 if metric == "dot" else 2  # the squared-distance metrics share W
    assert same.in_proj_weight.shape == (rows * E, E) and same.q_proj_weight is None
    cross = MetricAttention(E, 2, metric, kdim=3, vdim=5, add_bias_kv=True)
    assert cross.in_proj_weight is None
    assert (cross.q_proj_weight.shape, cross.k_proj_weight.shape, cross.v_proj_weight.shape) == (
        (E, E), (E, 3), (E, 5)
    )
    assert cross.in_proj_bias.shape == (3 * E,)
    assert cross.bias_k.shape == cross.bias_v.shape == (1, 1, E)
    values_only = MetricAttention(E, 2, metric, vdim=5, bias=False)
    assert values_only.in_proj_bias is None
    if metric == "dot":
        assert values_only.k_proj_weight.shape == (E, E)
    else:  # keys as wide as queries: they still share W
        assert values_only.k_proj_weight is None
    assert "kdim=3, vdim=5" in repr(cross) and "kdim" not in repr(same)


def test_layers_pickled_before_the_new_options_load_and_run():
    """A module pickled whole before kdim, vdim, add_bias_kv and add_zero_attn existed."""
    layer = _randomise(MetricAttention(4, 2, "mlp", batch_first=True, dtype=torch.float64))
    q, k, v = _inputs(e=4)
    expected, _ = layer(q, k, v)
    state = {key: value for key, value in layer.__dict__.items()
             if key not in ("kdim", "vdim", "add_zero_attn")}
    state["_parameters"] = {key: value for key, value in layer._parameters.items()
                            if key not in ("q_proj_weight", "k_proj_weight", "v_proj_weight",
                                           "bias_k", "bias_v")}
    old = MetricAttention.__new__(MetricAttention)
    old.__setstate__(state)
    restored = pickle.loads(pickle.dumps(old))
    assert (restored.kdim, restored.vdim, restored.add_zero_attn) == (4, 4, False)
    assert restored.bias_k is None and restored.q_proj_weight is None
    torch.testing.assert_close(restored(q, k, v)[0], expected, rtol=0, atol=0)


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


@pytest.mark.parametrize("metric", ["dot", "mlp", "linear"])
def test_compiles_in_one_graph(metric):
    # the library's SDPA lock (a Python RLock around each fused call) broke torch.compile's
    # fullgraph tracing ("Unsupported context manager"); nn.MultiheadAttention compiles whole
    torch.manual_seed(0)
    layer = MetricAttention(16, 2, metric=metric, batch_first=True)
    x = torch.randn(2, 5, 16)
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, x, x, need_weights=False)[0],
                               layer(x, x, x, need_weights=False)[0])


_CAUSAL_UNDER_A_CAP = """
import resource, torch
from skattention.nn import MetricAttention
layer = MetricAttention(16, 2, "{metric}", batch_first=True).eval()
x = torch.randn(1, 64, 16)
with torch.no_grad():
    ref, _ = layer(x, x, x, need_weights=False, attn_mask=torch.ones(64, 64).bool().triu(1))
    out, _ = layer(x, x, x, need_weights=False, is_causal=True)  # warm: threads, kernels
    assert torch.equal(out, ref)
    vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
    # 200 MiB more address space: an 8192 x 8192 causal mask (bytes, then floats) needs 320
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    cap = vm + 200 * 2**20
    resource.setrlimit(resource.RLIMIT_AS,
                       (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    x = torch.randn(1, 8192, 16)
    out, _ = layer(x, x, x, need_weights=False, is_causal=True)
print("ok", out.shape[1])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.parametrize("metric", ["dot", "mlp"])
def test_causal_without_weights_forms_no_length_squared_mask(metric):
    # a causal mask alone goes to SDPA's is_causal: no L x S array, as MultiheadAttention
    out = subprocess.run([sys.executable, "-c", _CAUSAL_UNDER_A_CAP.format(metric=metric)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.split() == ["ok", "8192"], out.stderr[-2000:]
