"""The tabular recipe (issue 15): the tabular map, its numeric embedding rule, the training
defaults and the temperature calibrated on the validation split."""

import math

import numpy as np
import pytest
import torch

from skattention import MetricAttentionClassifier, MetricAttentionRegressor
from skattention._engine import build_map, calibrate_temperature
from skattention.neighbors import _learned, _summary, _training_rows

pd = pytest.importorskip("pandas")


def _frame(n, seed=0):
    rng = np.random.default_rng(seed)
    X = pd.DataFrame({
        "x1": rng.normal(size=n),
        "x2": rng.normal(size=n),
        "plan": rng.choice(["a", "b", "c"], n).astype(object),
    })
    y = np.where(np.sin(3 * X["x1"]) + (X["plan"] == "a") > 0.5, "yes", "no")
    return X, y


@pytest.mark.parametrize("numeric_embedding", ["plr", "none"])
def test_tabular_map_is_the_documented_formula(numeric_embedding):
    torch.manual_seed(0)
    phi = build_map("tabular", n_components=5, n_numeric=2, cardinalities=[4, 3],
                    numeric_embedding=numeric_embedding)
    with torch.no_grad():
        phi.embedding.weight.normal_()
    assert (phi.n_features, phi.n_components, phi.kind) == (4, 5, "euclidean")
    x = torch.tensor([[0.3, -1.2, 2.0, 1.0], [1.5, 0.0, 3.0, 2.0]])
    numbers = x[:, :2]
    if numeric_embedding == "plr":
        z = 2 * math.pi * phi.frequencies * numbers[..., None]
        numbers = torch.relu(phi.periodic(torch.cat([z.cos(), z.sin()], -1))).flatten(1)
        assert phi.frequencies.shape == (2, 24) and phi.periodic.out_features == 12
    codes = x[:, 2:].long()
    expected = (phi.linear(numbers) + phi.embedding.weight[codes[:, 0]]
                + phi.embedding.weight[4 + codes[:, 1]])
    torch.testing.assert_close(phi(x), expected)


def test_unseen_and_missing_codes_start_neutral():
    torch.manual_seed(0)
    phi = build_map("tabular", n_components=3, n_numeric=1, cardinalities=[5])
    x = torch.tensor([[0.5, 0.0], [0.5, 1.0]])  # missing, unseen
    torch.testing.assert_close(phi(x), phi(torch.tensor([[0.5, 0.0]])).expand(2, -1))
    none = build_map("tabular", n_components=3, n_numeric=0, cardinalities=[4])
    assert none(torch.tensor([[2.0]])).shape == (1, 3)


@pytest.mark.parametrize("n, expected", [(1499, "none"), (1500, "plr")])
def test_numeric_embedding_auto_follows_the_training_size(n, expected):
    X, y = _frame(n)
    clf = MetricAttentionClassifier(max_iter=1, random_state=0).fit(X, y)
    assert clf.map_.numeric_embedding == expected
    forced = {"none": "plr", "plr": "none"}[expected]
    clf = MetricAttentionClassifier(max_iter=1, numeric_embedding=forced, random_state=0)
    assert clf.fit(X, y).map_.numeric_embedding == forced


def test_tabular_map_embeds_category_codes_not_one_hot():
    X, y = _frame(200)
    clf = MetricAttentionClassifier(max_iter=2, random_state=0).fit(X, y)
    assert clf.map_.n_features == 3 and clf.map_.n_components == 64
    assert clf.map_.embedding.num_embeddings == 5  # levels a, b, c + missing + unseen
    queries = X.iloc[:3].assign(plan=["a", "zzz", None])  # a level, unseen, missing
    assert np.isfinite(clf.predict_proba(queries)).all()


class _Stop(Exception):
    pass


def _stop_training(*args, **kwargs):
    raise _Stop


def _train_metric_arguments(monkeypatch, model, X, y):
    """The keyword arguments ``model.fit(X, y)`` passes to ``train_metric`` (stopped there)."""
    seen = {}

    def capture(*args, **kwargs):
        seen.update(kwargs)
        raise _Stop

    monkeypatch.setattr(_learned, "train_metric", capture)
    with pytest.raises(_Stop):
        model.fit(X, y)
    return seen


# n samples -> 15% validation (rounded up, at most 4,096) -> n_train = 200, 300, 2000, 10000,
# 20000 and 95904 training points
@pytest.mark.parametrize("n, batch, candidates, validation_keys", [
    (236, 200, 200, 2048),             # one minibatch of everything
    (353, 256, 256 + 22, 2048),        # the minibatch and half of the 44 others
    (2353, 256, 512, 2048),            # the minibatch and 256 others
    (11765, 256, 512, 2048),
    # more than 16,384 training points: minibatches of 1,024 and a sixteenth of the points
    # (at most 8,192) as other candidates; validation over 8,192 of them
    (23530, 1024, 1024 + 1250, 8192),
    (100000, 1024, 1024 + 5994, 8192),
])
def test_training_defaults(monkeypatch, n, batch, candidates, validation_keys):
    X, y = _frame(n)
    seen = _train_metric_arguments(monkeypatch, MetricAttentionClassifier(random_state=0), X, y)
    assert (seen["batch_size"], seen["n_candidates"]) == (batch, candidates)
    assert seen["tol"] == 1e-4
    explicit = MetricAttentionClassifier(tol=0.5, random_state=0)
    assert _train_metric_arguments(monkeypatch, explicit, X, y)["tol"] == 0.5
    assert seen["learning_rate"] == 1e-2 and seen["weight_decay"] == 2e-4
    assert seen["n_iter_no_change"] == 3 and seen["max_validation_keys"] == validation_keys
    assert seen["average"] == 0.9
    assert len(seen["validation"][0]) == min(math.ceil(0.15 * n), 4096)


def test_explicit_batch_and_sample_rate_are_kept_at_scale(monkeypatch):
    X, y = _frame(23530)
    model = MetricAttentionClassifier(batch_size=128, sample_rate=0.01, random_state=0)
    seen = _train_metric_arguments(monkeypatch, model, X, y)
    assert (seen["batch_size"], seen["n_candidates"]) == (128, 200)


@pytest.mark.parametrize("n, kept", [(2000, ["a", "b", "c", "rare"]), (20000, ["a", "b", "c"])])
def test_rare_levels_share_the_unseen_code_on_large_tables(monkeypatch, n, kept):
    # above 16,384 rows a level seen fewer than 20 times is coded as unseen (its own code
    # below); the map's embedding then has no vector of its own for it
    monkeypatch.setattr(_learned, "train_metric", _stop_training)
    X, y = _frame(n)
    X.loc[: 18, "plan"] = "rare"  # 19 rows
    est = MetricAttentionClassifier(random_state=0)
    with pytest.raises(_Stop):
        est.fit(X, y)
    encoder = est._strategy.input.encoder
    assert encoder.categories_[0].tolist() == kept
    codes = encoder.transform(X.iloc[:19]).categories[:, 0]
    assert (codes == (1 if n > 16384 else 5)).all()  # 1: unseen or rare; 5: the 4th level


def test_temperature_is_calibrated_on_a_bounded_sample(monkeypatch):
    seen = []

    def spy(metric_map, log_t, X, values, weight, validation, loss, keys=None):
        seen.append(validation[0].shape[0])

    monkeypatch.setattr(_summary, "calibrate_temperature", spy)
    monkeypatch.setattr(_training_rows, "_CALIBRATION_ROWS", 50)
    X, y = _frame(1000)
    MetricAttentionClassifier(max_iter=1, random_state=0).fit(X, y)
    assert seen == [50]  # of the 150 validation rows
    monkeypatch.setattr(_training_rows, "_CALIBRATION_ROWS", 2048)
    MetricAttentionClassifier(max_iter=1, random_state=0).fit(X, y)
    assert seen == [50, 150]




def test_calibrated_temperature_minimises_the_validation_loss():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(300, 4, generator=g)
    labels = (X[:, 0] + 0.5 * torch.randn(300, generator=g) > 0).long()
    values = torch.nn.functional.one_hot(labels, 2).float()
    phi = build_map("tabular", n_components=4, n_numeric=4, cardinalities=[],
                    numeric_embedding="none")
    train, val = slice(0, 200), slice(200, 300)
    weight = torch.ones(300)
    log_t = torch.tensor(0.0)
    validation = (X[val], values[val], weight[val])
    best = calibrate_temperature(phi, log_t, X[train], values[train], weight[train],
                                 validation, "log_loss")

    @torch.no_grad()
    def loss_at(t):
        # the validation log-loss with one pseudo-error: the likeliest wrong class of any point
        pred = torch.softmax(-torch.cdist(phi(X[val]), phi(X[train])) / t, 1) @ values[train]
        losses = -torch.log((pred * values[val]).sum(1))
        wrong = pred.masked_fill(values[val] > 0, 0.0).max()
        return float((losses.sum() - torch.log(wrong)) / (len(losses) + 1))

    t = float(torch.exp(log_t))
    assert t != 1.0
    assert best == pytest.approx(loss_at(t), rel=1e-4)
    for factor in [0.5, 0.8, 1.25, 2.0]:
        assert best <= loss_at(t * factor) + 1e-6


def test_a_perfectly_separated_validation_split_keeps_a_finite_temperature():
    # Validation points all far on their class's side: their log-loss alone falls towards 0
    # as T -> 0, and the test set's rare errors would then get probabilities near 0. The one
    # pseudo-error of the calibration (its likeliest wrong class) keeps T where that error
    # would still cost little.
    g = torch.Generator().manual_seed(2)
    labels = torch.arange(120) % 2
    X = torch.randn(120, 2, generator=g) * 0.3
    X[:, 0] += 3.0 * labels
    values = torch.nn.functional.one_hot(labels, 2).float()
    phi = build_map("tabular", n_components=2, n_numeric=2, cardinalities=[],
                    numeric_embedding="none")
    with torch.no_grad():
        phi.linear.weight.copy_(torch.eye(2))
        phi.linear.bias.zero_()
    weight = torch.ones(120)
    log_t = torch.tensor(0.0)
    calibrate_temperature(phi, log_t, X[:80], values[:80], weight[:80],
                          (X[80:], values[80:], weight[80:]), "log_loss")
    with torch.no_grad():
        pred = torch.softmax(-torch.cdist(X[80:], X[:80]) / torch.exp(log_t), 1) @ values[:80]
    assert (pred.argmax(1) == labels[80:]).all()  # the split is perfectly separated
    # the likeliest wrong class keeps a probability a test error would not be ruined by
    assert float(pred.masked_fill(values[80:] > 0, 0.0).max()) > 1e-3
    assert float(log_t) > -2.0


def test_duplicated_rows_train_finite():
    # business tables repeat rows: distance 0 between them must not poison training
    X, y = _frame(150)
    X, y = pd.concat([X] * 4, ignore_index=True), np.tile(y, 4)
    clf = MetricAttentionClassifier(max_iter=5, random_state=0).fit(X, y)
    assert np.isfinite(clf.loss_curve_).all() and np.isfinite(clf.predict_proba(X)).all()
    reg = MetricAttentionRegressor(max_iter=5, random_state=0).fit(X, X["x1"] * 2)
    assert np.isfinite(reg.predict(X)).all()


def test_temperature_is_calibrated_only_when_auto():
    X, y = _frame(300)
    fixed = MetricAttentionClassifier(max_iter=3, temperature=0.7, random_state=0).fit(X, y)
    assert fixed.temperature_ == pytest.approx(0.7)
    auto = MetricAttentionClassifier(max_iter=3, random_state=0).fit(X, y)
    assert auto.temperature_ != 1.0
    no_validation = MetricAttentionClassifier(max_iter=3, early_stopping=False, random_state=0)
    assert no_validation.fit(X, y).temperature_ == 1.0  # trained at T = 1, nothing to calibrate


def test_calibration_without_room_for_the_scores_gives_the_same_temperature():
    # Calibration keeps the validation x training scores when they fit the working memory and
    # re-runs attention for each candidate temperature otherwise: the same choice either way.
    import skattention

    g = torch.Generator().manual_seed(1)
    X = torch.randn(300, 4, dtype=torch.float64, generator=g)
    labels = (X[:, 0] + 0.5 * torch.randn(300, generator=g, dtype=torch.float64) > 0).long()
    values = torch.nn.functional.one_hot(labels, 2).double()
    phi = build_map("tabular", n_components=4, n_numeric=4, cardinalities=[],
                    numeric_embedding="none").double()
    weight = torch.ones(300, dtype=torch.float64)
    validation = (X[200:], values[200:], weight[200:])
    chosen = []
    for working_memory in [256, 0.05]:
        log_t = torch.tensor(0.0, dtype=torch.float64)
        with skattention.config_context(working_memory=working_memory):
            loss = calibrate_temperature(phi, log_t, X[:200], values[:200], weight[:200],
                                         validation, "log_loss")
        chosen.append((float(log_t), loss))
    assert chosen[0][0] == pytest.approx(chosen[1][0], abs=1e-9)
    assert chosen[0][1] == pytest.approx(chosen[1][1], rel=1e-9)


@pytest.mark.parametrize("cardinalities", [(), (3, 5)])
def test_the_inference_copy_maps_as_the_map_does(cardinalities):
    # the inference copy computes 2 pi w once (it is not trained); the map itself, trained
    # further, keeps computing it from its frequencies. The two evaluate the same expression
    # in a different order of operations, which CPUs' vector paths round differently (equal
    # on some x86 CPUs, a few ulps apart on others): compared to float32 rounding, while the
    # change of frequencies below moves the images by orders of magnitude more.
    torch.manual_seed(0)
    metric_map = build_map("tabular", n_components=8, n_numeric=4, cardinalities=cardinalities)
    codes = [torch.randint(0, c, (9, 1)).float() for c in cardinalities]
    x = torch.cat([torch.randn(9, 4), *codes], 1)
    copy = metric_map.for_inference(torch.device("cpu"), torch.float32)
    close = {"rtol": 1e-5, "atol": 1e-6}
    with torch.no_grad():
        torch.testing.assert_close(copy(x), metric_map(x), **close)
        metric_map.frequencies.mul_(2.0)
        assert (copy(x) - metric_map(x)).abs().max() > 1e-2
        torch.testing.assert_close(
            metric_map.for_inference(torch.device("cpu"), torch.float32)(x), metric_map(x),
            **close)


@pytest.mark.parametrize("threads", [1, 2])
def test_tabulated_training_images_are_the_maps(threads):
    # Columns of 2, 9, 40 and 1,500 distinct values and a continuous one, over a training matrix
    # and a validation matrix that holds values the training one lacks: the few-valued
    # columns' terms, the gathered features and the per-row features together give the map's
    # images and gradients up to rounding, and the same bits from call to call (float32 on
    # two threads: sums that indexing's accumulating put would add in varying order).
    g = torch.Generator().manual_seed(0)

    def matrix(n):
        columns = [torch.randint(0, u, (n,), generator=g).float() / u for u in (2, 9, 40, 1500)]
        codes = torch.randint(0, 4, (n, 1), generator=g).float()
        return torch.cat([torch.stack(columns, 1), torch.randn(n, 1, generator=g), codes], 1)

    torch.manual_seed(0)
    metric_map = build_map("tabular", n_components=8, n_numeric=5, cardinalities=[4])
    X, X_val = matrix(8000), matrix(500)
    images = metric_map.training_images([X, X_val], 4000)
    assert (images.n_few, images.per_row.tolist(), images.rest.tolist()) == (2, [2, 3, 4], [4])
    rows = torch.randint(0, 8000, (2000,), generator=g)
    target = torch.randn(2000, 8, generator=g)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gradients = []
        for images_of in (lambda: metric_map(X[rows]), lambda: images(0, rows),
                          lambda: images(0, rows)):
            metric_map.zero_grad()
            ((images_of() - target) ** 2).sum().backward()
            gradients.append([p.grad.clone() for p in metric_map.parameters()])
    finally:
        torch.set_num_threads(previous)
    with torch.no_grad():
        torch.testing.assert_close(images(0, rows), metric_map(X[rows]))
        torch.testing.assert_close(images(1), metric_map(X_val))
    for mapped, tabulated, again in zip(*gradients, strict=True):
        assert float((tabulated - mapped).norm()) <= 1e-4 * float(mapped.norm())
        assert torch.equal(tabulated, again)


def test_continuous_numbers_are_mapped_row_by_row():
    torch.manual_seed(0)
    metric_map = build_map("tabular", n_components=4, n_numeric=2, cardinalities=[])
    X = torch.randn(2000, 2)
    assert type(metric_map.training_images([X], 1000)).__name__ == "MappedRows"
    none = build_map("tabular", n_components=4, n_numeric=2, numeric_embedding="none")
    assert type(none.training_images([X.round()], 1000)).__name__ == "MappedRows"
