"""Many training points (issue 34): epochs of a bounded number of points, a bounded validation
split, calibration scored per block of queries, and dense attention over prototypes of the
keys."""

import pickle

import numpy as np
import pytest
import torch
from sklearn import config_context
from sklearn.datasets import make_classification, make_regression

from skattention import MetricAttentionClassifier, MetricAttentionRegressor
from skattention._engine import build_map, calibrate_temperature
from skattention._engine._training import EpochBatches
from skattention.neighbors import _distinct_rows, _learned, _summary, _training_rows
from skattention.neighbors._distinct_rows import unique_row_ids

FAST = {"max_iter": 3, "random_state": 0}
pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


@pytest.fixture
def small_auto(monkeypatch):
    """prototypes="auto" at the sizes of a test: from 100 keys, 20 prototypes, each query exact
    over its 4 nearest groups."""
    monkeypatch.setattr(_summary, "MIN_KEYS", 100)
    monkeypatch.setattr(_summary, "AUTO_PROTOTYPES", 20)
    monkeypatch.setattr(_summary, "PROTOTYPES_PER_ROOT", 2.0)
    monkeypatch.setattr(_summary, "NEAR_GROUPS", 4)
    return monkeypatch


def _data(n=400, seed=0):
    return make_classification(n, 6, n_informative=4, random_state=seed)


def test_few_points_use_every_key():
    X, y = _data()
    clf = MetricAttentionClassifier(**FAST).fit(X, y)
    assert clf.n_prototypes_ is None and clf.prototype_error_ is None
    exact = MetricAttentionClassifier(prototypes=None, **FAST).fit(X, y)
    np.testing.assert_array_equal(clf.predict_proba(X), exact.predict_proba(X))


def _near_far_reference(Z, keys, onehot, labels, temperature, n_near):
    """Attention of ``Z`` in float64: every key of a query's ``n_near`` nearest groups (by the
    distance to the groups' prototypes, the means of their keys) and the other groups through
    their prototypes (the mean labels, the log of the count)."""
    groups = np.unique(labels)
    points = np.stack([keys[labels == g].mean(0) for g in groups])
    values = np.stack([onehot[labels == g].mean(0) for g in groups])
    counts = np.array([np.sum(labels == g) for g in groups], dtype=np.float64)
    group_of = np.searchsorted(groups, labels)
    out = np.empty((len(Z), onehot.shape[1]))
    for i, z in enumerate(Z):
        to_groups = np.linalg.norm(points - z, axis=1)
        near = np.argsort(to_groups, kind="stable")[:n_near]
        far = np.setdiff1d(np.arange(len(groups)), near)
        exact = np.isin(group_of, near)
        logits = np.concatenate([-to_groups[far] / temperature + np.log(counts[far]),
                                 -np.linalg.norm(keys[exact] - z, axis=1) / temperature])
        w = np.exp(logits - logits.max())
        out[i] = w @ np.vstack([values[far], onehot[exact]]) / w.sum()
    return out


@pytest.mark.parametrize("n_near", [0, 4, 100])
def test_prototypes_are_what_predict_attends_to(monkeypatch, n_near):
    monkeypatch.setattr(_summary, "NEAR_GROUPS", n_near)
    X, y = _data()
    # float64: a query at a key's place is at distance ~1e-3 in float32 (the product form's
    # rounding under the root), in float64 at ~1e-8, as in the reference
    clf = MetricAttentionClassifier(prototypes=30, dtype="float64", **FAST).fit(X, y)
    exact = MetricAttentionClassifier(prototypes=None, dtype="float64", **FAST).fit(X, y)
    # training is the same: the prototypes come after it
    for a, b in zip(clf.map_.parameters(), exact.map_.parameters(), strict=True):
        assert torch.equal(a, b)
    assert 1 <= clf.n_prototypes_ <= 30
    assert 0 <= clf.prototype_error_ < 1
    # predict_proba: exact over the keys of a query's n_near nearest groups (groups: the keys
    # nearest to each drawn centre), the other groups through their prototypes
    keys = clf._keys.points.astype(np.float64)
    centres = clf._strategy.prototypes.double()
    labels = torch.cdist(torch.as_tensor(keys), centres).argmin(1).numpy()
    assert len(np.unique(labels)) == clf.n_prototypes_
    onehot = (y[:, None] == clf.classes_[None, :]).astype(np.float64)
    blocks = np.vstack(list(clf._strategy.input.blocks(X)))
    Z = clf._strategy.embed(blocks, "query", torch.device("cpu"), torch.float64)
    want = _near_far_reference(Z, keys, onehot, labels, clf.temperature_, n_near)
    np.testing.assert_allclose(clf.predict_proba(X), want, atol=1e-7)
    if n_near >= 30:  # every group near: attention over every key
        np.testing.assert_allclose(clf.predict_proba(X), exact.predict_proba(X), atol=1e-7)
        assert clf.prototype_error_ < 1e-7
    # selections use every key: the same neighbours as the exact model's (the same map)
    np.testing.assert_array_equal(clf.kneighbors(X[:20], 5)[1], exact.kneighbors(X[:20], 5)[1])


def test_prototypes_pickle_and_predict_a_single_row_alike():
    X, y = _data()
    clf = MetricAttentionClassifier(prototypes=30, **FAST).fit(X, y)
    again = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(again.predict_proba(X), clf.predict_proba(X))
    # a query's output does not depend on its batch; a few rows alone are scored at once
    # (rounded otherwise)
    np.testing.assert_array_equal(clf.predict_proba(X[:7]), clf.predict_proba(X)[:7])
    np.testing.assert_allclose(clf.predict_proba(X[3:4]), clf.predict_proba(X)[3:4], rtol=1e-5,
                               atol=1e-7)
    # a training row's distance to itself is the square root of a float32 cancellation, which
    # magnifies any other rounding of its products: alone it is scored by the same kernel as
    # in a batch (padded rows), so its probabilities stay close (a one-row product moved them
    # by up to 2e-3)
    batch = clf.predict_proba(X[:40])
    alone = np.vstack([clf.predict_proba(X[i:i + 1]) for i in range(40)])
    np.testing.assert_allclose(alone, batch, rtol=0, atol=1e-4)


def test_auto_keeps_the_fewest_prototypes_within_the_tolerance(small_auto):
    X, y = _data()
    small_auto.setattr(_summary, "TOLERANCE", 1.0)
    assert MetricAttentionClassifier(**FAST).fit(X, y).n_prototypes_ <= 20
    small_auto.setattr(_summary, "TOLERANCE", 0.0)
    clf = MetricAttentionClassifier(**FAST).fit(X, y)
    assert clf.n_prototypes_ is None and clf.prototype_error_ is None


def test_auto_error_is_measured_against_exact_attention(small_auto):
    small_auto.setattr(_summary, "TOLERANCE", 1.0)
    X, y = make_regression(400, 5, noise=1.0, random_state=0)
    reg = MetricAttentionRegressor(**FAST).fit(X, y)
    assert reg.n_prototypes_ is not None and reg.n_prototypes_ <= 20
    assert reg.prototype_error_ > 0  # 20 prototypes of 340 keys are not exact
    exact = MetricAttentionRegressor(prototypes=None, **FAST).fit(X, y)
    assert exact.n_prototypes_ is None
    assert reg.score(X, y) > 0.5 * exact.score(X, y)


@pytest.mark.parametrize("params", [{"n_neighbors": 5}, {"temperature": 0}])
def test_no_prototypes_for_selections(small_auto, params):
    small_auto.setattr(_summary, "TOLERANCE", 1.0)
    X, y = _data()
    assert MetricAttentionClassifier(**params, **FAST).fit(X, y).n_prototypes_ is None


def test_prototypes_parameter_is_validated():
    X, y = _data(50)
    with pytest.raises(ValueError, match="prototypes"):
        MetricAttentionClassifier(prototypes=0).fit(X, y)
    with pytest.raises(ValueError, match="prototypes"):
        MetricAttentionClassifier(prototypes="all").fit(X, y)


def test_as_many_prototypes_as_training_points_warns_and_attends_to_every_key():
    # the count is compared with the rows the fit trains on (its validation split left out)
    X, y = _data(200)
    with pytest.warns(UserWarning, match="prototypes=190 is not fewer than the 170") as seen:
        clf = MetricAttentionClassifier(prototypes=190, **FAST).fit(X, y)
    assert clf.n_prototypes_ is None
    assert all(w.filename == __file__ for w in seen)  # at the user's line
    assert MetricAttentionClassifier(prototypes=150, **FAST).fit(X, y).n_prototypes_ == 150


def test_epochs_of_bounded_rows_visit_every_point_in_turn():
    g = torch.Generator().manual_seed(0)
    batches = EpochBatches(10, 4, 3, g)
    assert batches.rows == 4
    epochs = [torch.cat(batches()) for _ in range(5)]
    assert all(e.numel() == 4 for e in epochs)
    # the first 10 points drawn are a permutation: each point has its turn before any repeats
    assert sorted(torch.cat(epochs)[:10].tolist()) == list(range(10))
    assert [len(b) for b in batches()] == [3, 1]
    # without a bound: one permutation of every point per epoch, as before
    whole = EpochBatches(10, None, 3, torch.Generator().manual_seed(0))
    assert sorted(torch.cat(whole()).tolist()) == list(range(10))
    assert torch.equal(torch.cat(EpochBatches(10, 50, 3, torch.Generator().manual_seed(1))()),
                       torch.randperm(10, generator=torch.Generator().manual_seed(1)))


def test_epoch_rows_bound_the_steps_of_an_epoch(monkeypatch):
    seen = []
    real = _learned.train_metric

    def spy(*args, **kwargs):
        seen.append(kwargs["epoch_rows"])
        return real(*args, **kwargs)

    monkeypatch.setattr(_learned, "train_metric", spy)
    monkeypatch.setattr(_learned, "_EPOCH_ROWS", 64)
    X, y = _data()
    clf = MetricAttentionClassifier(max_iter=2, random_state=0, batch_size=32).fit(X, y)
    assert seen == [64] and clf.n_iter_ == 2


def test_validation_split_is_bounded(monkeypatch):
    monkeypatch.setattr(_training_rows, "MAX_VALIDATION_ROWS", 25)
    est = MetricAttentionClassifier(validation_fraction=0.5)
    train, val = _training_rows.validation_split(est, 400, None, np.random.RandomState(0))
    assert len(val) == 25 and len(train) == 375


def test_calibration_is_the_same_in_any_number_of_query_blocks():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(600, 4, generator=g)
    labels = (X[:, 0] + 0.5 * torch.randn(600, generator=g) > 0).long()
    values = torch.nn.functional.one_hot(labels, 2).float()
    phi = build_map("tabular", n_components=4, n_numeric=4, cardinalities=[],
                    numeric_embedding="none")
    weight = torch.ones(600)
    validation = (X[400:], values[400:], weight[400:])
    found = []
    for memory in [64, 0.2]:  # MiB: one block of the 200 x 400 scores, or several
        log_t = torch.tensor(0.0)
        with config_context(working_memory=memory):
            loss = calibrate_temperature(phi, log_t, X[:400], values[:400], weight[:400],
                                         validation, "log_loss")
        found.append((float(log_t), loss))
    assert found[0][0] == pytest.approx(found[1][0], abs=1e-6)
    assert found[0][1] == pytest.approx(found[1][1], rel=1e-5)


def test_every_fit_chooses_its_prototypes_again():
    X, y = _data()
    clf = MetricAttentionClassifier(prototypes=30, warm_start=True, **FAST).fit(X, y)
    assert clf.n_prototypes_ is not None
    clf.set_params(prototypes=None).fit(X, y)  # a warm start continues the map, not the keys
    assert clf.n_prototypes_ is None and clf._strategy.prototypes is None
    assert clf._keys.summary is None


def test_few_distinct_rows_are_the_prototypes_and_attention_over_them_is_exact(small_auto):
    """Rows that repeat (tables of a few categorical columns): with at most as many distinct
    training rows as "auto" would keep prototypes, the distinct rows' keys are the prototypes,
    each a group of equal keys, and attention over them is attention over every key."""
    small_auto.setattr(_learned, "_EPOCH_ROWS", 200)  # the settings for many rows from 200
    rng = np.random.default_rng(0)
    base = rng.normal(size=(12, 4))
    X = base[rng.integers(12, size=600)]
    y = (X[:, 0] + rng.normal(scale=0.5, size=600) > 0).astype(int)
    clf = MetricAttentionClassifier(**FAST).fit(X, y)
    exact = MetricAttentionClassifier(prototypes=None, **FAST).fit(X, y)
    assert clf.n_prototypes_ == 12
    assert clf.prototype_error_ < 1e-6
    assert clf._keys.summary.n_near == 0
    np.testing.assert_allclose(clf.predict_proba(X), exact.predict_proba(X), atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_distinct_rows_by_hash_are_torch_uniques_inverse(dtype, monkeypatch):
    """The distinct rows found by hashing are ``torch.unique(dim=0)``'s inverse (lexicographic
    ranks), -0.0 and 0.0 one value; NaN and a hash shared by different rows take
    ``torch.unique`` itself; more distinct rows than the share give ``None``."""
    rng = np.random.default_rng(0)
    X = rng.integers(-2, 3, size=(3000, 5)).astype(dtype) * 0.5
    X[::7, 1] = -0.0
    X[::11, 1] = 0.0
    expected = torch.unique(torch.from_numpy(X), dim=0, return_inverse=True)[1]
    assert int(expected.max()) + 1 < 0.9 * X.shape[0]
    fallbacks = []
    monkeypatch.setattr(_distinct_rows, "unique_row_ids",
                        lambda X, share: fallbacks.append(1) or unique_row_ids(X, share))
    assert torch.equal(_learned._distinct_rows(torch.from_numpy(X)), expected)
    # small integers of many columns (their float64 bits differ in the high bits only) hash
    # apart: no fallback
    grid = np.column_stack([rng.integers(0, 60, 20000), rng.integers(0, 4, (20000, 2)),
                            rng.integers(1900, 1910, 20000)]).astype(dtype)
    assert torch.equal(_learned._distinct_rows(torch.from_numpy(grid)),
                       torch.unique(torch.from_numpy(grid), dim=0, return_inverse=True)[1])
    assert not fallbacks
    assert _learned._distinct_rows(torch.from_numpy(rng.normal(size=(500, 3)))) is None
    with_nan = X.copy()
    with_nan[3, 2] = np.nan
    assert torch.equal(_learned._distinct_rows(torch.from_numpy(with_nan)),
                       unique_row_ids(torch.from_numpy(with_nan), 0.9))
    # every row hashed alike: the check of the rows against their hash's first row finds it
    monkeypatch.setattr(_distinct_rows, "_row_hashes",
                        lambda x: np.zeros(x.shape[0], dtype=np.uint64))
    assert torch.equal(_learned._distinct_rows(torch.from_numpy(X)), expected)
    assert len(fallbacks) == 2  # the NaN rows above and this one
    # other dtypes: torch.unique's own answer
    half = torch.from_numpy(X).to(torch.float16)
    assert torch.equal(_learned._distinct_rows(half),
                       torch.unique(half, dim=0, return_inverse=True)[1])


@pytest.mark.parametrize("temperature", ["auto", 0.7])
def test_the_error_is_measured_once_at_the_temperature_kept(small_auto, temperature):
    """The prototypes' error is measured once, at the temperature the fit keeps: the
    calibrated one (the default), else the one given. With calibration, a tolerance between
    the error at the trained temperature (1) and the smaller one at the calibrated
    temperature keeps the prototypes: the kept temperature decides."""
    X, y = _data()
    seen = []
    real = _summary.summary_error

    def summary_error(grouped, queries, t, loss):
        seen.append((grouped, queries, t, real(grouped, queries, t, loss)))
        return seen[-1][-1]

    small_auto.setattr(_summary, "TOLERANCE", 1.0)
    small_auto.setattr(_summary, "summary_error", summary_error)
    clf = MetricAttentionClassifier(temperature=temperature, **FAST).fit(X, y)
    assert [t for _, _, t, _ in seen] == [pytest.approx(clf.temperature_, rel=1e-6)]
    assert clf.prototype_error_ == seen[0][-1] > 0
    if temperature != "auto":
        return
    grouped, queries, _, calibrated = seen[0]
    trained = float(real(grouped, queries, 1.0, "log_loss"))
    assert calibrated < trained
    small_auto.setattr(_summary, "TOLERANCE", (calibrated + trained) / 2)
    kept = MetricAttentionClassifier(**FAST).fit(X, y)
    assert kept.n_prototypes_ is not None and kept.prototype_error_ == calibrated
