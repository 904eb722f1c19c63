"""The training loop's averaged parameters (``train_metric(average=...)``)."""

import numpy as np
import pytest
import torch

from skattention._engine import _metric_training, attention, build_map, train_metric
from skattention._engine._optimizers import Adam, AveragingOptimizer


def _problem(n=240, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g)
    labels = (X[:, 0] + 0.3 * torch.randn(n, generator=g) > 0).long()
    values = torch.nn.functional.one_hot(labels, 2).float()
    return X, values


def _train(average, batch_size, max_iter=3):
    X, values = _problem()
    train, val = slice(0, 200), slice(200, 240)
    torch.manual_seed(0)
    metric_map = build_map("linear", np.eye(3))
    log_t = torch.tensor(0.0, requires_grad=True)
    history, _ = train_metric(
        metric_map, log_t, X[train], values[train], "log_loss", torch.ones(200),
        validation=(X[val], values[val], torch.ones(40)), max_iter=max_iter,
        batch_size=batch_size, n_candidates=200, learning_rate=5e-2, weight_decay=0.0,
        n_iter_no_change=100, tol=0.0, generator=torch.Generator().manual_seed(0),
        average=average,
    )
    return history, metric_map.linear.weight.detach().clone(), float(log_t)


def test_the_average_follows_every_step():
    """After each step the average is ``decay * average + (1 - decay) * parameter``."""
    param = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    stepper = AveragingOptimizer(Adam([param], lr=0.1), [param], 0.8)
    expected = param.detach().clone()
    for target in (3.0, -1.0, 0.5, 2.0):
        stepper.optimizer.zero_grad()
        ((param - target) ** 2).sum().backward()
        stepper.step()
        expected = 0.8 * expected + 0.2 * param.detach()
        torch.testing.assert_close(stepper.averages[0], expected)
    live = param.detach().clone()
    stepper.swap_in()
    torch.testing.assert_close(param.detach(), stepper.averages[0])
    stepper.swap_out()
    assert torch.equal(param.detach(), live)


def test_averaging_validates_and_keeps_the_average_without_changing_training():
    """The steps (the training loss) are those of training without the average; what is
    validated and kept is not the last parameters."""
    plain_history, plain_weight, _ = _train(None, batch_size=20)
    history, weight, _ = _train(0.9, batch_size=20)  # 10 steps an epoch
    assert history.loss_curve == plain_history.loss_curve
    assert history.validation_losses != plain_history.validation_losses
    assert not torch.equal(weight, plain_weight)


def test_epochs_of_one_step_are_not_averaged():
    """The average spans at most an epoch: with one step an epoch there is none, and the fit is
    the one without averaging, to the bit."""
    plain_history, plain_weight, plain_t = _train(None, batch_size=200)
    history, weight, log_t = _train(0.9, batch_size=200)
    assert history.validation_losses == plain_history.validation_losses
    assert torch.equal(weight, plain_weight) and log_t == plain_t


def _old_step_attention(queries, prepared, values, temperature, log_prior, own):
    """A training step's attention as it was computed before its own entry: the public one."""
    return attention(queries, prepared.raw, values, metric=prepared.metric, temperature=temperature,
                     log_prior=log_prior, exclude_self=own, on_empty="zero",
                     device=queries.device, dtype=queries.dtype)


@pytest.mark.parametrize("kind", ["linear", "mlp", "dot", "tabular"])
@pytest.mark.parametrize("learned", [True, False])
@pytest.mark.parametrize("zero_weight", [False, True])
def test_training_steps_compute_what_the_public_attention_computes(
        monkeypatch, kind, learned, zero_weight):
    """The step's own attention entry (no argument checks) gives every training loss of the
    public entry to the bit: learned or fixed temperature (a fixed one other than 1 is a float,
    as the public entry makes it), every map kind, zero sample weights (-inf priors)."""
    X, values = _problem()
    weight = torch.ones(240)
    if zero_weight:
        weight[::7] = 0.0

    def fit():
        torch.manual_seed(0)
        if kind == "tabular":
            metric_map = build_map("tabular", n_components=3, n_numeric=3, cardinalities=[])
        else:
            metric_map = build_map(kind, np.eye(3))
        log_t = torch.tensor(-0.7, requires_grad=learned)
        history, _ = train_metric(
            metric_map, log_t, X, values, "log_loss", weight, max_iter=2, batch_size=64,
            n_candidates=150, learning_rate=5e-2, weight_decay=0.0, n_iter_no_change=100,
            tol=0.0, generator=torch.Generator().manual_seed(0))
        return history.loss_curve

    new = fit()
    monkeypatch.setattr(_metric_training, "_minibatch_attention", _old_step_attention)
    assert new == fit()


def test_a_warm_start_without_improvement_keeps_the_last_validated_parameters():
    """When no epoch of a continued fit beats the best of the earlier one, nothing is restored:
    the map is left with the average the last epoch validated, not the live parameters that no
    epoch validated."""
    from skattention._engine import attention
    from skattention._engine._metric_training import validation_score

    X, values = _problem()
    train, val = slice(0, 200), slice(200, 240)
    validation = (X[val], values[val], torch.ones(40))
    torch.manual_seed(0)
    metric_map = build_map("mlp", np.eye(3))
    log_t = torch.tensor(0.0, requires_grad=True)
    kwargs = dict(validation=validation, batch_size=20, n_candidates=200, weight_decay=0.0,
                  n_iter_no_change=100, tol=0.0, average=0.9)
    history, state = train_metric(
        metric_map, log_t, X[train], values[train], "log_loss", torch.ones(200), max_iter=8,
        learning_rate=5e-2, generator=torch.Generator().manual_seed(0), **kwargs)
    best = history.best_validation_loss
    with torch.no_grad():  # a map moved far from its best: no epoch of the next fit improves
        for p in metric_map.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)) * 3.0)
    history, _ = train_metric(
        metric_map, log_t, X[train], values[train], "log_loss", torch.ones(200), max_iter=2,
        learning_rate=5e-2, generator=torch.Generator().manual_seed(1), history=history,
        optimizer_state=state, **kwargs)
    assert history.best_validation_loss == best < min(history.validation_losses[-2:])
    with torch.no_grad():
        pred = attention(metric_map(validation[0]), metric_map(X[train]), values[train],
                         metric=metric_map.kind, temperature=float(torch.exp(log_t)),
                         on_empty="zero")
        _, final, _ = validation_score(pred, validation, "log_loss")
    assert final == history.validation_losses[-1]


def test_early_stopping_on_the_training_loss_without_an_earlier_history():
    """The rule of every trainer without validation (the network classifier's too): stop once
    the epoch loss has not improved by ``tol`` on the best so far for ``n_iter_no_change``
    epochs; nothing is restored."""
    from skattention._engine import EarlyStopping
    from skattention._engine._training import TrainingHistory

    rule, history, stops = EarlyStopping(2, 0.1), TrainingHistory(), []
    for loss in (1.0, 0.95, 0.8, 0.75, 0.72):
        history.loss_curve.append(loss)
        stops.append(rule.on_epoch_end(history))
    # 0.95: no improvement by 0.1 on 1.0; 0.8 improves on the best, 0.95; 0.75 and 0.72 do
    # not on theirs (0.8, then 0.75)
    assert stops == [False, False, False, False, True]
    assert rule.best_loss == 0.72
    rule.on_train_end(history)  # no snapshot to restore


def test_early_stopping_on_the_gain_of_a_window_of_epochs():
    """``WindowRule(gain)``: a plateau whose epochs each beat the best by more than ``tol`` but
    together by less than the share stops; a slow steady gain of the same size per epoch over
    a larger share does not, nor does the rule without it. The best state is restored."""
    from skattention._engine import EarlyStopping, WindowRule
    from skattention._engine._training import TrainingHistory

    def run(losses, window):
        it = iter(losses)
        rule = EarlyStopping(3, 1e-4, validate=lambda: (0.0, next(it)),
                             snapshot=lambda: "state", restore=lambda state: None,
                             window=window)
        history = TrainingHistory()
        for epoch in range(len(losses)):
            if rule.on_epoch_end(history):
                return epoch + 1
        return None

    plateau = [1.0, 0.9, 0.8, 0.7995, 0.799, 0.7985, 0.798, 0.7975]  # 0.06% an epoch
    steady = [1.0, 0.9, 0.8, 0.797, 0.794, 0.791, 0.788, 0.785]      # 0.4% an epoch
    # the window of epochs 4-6 improved 0.8 by 0.19%, 5-7 improved 0.7995 by 0.19%...: a
    # 2e-3 share stops the plateau at the sixth epoch, never the steady gain
    assert run(plateau, WindowRule(2e-3)) == 6
    assert run(steady, WindowRule(2e-3)) is None
    assert run(plateau, None) is None


def test_early_stopping_on_a_window_gain_within_the_validation_rows_noise():
    """``WindowRule(gain, z)``: a window whose gain is below ``z`` paired standard errors of
    its per-row gains stops, however large its share; the same gain carried by every row
    alike does not (a steady real gain); without per-row losses the share alone decides."""
    from skattention._engine import EarlyStopping, WindowRule
    from skattention._engine._training import TrainingHistory

    rng = np.random.default_rng(0)
    base = torch.as_tensor(rng.uniform(0.5, 1.5, size=400))

    def run(noise, rows=True):
        # a 1% gain an epoch of the total, on every row alike plus per-row noise of the given
        # size that leaves the total as it is
        noises = [torch.as_tensor(rng.normal(size=400)) for _ in range(8)]
        epochs = [base * (1 - 0.01 * e) + noise * (n - n.mean()) for e, n in enumerate(noises)]
        it = iter(epochs)

        def validate():
            losses = next(it) / 400
            return (0.0, float(losses.sum()), losses) if rows else (0.0, float(losses.sum()))

        rule = EarlyStopping(3, 1e-4, validate=validate, snapshot=lambda: "state",
                             restore=lambda state: None, window=WindowRule(2e-3, 2.0))
        history = TrainingHistory()
        for epoch in range(len(epochs)):
            if rule.on_epoch_end(history):
                return epoch + 1
        return None

    assert run(noise=0.0) is None
    assert run(noise=1.0) == 4  # the first window's 3% gain is within the rows' noise
    assert run(noise=1.0, rows=False) is None


@pytest.mark.parametrize("kind", ["tabular", "linear"])
@pytest.mark.parametrize("weighted", [False, True])
def test_candidates_with_equal_rows_as_one_key_give_the_step_s_loss_and_gradients(
        kind, weighted):
    """``row_groups``: a step's other candidates with equal rows become one key carrying their
    summed weight and mean values: the step's loss and gradients are the same (float64, up to
    rounding: the keys are centred on the mean of other candidates, and a distance of 0 comes
    out of the product form as the root of a rounding error), over fewer keys."""
    g = torch.Generator().manual_seed(0)
    distinct = torch.randn(30, 3, generator=g, dtype=torch.float64)
    groups = torch.randint(30, (400,), generator=g)
    X = distinct[groups]
    labels = (X[:, 0] + 0.5 * torch.randn(400, generator=g, dtype=torch.float64) > 0).long()
    values = torch.nn.functional.one_hot(labels, 2).double()
    weight = (torch.rand(400, generator=g, dtype=torch.float64) + 0.5 if weighted
              else torch.ones(400, dtype=torch.float64))
    torch.manual_seed(0)
    if kind == "tabular":
        metric_map = build_map("tabular", n_components=3, n_numeric=3, cardinalities=[])
    else:
        metric_map = build_map(kind, np.eye(3))
    metric_map = metric_map.double()
    log_t = torch.tensor(-0.5, dtype=torch.float64, requires_grad=True)
    params = [*metric_map.parameters(), log_t]
    optimizer = Adam([{"params": params}], lr=0.1)
    batch = torch.arange(40)

    def step(row_groups):
        run = _metric_training._MinibatchStep(
            metric_map, log_t, X, values, "log_loss", weight,
            _metric_training.key_log_prior(weight), 300, torch.Generator().manual_seed(0),
            optimizer, row_groups, metric_map.training_images([X], 300))
        if row_groups is not None:  # the 360 other candidates as at most 30 keys
            assert run._merged(torch.arange(400), 40)[0].numel() <= 40 + 30
        loss, _ = run(batch)
        return loss, [p.grad.clone() for p in params]

    merged_loss, merged_grads = step(groups)
    loss, grads = step(None)
    assert merged_loss == pytest.approx(loss, rel=1e-9)
    for a, b in zip(merged_grads, grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)


def test_equal_rows_are_not_merged_when_every_point_is_a_candidate():
    """With every point a candidate the minibatch is not the candidates' head: nothing is
    merged (each point must stay apart to be excluded from its own keys), and a group whose
    drawn rows all weigh 0 is left out rather than divided by 0."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(10, 2, generator=g, dtype=torch.float64)[torch.randint(10, (200,),
                                                                           generator=g)]
    groups = torch.unique(X, dim=0, return_inverse=True)[1]
    values = torch.nn.functional.one_hot((X[:, 0] > 0).long(), 2).double()
    weight = torch.ones(200, dtype=torch.float64)
    weight[groups == groups[150]] = 0.0  # every copy of one row weighs 0
    metric_map = build_map("linear", np.eye(2)).double()
    log_t = torch.tensor(0.0, dtype=torch.float64, requires_grad=True)
    optimizer = Adam([{"params": [*metric_map.parameters(), log_t]}], lr=0.1)
    log_prior = _metric_training.key_log_prior(weight)
    for n_candidates in (200, 120):
        run = _metric_training._MinibatchStep(
            metric_map, log_t, X, values, "log_loss", weight, log_prior, n_candidates,
            torch.Generator().manual_seed(0), optimizer, groups,
            metric_map.training_images([X], n_candidates))
        loss, _ = run(torch.arange(20))
        assert np.isfinite(loss)
    rows, merged_values, prior = run._merged(torch.arange(200), 20)
    assert bool(torch.isfinite(merged_values).all()) and not bool(torch.isnan(prior).any())
    assert rows.numel() < 200 and not bool((groups[rows[20:]] == groups[150]).any())


@pytest.mark.parametrize("n_components, workers", [(64, 2), (8, 1)])
def test_the_updates_of_steps_on_workers_run_on_one_thread(monkeypatch, n_components, workers):
    """Steps large enough for workers (``recomputed_step``): the optimizer's updates between
    them run on one torch thread (a parallel region there left OpenMP's thread spinning on the
    workers' cores), the steps' and the validations' workers are the caller's thread count
    and the callbacks run on the caller's threads (a loop of small steps, ``SMALL_STEP_WORK``:
    all on one thread, as before); the caller's count is restored, and the model is the one
    trained with updates on the caller's threads."""
    from skattention._engine._one_block import RECOMPUTED_MIN_PAIRS
    from skattention._engine._optimizers import Adam as EngineAdam
    from skattention._engine._training import Callback

    g = torch.Generator().manual_seed(0)
    X = torch.randn(2400, 3, generator=g)
    values = torch.nn.functional.one_hot((X[:, 0] > 0).long(), 2).float()
    batch, candidates = 1024, RECOMPUTED_MIN_PAIRS // 1024

    def fit(one_thread_updates=True):
        seen = {"callbacks": [], "workers": [], "updates": []}

        class Threads(Callback):
            def on_epoch_end(self, history):
                seen["callbacks"].append(torch.get_num_threads())
                return False

        real_workers, real_step = _metric_training.chunk_workers, EngineAdam.step

        def chunk_workers(n):
            seen["workers"].append(n)
            return real_workers(n)

        def step(self):
            seen["updates"].append(torch.get_num_threads())
            return real_step(self)

        with monkeypatch.context() as m:
            m.setattr(_metric_training, "chunk_workers", chunk_workers)
            m.setattr(EngineAdam, "step", step)
            if not one_thread_updates:
                m.setattr(_metric_training, "_OneThreadUpdates", lambda optimizer: optimizer)
            torch.manual_seed(0)
            metric_map = build_map("tabular", n_components=n_components, n_numeric=3)
            train_metric(
                metric_map, torch.tensor(0.0), X[:2100], values[:2100], "log_loss",
                torch.ones(2100), validation=(X[2100:], values[2100:], torch.ones(300)),
                max_iter=2, batch_size=batch, n_candidates=candidates, learning_rate=5e-2,
                weight_decay=0.0, n_iter_no_change=100, tol=0.0,
                generator=torch.Generator().manual_seed(0), callbacks=[Threads()],
            )
        return metric_map.state_dict(), seen

    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        state, seen = fit()
        assert torch.get_num_threads() == 2
        on_caller_threads, _ = fit(one_thread_updates=False)
    finally:
        torch.set_num_threads(previous)
    assert seen["updates"] and set(seen["updates"]) == {1}
    assert seen["callbacks"] == [workers, workers]
    assert seen["workers"] and set(seen["workers"]) == {workers}  # steps and validations
    assert all(torch.equal(state[k], on_caller_threads[k]) for k in state)
