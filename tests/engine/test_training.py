"""The training loop's averaged parameters (``train_metric(average=...)``)."""

import numpy as np
import torch

from skattention._engine import build_map, train_metric
from skattention._engine._training import Adam, _AveragingOptimizer


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
    stepper = _AveragingOptimizer(Adam([param], lr=0.1), [param], 0.8)
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
