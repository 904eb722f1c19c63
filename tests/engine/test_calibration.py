"""The temperature calibration's search and its scores (``_engine._calibration``)."""

import math

import numpy as np
import pytest
import torch

from skattention._engine._calibration import _lattice_minimum, calibrate_temperature


def _grid_minimum(losses, centre_loss):
    """The reference: every grid point scored, the first lowest kept if below the centre."""
    i = min((i for i in range(len(losses)) if i != len(losses) // 2), key=losses.__getitem__)
    return (i, losses[i]) if losses[i] < centre_loss else (len(losses) // 2, centre_loss)


@pytest.mark.parametrize("seed", range(40))
def test_the_outward_search_finds_the_grid_minimum_of_a_valley(seed):
    rng = np.random.default_rng(seed)
    n_steps = int(rng.integers(1, 6))
    points = np.arange(-n_steps, n_steps + 1)
    # a valley whose floor may be at any point, flat stretches (ties) included
    floor = rng.integers(-n_steps - 1, n_steps + 2)
    losses = list(np.round(np.abs(points - floor) * rng.uniform(0.5, 2), 1) + 1.0)
    scored = []

    def losses_at(xs):
        scored.extend(xs)
        return [losses[round(x) + n_steps] for x in xs]

    point, loss = _lattice_minimum(losses_at, 0.0, losses[n_steps], 1.0, n_steps)
    i, expected = _grid_minimum(losses, losses[n_steps])
    assert (point, loss) == (i - n_steps, expected)
    assert 0.0 not in scored  # the centre's loss is given


def test_both_neighbours_lower_scores_the_whole_grid():
    losses = [5.0, 0.5, 2.0, 4.0, 2.0, 1.0, 3.0]  # centre 4.0, a lower point on each side
    point, loss = _lattice_minimum(lambda xs: [losses[round(x) + 3] for x in xs], 0.0, 4.0,
                                   1.0, 3)
    assert (point, loss) == (-2.0, 0.5)


class _Identity:
    kind = "euclidean"

    def eval(self):
        return self

    key = query = staticmethod(lambda X: X)
    chunked_keys = staticmethod(lambda X, max_rows=None: X)


@pytest.mark.parametrize("threads", [1, 2])
def test_calibration_does_not_depend_on_the_number_of_threads_or_the_budget(threads):
    from skattention import config_context

    g = torch.Generator().manual_seed(0)
    X = torch.randn(3000, 4, generator=g)
    y = torch.nn.functional.one_hot((X[:, 0] > 0).long(), 2).double()
    Xv = torch.randn(700, 4, generator=g, dtype=torch.float64)
    yv = torch.nn.functional.one_hot((Xv[:, 0] > 0).long(), 2).double()
    X = X.double()
    results = []
    for working_memory in (256, 1):  # every row's scores in one block / many blocks
        log_t = torch.tensor(0.0, dtype=torch.float64)
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            with config_context(working_memory=working_memory):
                loss = calibrate_temperature(_Identity(), log_t, X, y, torch.ones(3000),
                                             (Xv, yv, torch.ones(700)), "log_loss")
        finally:
            torch.set_num_threads(previous)
        results.append((float(log_t), loss))
    assert results[0][0] == results[1][0]
    assert math.isclose(results[0][1], results[1][1], rel_tol=1e-12)
    assert -2.5 < results[0][0] < 2.5  # a minimum inside the grid, not its edge


@pytest.mark.parametrize("threads", [1, 2])
def test_calibration_over_grouped_keys_with_every_group_near_is_over_every_key(threads):
    """With every group near, attention over grouped keys is attention over every key: the
    calibration over them finds the same temperature, whatever the threads (blocks on the
    engine's workers) and the budget (scores kept across the grids, or computed per grid)."""
    from skattention import config_context
    from skattention._engine import group_keys

    g = torch.Generator().manual_seed(1)
    X = torch.randn(2000, 3, generator=g, dtype=torch.float64)
    noise = torch.randn(2600, generator=g, dtype=torch.float64)  # labels that overlap
    y = torch.nn.functional.one_hot((X[:, 0] + noise[:2000] > 0).long(), 2).double()
    Xv = torch.randn(600, 3, generator=g, dtype=torch.float64)
    yv = torch.nn.functional.one_hot((Xv[:, 0] + noise[2000:] > 0).long(), 2).double()
    weight = torch.rand(2000, generator=g, dtype=torch.float64) + 0.5
    validation = (Xv, yv, torch.ones(600, dtype=torch.float64))
    centres = X[torch.randperm(2000, generator=g)[:10]]
    grouped = group_keys(X, y, torch.log(weight), centres, "euclidean", 10)
    assert grouped.n_near == grouped.n_groups
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        exact_t = torch.tensor(0.0, dtype=torch.float64)
        exact = calibrate_temperature(_Identity(), exact_t, X, y, weight, validation,
                                      "log_loss")
        found = []
        for working_memory in (256, 0.5):  # every block's scores kept / recomputed per grid
            log_t = torch.tensor(0.0, dtype=torch.float64)
            with config_context(working_memory=working_memory):
                loss = calibrate_temperature(_Identity(), log_t, X, y, weight, validation,
                                             "log_loss", keys=grouped)
            found.append((float(log_t), loss))
    finally:
        torch.set_num_threads(previous)
    for log_t, loss in found:
        assert log_t == pytest.approx(float(exact_t), abs=1e-9)
        assert loss == pytest.approx(exact, rel=1e-9)
    assert -2.5 < float(exact_t) < 2.5


@pytest.mark.parametrize("start", [-999.0, 999.0])
def test_calibration_starts_inside_the_range_from_a_diverged_temperature(start):
    # a training that diverged (learning_rate=1000) left log T at -999: the grid's exp
    # overflowed (OverflowError); the search starts from the clamped value instead
    g = torch.Generator().manual_seed(0)
    X = torch.randn(300, 3, generator=g)
    y = torch.nn.functional.one_hot((X[:, 0] > 0).long(), 2).float()
    log_t = torch.tensor(start)
    loss = calibrate_temperature(_Identity(), log_t, X, y, torch.ones(300),
                                 (X[:100], y[:100], torch.ones(100)), "log_loss")
    assert math.isfinite(loss)
    assert -44 < float(log_t) < 45  # float32's range, halved: [-43.7, 44.4]


def test_grouped_scores_are_kept_where_the_near_keys_fit_though_their_bound_does_not(
        monkeypatch):
    """The blocks' scores are kept across the grids where the keys their queries have near fit
    the budget, though the largest groups' bound (which sizes the blocks) does not: each query
    scored once, the same temperature as where every grid scores them again."""
    from skattention import config_context
    from skattention._engine import _calibration, group_keys
    from skattention._engine._near_far import near_far_bytes, near_far_scores

    g = torch.Generator().manual_seed(2)
    # most keys in one cluster far from the queries (the largest group, near none of them)
    X = torch.cat([torch.randn(1500, 3, generator=g, dtype=torch.float64) * 0.1 + 50,
                   torch.randn(500, 3, generator=g, dtype=torch.float64) * 3])
    y = torch.nn.functional.one_hot((X[:, 0] > 0).long(), 2).double()
    Xv = torch.randn(600, 3, generator=g, dtype=torch.float64) * 3
    yv = torch.nn.functional.one_hot((Xv[:, 0] > 0).long(), 2).double()
    validation = (Xv, yv, torch.ones(600, dtype=torch.float64))
    weight = torch.ones(2000, dtype=torch.float64)
    centres = torch.cat([X[:1], X[1500:1540]])
    grouped = group_keys(X, y, torch.log(weight), centres, "euclidean", 3)
    actual = near_far_bytes(grouped, 600, near_far_scores(Xv, grouped).near.shape[1])
    bound = near_far_bytes(grouped, 600)
    assert actual < bound / 2
    scored = []

    def counted(queries, keys):
        scored.append(queries.shape[0])
        return near_far_scores(queries, keys)

    monkeypatch.setattr(_calibration, "near_far_scores", counted)
    found = []
    for working_memory in ((actual + bound) / 2 / 2**20, 0.01):
        scored.clear()
        log_t = torch.tensor(0.0, dtype=torch.float64)
        with config_context(working_memory=working_memory):
            loss = calibrate_temperature(_Identity(), log_t, X, y, weight, validation,
                                         "log_loss", keys=grouped)
        found.append((float(log_t), loss, sum(scored)))
    assert found[0][2] == 600  # each query scored once, the blocks kept
    assert found[1][2] > 600  # too little memory: scored again at each grid
    assert found[0][0] == found[1][0]
    assert found[0][1] == pytest.approx(found[1][1], rel=1e-12)  # other blocks: other sums
