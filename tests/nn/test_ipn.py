"""IPN and AttentionNetworkClassifier: the inference rule, training, reproducibility."""

from functools import partial

import numpy as np
import pytest
import torch
from sklearn.datasets import make_moons

from skattention.nn import IPN, AttentionNetworkClassifier


@pytest.mark.parametrize("metric", ["mlp", "linear", "dot"])
def test_ipn_context_rule_ignores_the_other_queries(metric):
    torch.manual_seed(0)
    net = IPN(3, 4, width=6, n_blocks=2, metric=metric, num_heads=2).double()
    ctx, x = torch.randn(20, 3, dtype=torch.float64), torch.randn(7, 3, dtype=torch.float64)
    full = net(x, context=ctx)
    assert full.shape == (7, 4)
    torch.testing.assert_close(net(x[2:5], context=ctx), full[2:5], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        net(x.flip(0), context=ctx, chunk_size=3), full.flip(0), rtol=1e-12, atol=1e-12
    )
    # a query equal to a context point, alone, propagates as that point does within the context
    # plus one more copy of itself, which differs from attending to the whole batch of queries
    transductive = net(torch.cat([ctx, x]))[20:]
    assert not torch.allclose(transductive, full)


def _each_query_alone(net, x, context):
    """The inference rule written out: each query alone, its keys at block l the context's
    states there plus itself (MetricAttention's own forward, no mask)."""
    states, hc = [], net.input(context)
    for block in net.blocks:
        states.append(hc)
        hc = net._step(block, hc, hc)
    rows = []
    for hx in net.input(x):
        hx = hx[None]
        for block, hc_l in zip(net.blocks, states):
            hx = net._step(block, hx, torch.cat([hc_l, hx]))
        rows.append(net.output(hx))
    return torch.cat(rows)


@pytest.mark.parametrize("metric", ["mlp", "linear", "dot"])
@pytest.mark.parametrize("extra", [{}, {"add_zero_attn": True}, {"add_bias_kv": True}])
def test_queries_over_a_context_follow_the_inference_rule(metric, extra):
    # the queries' scores over the shared context keys and their own key are one softmax (no
    # L x (m + L) mask); with appended keys the mask path; a prepared context gives the same
    torch.manual_seed(0)
    net = IPN(3, 4, width=6, n_blocks=2, metric=metric, num_heads=2, **extra).double().eval()
    ctx, x = torch.randn(30, 3, dtype=torch.float64), torch.randn(9, 3, dtype=torch.float64)
    expected = _each_query_alone(net, x, ctx)
    torch.testing.assert_close(net(x, context=ctx), expected, rtol=1e-12, atol=1e-12)
    prepared = net.prepare_context(ctx)
    assert prepared.n_samples == 30 and len(prepared.keys) == 2
    torch.testing.assert_close(net(x, context=prepared, chunk_size=4), expected, rtol=1e-12,
                               atol=1e-12)


def test_queries_over_a_context_differentiate():
    torch.manual_seed(0)
    net = IPN(3, 2, width=4, metric="mlp").double()
    ctx, x = torch.randn(12, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    x.requires_grad_(True)
    net(x, context=ctx).sum().backward()
    reference = x.grad.clone()
    x.grad = None
    _each_query_alone(net, x, ctx).sum().backward()
    torch.testing.assert_close(x.grad, reference, rtol=1e-10, atol=1e-12)
    assert all(p.grad is not None for p in net.parameters())


def test_dropout_over_a_context_drops_weights_in_training_only():
    torch.manual_seed(0)
    net = IPN(3, 2, width=4, metric="linear", dropout=0.5).double()
    ctx, x = torch.randn(40, 3, dtype=torch.float64), torch.randn(6, 3, dtype=torch.float64)
    net.eval()
    expected = _each_query_alone(net, x, ctx)
    torch.testing.assert_close(net(x, context=ctx), expected, rtol=1e-12, atol=1e-12)
    net.train()
    dropped = net(x, context=net.prepare_context(ctx))
    assert torch.isfinite(dropped).all() and not torch.allclose(dropped, expected)


def test_ipn_is_set_equivariant():
    torch.manual_seed(0)
    net = IPN(2, 2, width=4, residual=False).double()
    x = torch.randn(10, 2, dtype=torch.float64)
    perm = torch.randperm(10)
    torch.testing.assert_close(net(x[perm]), net(x)[perm])


def test_ipn_without_blocks_is_linear():
    net = IPN(3, 2, width=5, n_blocks=0)
    x = torch.randn(4, 3)
    torch.testing.assert_close(net(x), net.output(net.input(x)))


@pytest.mark.parametrize("metric", ["mlp", "linear", "dot"])
def test_classifier_learns_two_moons(metric):
    X, y = make_moons(300, noise=0.2, random_state=0)
    clf = AttentionNetworkClassifier(
        metric, width=10, max_iter=60, learning_rate=1e-2, random_state=0
    )
    clf.fit(X[:200], y[:200])
    assert clf.loss_curve_[-1] < 0.5 * clf.loss_curve_[0]
    assert clf.n_iter_ <= 60 and len(clf.loss_curve_) == clf.n_iter_  # tol may stop it earlier
    # measured (seed 0): mlp 0.97, dot 0.92, linear 0.89; a logistic regression gets 0.87
    assert clf.score(X[200:], y[200:]) > (0.95 if metric == "mlp" else 0.85)
    proba = clf.predict_proba(X[200:])
    np.testing.assert_allclose(proba.sum(1), 1.0)
    # a prediction does not depend on the other queries
    np.testing.assert_allclose(clf.predict_proba(X[203:204]), proba[3:4], rtol=1e-10, atol=1e-12)


def test_classifier_minibatches_and_reproducibility():
    X, y = make_moons(120, noise=0.2, random_state=1)
    y = np.array(["a", "b"])[y]
    kw = dict(width=8, max_iter=5, batch_size=32, random_state=3)
    a = AttentionNetworkClassifier(**kw).fit(X, y)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    b = AttentionNetworkClassifier(**kw).fit(X, y)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's torch RNG is left alone
    assert a.loss_curve_ == b.loss_curve_
    np.testing.assert_array_equal(a.predict_proba(X), b.predict_proba(X))
    assert set(a.predict(X)) <= {"a", "b"}
    c = AttentionNetworkClassifier(**{**kw, "random_state": 4}).fit(X, y)
    assert c.loss_curve_ != a.loss_curve_


def test_classifier_rejects_bad_heads():
    with pytest.raises(ValueError, match="divisible"):
        AttentionNetworkClassifier(width=5, num_heads=2).fit(np.zeros((4, 2)), [0, 1, 0, 1])


def test_verbose_writes_to_stderr_not_stdout(capsys):
    X, y = make_moons(60, noise=0.2, random_state=0)
    AttentionNetworkClassifier(width=8, max_iter=2, verbose=1, random_state=0).fit(X, y)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "AttentionNetworkClassifier fit" in captured.err and "loss=" in captured.err
    AttentionNetworkClassifier(width=8, max_iter=2, verbose=2, random_state=0).fit(X, y)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("AttentionNetworkClassifier epoch") == 2


def test_network_of_huge_features_equals_it_rescaled():
    # the variance of values of ~1e155 overflows float64: each column's spread is measured in
    # units of its largest deviation instead (every row was standardised to 0 before)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 2))
    y = np.where(X[:, 0] > 0, "yes", "no")
    make = partial(AttentionNetworkClassifier, max_iter=2, width=8, random_state=0)
    huge = make().fit(X * 1e155, y).predict_proba(X[:20] * 1e155)
    plain = make().fit(X, y).predict_proba(X[:20])
    np.testing.assert_allclose(huge, plain, atol=1e-6)
    assert np.ptp(huge[:, 0]) > 0.01


@pytest.mark.parametrize("scale", [1e-130, 1e-160, 1e-300])
def test_network_of_tiny_features_equals_it_rescaled(scale):
    # the variance of values below ~1e-154 underflows float64: the scale was 0, made 1, the
    # features left at ~1e-160 and every prediction the same (accuracy 0.5)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 2))
    y = np.where(X[:, 0] > 0, "yes", "no")
    make = partial(AttentionNetworkClassifier, max_iter=2, width=8, random_state=0)
    tiny = make().fit(X * scale, y).predict_proba(X[:20] * scale)
    np.testing.assert_allclose(tiny, make().fit(X, y).predict_proba(X[:20]), atol=1e-6)


@pytest.mark.parametrize("value", [3.3, 1e200, 1e300])
def test_a_constant_feature_standardises_to_zero_whatever_its_value(value):
    # the mean of n copies of 1e300 is 1e300 + 2e285: the constant column was standardised to
    # 2e285, beyond the float32 network, and every probability was NaN (3.3 became 1)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 2))
    y = np.where(X[:, 0] > 0, "yes", "no")
    make = partial(AttentionNetworkClassifier, max_iter=2, width=8, random_state=0)
    reference = make().fit(np.c_[X, np.zeros(200)], y).predict_proba(np.c_[X[:20], np.zeros(20)])
    with_value = np.c_[X, np.full(200, value)]
    proba = make().fit(with_value, y).predict_proba(with_value[:20])
    np.testing.assert_array_equal(proba, reference)


def test_features_near_the_largest_float64_are_standardised():
    # their sum overflowed the mean: every probability was NaN
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 2))
    y = np.where(X[:, 0] > 0, "yes", "no")
    make = partial(AttentionNetworkClassifier, max_iter=2, width=8, random_state=0)
    huge = X.copy()
    huge[:, 0] = 1e308 + X[:, 0] * 1e307
    proba = make().fit(huge, y).predict_proba(huge[:20])
    np.testing.assert_allclose(proba, make().fit(X, y).predict_proba(X[:20]), atol=1e-6)


def test_a_feature_of_both_signs_near_the_largest_float64_is_standardised():
    # its deviations from the mean overflow too (1.7e308 - (-1.7e308)): the scale was NaN,
    # silently made 1, and every probability NaN
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 2))
    y = np.where(X[:, 0] > 0, "yes", "no")
    huge = X.copy()
    huge[:, 1] = np.where(np.arange(200) < 150, 1.7e308, -1.7e308)
    make = partial(AttentionNetworkClassifier, max_iter=2, width=8, random_state=0)
    proba = make().fit(huge, y).predict_proba(huge[:20])
    assert np.all(np.isfinite(proba))
    two_levels = np.c_[X[:, 0], np.where(np.arange(200) < 150, 1.0, -1.0)]
    np.testing.assert_allclose(proba, make().fit(two_levels, y).predict_proba(two_levels[:20]),
                               atol=1e-6)


def test_ipn_refuses_batched_sets():
    with pytest.raises(ValueError, match="x must be 2-D"):
        IPN(4, 3, width=8)(torch.randn(2, 10, 4))


def test_training_that_diverges_is_a_clear_error():
    # a learning rate far too large made every weight NaN: NaN probabilities, silently
    X, y = make_moons(60, noise=0.2, random_state=0)
    clf = AttentionNetworkClassifier(width=8, max_iter=5, learning_rate=1e10, random_state=0)
    with pytest.raises(ValueError, match=r"Training diverged.*lower learning_rate \(=1e\+10\)"):
        clf.fit(X, y)


def test_queries_that_overflow_the_network_are_a_clear_error():
    # queries of ~1e300 (standardised to ~1e300) overflowed the network: NaN probabilities
    X, y = make_moons(60, noise=0.2, random_state=0)
    clf = AttentionNetworkClassifier(width=8, max_iter=5, random_state=0).fit(X, y)
    with pytest.raises(ValueError, match="overflow .*rescale the data"):
        clf.predict_proba(X[:3] * 1e300)
    with pytest.raises(ValueError, match="overflow .*rescale the data"):
        clf.predict(X[:3] * 1e300)
    assert np.all(np.isfinite(clf.predict_proba(X[:3] * 1e10)))  # far, not overflowing


def test_a_network_with_non_finite_weights_is_named_as_the_cause():
    # NaN probabilities from NaN weights were blamed on the queries' range
    X, y = make_moons(60, noise=0.2, random_state=0)
    clf = AttentionNetworkClassifier(width=4, max_iter=2, random_state=0).fit(X, y)
    with torch.no_grad():
        next(clf.network_.parameters()).fill_(float("nan"))
    with pytest.raises(ValueError, match="weights are not finite"):
        clf.predict_proba(X)


def test_predictions_follow_the_network_changed_in_place():
    # predict prepares the training set once per network: a network changed in place (its
    # parameters' versions) is prepared again, not served from the first preparation
    X, y = make_moons(80, noise=0.2, random_state=0)
    clf = AttentionNetworkClassifier(width=6, max_iter=3, random_state=0).fit(X, y)
    before = clf.predict_proba(X)
    net = clf.network_.double()
    with torch.no_grad():
        clf.network_.output.bias.add_(torch.tensor([2.0, -2.0], dtype=torch.float64))
        expected = torch.softmax(net(torch.from_numpy(clf._standardise(X)),
                                     context=torch.from_numpy(clf._fit_X)), 1).numpy()
    after = clf.predict_proba(X)
    assert not np.allclose(after, before)
    np.testing.assert_allclose(after, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_fit_trains_under_the_callers_no_grad(mode):
    # the backward of a step found no graph: "element 0 of tensors does not require grad"
    X, y = make_moons(120, noise=0.2, random_state=0)
    expected = AttentionNetworkClassifier(max_iter=3, random_state=0).fit(X, y).predict_proba(X)
    with mode():
        got = AttentionNetworkClassifier(max_iter=3, random_state=0).fit(X, y).predict_proba(X)
    np.testing.assert_array_equal(got, expected)


def test_fit_under_a_float64_default_dtype_trains_a_float32_network():
    # the network was built in the default dtype and met float32 inputs: "mat1 and mat2 must
    # have the same dtype"
    X, y = make_moons(120, noise=0.2, random_state=0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        clf = AttentionNetworkClassifier(max_iter=3, random_state=0).fit(X, y)
    finally:
        torch.set_default_dtype(default)
    assert all(p.dtype == torch.float32 for p in clf.network_.parameters())
    assert clf.score(X, y) > 0.7


def test_an_empty_context_leaves_each_query_its_own_key():
    torch.manual_seed(0)
    net = IPN(3, 2, width=4, metric="mlp").double().eval()
    x = torch.randn(5, 3, dtype=torch.float64)
    empty = torch.empty(0, 3, dtype=torch.float64)
    torch.testing.assert_close(net(x, context=empty), _each_query_alone(net, x, empty),
                               rtol=1e-12, atol=1e-12)


def test_predictions_follow_parameters_set_through_data():
    # a change through .data keeps torch's version counter: the prepared training set is
    # compared by value with the network it was made from
    X, y = make_moons(80, noise=0.2, random_state=0)
    clf = AttentionNetworkClassifier(width=6, max_iter=3, random_state=0).fit(X, y)
    before = clf.predict_proba(X)
    clf.network_.output.bias.data = clf.network_.output.bias.data + torch.tensor([2.0, -2.0])
    assert not np.allclose(clf.predict_proba(X), before)
