"""Learned pseudo-metrics: training, reproducibility, warm start, early stopping, transformer."""

import pickle
import re
import warnings

import numpy as np
import pytest
import torch
from sklearn.datasets import load_wine, make_classification, make_regression
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.neighbors import KNeighborsClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from skattention import (
    MetricAttentionClassifier,
    MetricAttentionRegressor,
    MetricAttentionTransformer,
)

FAST = dict(max_iter=30, random_state=0)


@pytest.fixture(scope="module")
def noisy_classification():
    """4 informative features among 30: Euclidean k-NN drowns in the noise, a metric must be
    learned."""
    X, y = make_classification(
        n_samples=800, n_features=30, n_informative=4, n_redundant=0, n_classes=3,
        n_clusters_per_class=1, class_sep=1.0, random_state=0, shuffle=False,
    )
    return train_test_split(X, y, test_size=0.3, random_state=0, stratify=y)


@pytest.mark.parametrize("metric", ["mlp", "linear", "dot"])
def test_learned_metric_trains_and_beats_euclidean_knn(noisy_classification, metric):
    Xtr, Xte, ytr, yte = noisy_classification
    knn = make_pipeline(StandardScaler(), KNeighborsClassifier(5)).fit(Xtr, ytr).score(Xte, yte)
    clf = MetricAttentionClassifier(metric, **FAST).fit(Xtr, ytr)
    assert clf.loss_curve_[-1] < clf.loss_curve_[0]
    assert (
        len(clf.loss_curve_)
        == clf.n_iter_
        == len(clf.validation_scores_)
        == len(clf.validation_loss_curve_)
    )
    best = int(np.argmin(clf.validation_loss_curve_))
    assert clf.best_validation_score_ == clf.validation_scores_[best]
    assert clf.score(Xte, yte) > knn + 0.05, (clf.score(Xte, yte), knn)
    assert isinstance(clf.map_, torch.nn.Module)
    assert all(p.device.type == "cpu" for p in clf.map_.parameters())


def test_random_state_is_bit_reproducible(noisy_classification):
    Xtr, Xte, ytr, _ = noisy_classification
    a = MetricAttentionClassifier(**FAST).fit(Xtr, ytr)
    b = MetricAttentionClassifier(**FAST).fit(Xtr, ytr)
    assert a.loss_curve_ == b.loss_curve_
    np.testing.assert_array_equal(a.predict_proba(Xte), b.predict_proba(Xte))
    for pa, pb in zip(a.map_.parameters(), b.map_.parameters()):
        assert torch.equal(pa, pb)
    c = MetricAttentionClassifier(max_iter=30, random_state=1).fit(Xtr, ytr)
    assert c.loss_curve_ != a.loss_curve_


def test_training_does_not_touch_the_global_torch_rng(noisy_classification):
    Xtr, _, ytr, _ = noisy_classification
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    MetricAttentionClassifier(max_iter=2, random_state=0).fit(Xtr, ytr)
    assert torch.equal(torch.rand(3), expected)


def test_warm_start_continues_training(noisy_classification):
    Xtr, _, ytr, _ = noisy_classification
    clf = MetricAttentionClassifier(
        max_iter=3, early_stopping=False, warm_start=True, random_state=0, n_iter_no_change=100
    )
    clf.fit(Xtr, ytr)
    first = [p.detach().clone() for p in clf.map_.parameters()]
    assert clf.n_iter_ == 3
    clf.fit(Xtr, ytr)
    assert clf.n_iter_ == 6 and len(clf.loss_curve_) == 6
    assert any(not torch.equal(a, b) for a, b in zip(first, clf.map_.parameters()))
    cold = MetricAttentionClassifier(
        max_iter=3, early_stopping=False, random_state=0, n_iter_no_change=100
    ).fit(Xtr, ytr)
    cold.fit(Xtr, ytr)
    assert cold.n_iter_ == 3


def test_warm_start_predicts_with_the_retrained_map(noisy_classification):
    """After a warm refit, predict uses the retrained map, as a pickled copy of the model does
    (found in the redesign: the inference copy of the map made by a predict before the refit
    was served after it, the refit having trained the same map object)."""
    Xtr, Xte, ytr, _ = noisy_classification
    clf = MetricAttentionClassifier(max_iter=2, warm_start=True, random_state=0).fit(Xtr, ytr)
    before = clf.predict_proba(Xte)
    clf.fit(Xtr, ytr)
    after = clf.predict_proba(Xte)
    assert not np.array_equal(before, after)
    np.testing.assert_array_equal(after, pickle.loads(pickle.dumps(clf)).predict_proba(Xte))


def test_without_early_stopping_there_is_no_validation(noisy_classification):
    Xtr, _, ytr, _ = noisy_classification
    clf = MetricAttentionClassifier(early_stopping=False, max_iter=4, random_state=0).fit(Xtr, ytr)
    assert clf.validation_scores_ is None and clf.best_validation_score_ is None
    assert clf.n_iter_ <= 4


def test_fixed_and_learned_temperature(noisy_classification):
    Xtr, _, ytr, _ = noisy_classification
    fixed = MetricAttentionClassifier(temperature=2.5, max_iter=5, random_state=0).fit(Xtr, ytr)
    assert fixed.temperature_ == pytest.approx(2.5)
    learned = MetricAttentionClassifier(max_iter=5, random_state=0).fit(Xtr, ytr)
    assert 0 < learned.temperature_ < np.inf


def test_knn_limit_in_the_learned_metric_equals_knn_on_the_transformer_output(noisy_classification):
    # Same parameters and seed: the classifier and the transformer train the same map, so k-NN
    # attention (temperature=inf) in the learned metric is KNeighborsClassifier on transform().
    Xtr, Xte, ytr, _ = noisy_classification
    clf = MetricAttentionClassifier(n_neighbors=5, temperature=np.inf, **FAST).fit(Xtr, ytr)
    trans = MetricAttentionTransformer(**FAST)
    knn = make_pipeline(trans, KNeighborsClassifier(5)).fit(Xtr, ytr)
    assert clf.temperature_ == np.inf
    np.testing.assert_allclose(trans.transform(Xtr), clf._keys.points, rtol=1e-6)
    np.testing.assert_array_equal(clf.predict(Xte), knn.predict(Xte))


def test_transformer_interface():
    X, y = load_wine(return_X_y=True)
    trans = MetricAttentionTransformer(n_components=3, random_state=0, max_iter=10).fit(X, y)
    Z = trans.transform(X)
    assert Z.shape == (178, 3) and Z.dtype == np.float64
    assert trans.transform(X.astype(np.float32)).dtype == np.float32
    assert list(trans.get_feature_names_out()) == [
        f"metricattentiontransformer{i}" for i in range(3)
    ]
    pd = pytest.importorskip("pandas")
    out = trans.set_output(transform="pandas").transform(X)
    assert isinstance(out, pd.DataFrame) and out.shape == (178, 3)
    with pytest.raises(ValueError, match="metric"):
        MetricAttentionTransformer(metric="dot").fit(X, y)


def test_regressor_learns_a_metric():
    X, y = make_regression(n_samples=600, n_features=12, n_informative=3, noise=1.0, random_state=0)
    X[:, 3:] *= 4.0  # loud irrelevant features
    Xtr, Xte, ytr, yte = train_test_split(X, y, random_state=0)
    fixed = (
        make_pipeline(StandardScaler(), MetricAttentionRegressor("euclidean"))
        .fit(Xtr, ytr)
        .score(Xte, yte)
    )
    learned = MetricAttentionRegressor(**FAST).fit(Xtr, ytr)
    assert learned.score(Xte, yte) > fixed + 0.1, (learned.score(Xte, yte), fixed)
    multi = MetricAttentionRegressor(**FAST).fit(Xtr, np.c_[ytr, -2 * ytr])
    assert multi.predict(Xte).shape == (len(Xte), 2)


def test_learned_model_pickles_and_predicts_identically(noisy_classification):
    Xtr, Xte, ytr, _ = noisy_classification
    clf = MetricAttentionClassifier(max_iter=5, random_state=0).fit(Xtr, ytr)
    loaded = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(loaded.predict_proba(Xte), clf.predict_proba(Xte))


def test_dot_metric_is_asymmetric_and_inspectable(noisy_classification):
    Xtr, Xte, ytr, _ = noisy_classification
    clf = MetricAttentionClassifier("dot", max_iter=10, random_state=0).fit(Xtr, ytr)
    (encoded,) = clf._encoded_blocks(Xte[:3])  # what the map sees: the encoded rows
    x = torch.as_tensor(encoded, dtype=torch.float32)
    assert not torch.allclose(clf.map_.query(x), clf.map_.key(x))
    w, idx = clf.attention_weights(Xte[:4], n_weights=3)
    assert w.shape == idx.shape == (4, 3) and np.all(idx >= 0)


def test_verbose_reports_epochs_on_stderr_only(noisy_classification, capsys):
    Xtr, _, ytr, _ = noisy_classification
    MetricAttentionClassifier(max_iter=2, verbose=1, random_state=0).fit(Xtr, ytr)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "MetricAttentionClassifier fit" in captured.err
    assert "loss=" in captured.err and "val_score=" in captured.err
    MetricAttentionClassifier(max_iter=2, verbose=2, random_state=0).fit(Xtr, ytr)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "epoch 1/2" in captured.err and "validation score" in captured.err
    MetricAttentionClassifier(max_iter=2, random_state=0).fit(Xtr, ytr)
    assert capsys.readouterr().err == ""


def test_class_and_sample_weights_shift_predictions(noisy_classification):
    Xtr, Xte, ytr, _ = noisy_classification
    plain = MetricAttentionClassifier(**FAST).fit(Xtr, ytr)
    heavy = MetricAttentionClassifier(class_weight={0: 20.0, 1: 1.0, 2: 1.0}, **FAST).fit(Xtr, ytr)
    assert heavy.predict_proba(Xte)[:, 0].mean() > plain.predict_proba(Xte)[:, 0].mean()
    sw = np.where(ytr == 0, 20.0, 1.0)
    weighted = MetricAttentionClassifier(**FAST).fit(Xtr, ytr, sample_weight=sw)
    assert weighted.predict_proba(Xte)[:, 0].mean() > plain.predict_proba(Xte)[:, 0].mean()


def test_warm_start_with_other_features_is_a_clear_error(noisy_classification):
    Xtr, _, ytr, _ = noisy_classification
    clf = MetricAttentionClassifier(max_iter=2, warm_start=True, random_state=0).fit(Xtr, ytr)
    expected = clf.predict_proba(Xtr)
    width = Xtr.shape[1]
    message = (f"X has 5 features, but MetricAttentionClassifier is expecting {width} features "
               "as input.")  # scikit-learn's wording, naming the estimator
    with pytest.raises(ValueError, match=re.escape(message)):
        clf.fit(Xtr[:, :5], ytr)
    assert clf.n_features_in_ == width  # the failed fit left the model as it was
    np.testing.assert_array_equal(clf.predict_proba(Xtr), expected)


@pytest.mark.parametrize("metric, changed, same", [
    ("mlp", dict(n_components=2, hidden_size=8, n_blocks=2, activation="tanh"), {}),
    ("tabular", dict(n_components=8, numeric_embedding="plr"),
     dict(n_components=64, numeric_embedding="none")),  # what None and "auto" built here
    ("linear", dict(n_components=2), dict(n_components=None)),
])
def test_warm_start_with_another_architecture_is_a_clear_error(noisy_classification, metric,
                                                              changed, same):
    # the map a warm start continues was built by these parameters: changed, they were ignored
    Xtr, _, ytr, _ = noisy_classification
    clf = MetricAttentionClassifier(metric, max_iter=1, warm_start=True, random_state=0)
    expected = clf.fit(Xtr, ytr).predict_proba(Xtr)
    n_samples = clf.n_samples_fit_
    clf.set_params(**changed)
    with pytest.raises(ValueError, match="warm_start=True continues the fitted map") as error:
        clf.fit(Xtr[:100], ytr[:100])
    assert all(name in str(error.value) for name in changed)
    # left as it was, though the refused fit had other rows
    assert clf.n_samples_fit_ == n_samples
    np.testing.assert_array_equal(clf.predict_proba(Xtr), expected)
    # the parameters that built the map, or None / "auto" (its choice)
    clf.set_params(**{name: MetricAttentionClassifier().get_params()[name] for name in changed})
    clf.set_params(**same).fit(Xtr, ytr)
    clf.set_params(warm_start=False, **changed).fit(Xtr, ytr)  # a new map
    # parameters of the training alone may change
    clf.set_params(warm_start=True, learning_rate=1e-3, max_iter=2).fit(Xtr, ytr)


@pytest.mark.parametrize("kwargs", [dict(radius=1.0), dict(n_neighbors=5, weights="distance")])
def test_a_dot_metric_without_a_distance_is_refused_before_training(noisy_classification,
                                                                    kwargs):
    Xtr, _, ytr, _ = noisy_classification
    clf = MetricAttentionClassifier("dot", max_iter=1, **kwargs)
    with pytest.raises(ValueError, match="a distance; metric='dot' has none"):
        clf.fit(Xtr, ytr)
    assert not hasattr(clf, "n_iter_")


def test_warm_start_with_other_classes_names_them(noisy_classification):
    Xtr, _, ytr, _ = noisy_classification
    clf = MetricAttentionClassifier(max_iter=1, warm_start=True, random_state=0).fit(Xtr, ytr)
    other = np.where(ytr == ytr[0], 7, ytr)
    with pytest.raises(ValueError, match=r"previous fit: it had \[.*\], y has \[.*7.*\]"):
        clf.fit(Xtr, other)


def test_a_linear_map_to_more_components_than_features_is_an_error_as_in_nca():
    # W x of 3 features has rank 3: NCA refuses n_components=5; the other maps may widen
    X, y = make_classification(n_samples=60, n_features=3, n_informative=3, n_redundant=0,
                               random_state=0)
    message = r"n_components=5 cannot be greater than the 3 features of X"
    for estimator in [MetricAttentionClassifier("linear", n_components=5),
                      MetricAttentionTransformer(5, metric="linear")]:
        with pytest.raises(ValueError, match=message):
            estimator.fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        assert MetricAttentionTransformer(3, metric="linear", max_iter=1).fit_transform(
            X, y).shape == (60, 3)
        assert MetricAttentionTransformer(5, metric="mlp", max_iter=1).fit_transform(
            X, y).shape == (60, 5)


def test_grid_search_over_metric_temperature_neighbors_with_knn_and_nca():
    from sklearn.model_selection import GridSearchCV
    from sklearn.neighbors import NeighborhoodComponentsAnalysis
    from sklearn.pipeline import Pipeline

    X, y = load_wine(return_X_y=True)
    pipe = Pipeline(
        [("scale", StandardScaler()), ("metric", "passthrough"), ("model", KNeighborsClassifier())]
    )
    grid = GridSearchCV(
        pipe,
        [
            {"model": [KNeighborsClassifier()], "model__n_neighbors": [5]},
            {
                "metric": [NeighborhoodComponentsAnalysis(random_state=0)],
                "model": [KNeighborsClassifier(5)],
            },
            {
                "model": [MetricAttentionClassifier(max_iter=10, random_state=0)],
                "model__metric": ["euclidean", "linear", "mlp"],
                "model__temperature": ["auto", np.inf],
                "model__n_neighbors": [None, 5],
            },
        ],
        cv=3,
        error_score="raise",
    ).fit(X, y)
    scores = grid.cv_results_["mean_test_score"]
    assert len(scores) == 2 + 12 and np.all(np.isfinite(scores))
    assert grid.best_score_ > 0.9


@pytest.mark.parametrize("metric", ["tabular", "mlp"])
def test_single_row_predictions_equal_batch_predictions(metric):
    # A web service predicts one row at a time: each row's output must not depend on its
    # batch. The map's products ran on MKL's threads, which split a short product's inner
    # dimension over two threads for a single row (1e-14 apart, found on a 2-core Xeon).
    X, y = make_classification(n_samples=600, n_features=20, n_informative=8, random_state=0)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model = MetricAttentionClassifier(metric, max_iter=3, random_state=0).fit(X, y)
        batch = model.predict_proba(X[:40])
        alone = np.vstack([model.predict_proba(X[i : i + 1]) for i in range(40)])
        triples = np.vstack([model.predict_proba(X[i : i + 3]) for i in range(0, 39, 3)])
    finally:
        torch.set_num_threads(before)
    np.testing.assert_array_equal(alone, batch)
    np.testing.assert_array_equal(triples, batch[:39])


@pytest.mark.parametrize("metric", ["tabular", "mlp", "linear", "dot"])
@pytest.mark.parametrize("dtype", [None, "float32", "float64"])
def test_predictions_do_not_depend_on_the_batch_in_either_precision(metric, dtype):
    X, y = make_classification(n_samples=1500, n_features=24, n_informative=8, random_state=1)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model = MetricAttentionClassifier(metric, max_iter=2, random_state=0, dtype=dtype)
        model.fit(X, y)
        batch = model.predict_proba(X[:1100])
        alone = np.vstack([model.predict_proba(X[i : i + 1]) for i in range(0, 1100, 50)])
    finally:
        torch.set_num_threads(before)
    np.testing.assert_array_equal(alone, batch[::50])


@pytest.mark.parametrize("n_samples", [255, 1023])
def test_chunks_of_a_batch_equal_the_batch_over_an_odd_number_of_keys(n_samples):
    # an odd number of keys in float64: products of some key widths round a row by its place
    # among the rows on some CPUs (found with MKL on an AMD EPYC, 1e-16 apart)
    X, y = make_classification(n_samples=n_samples, n_features=6, n_informative=4,
                               n_classes=3, random_state=0)
    model = MetricAttentionClassifier(max_iter=2, random_state=0, dtype="float64").fit(X, y)
    batch = model.predict_proba(X[:148])
    chunks = np.vstack([model.predict_proba(X[i : i + 37]) for i in range(0, 148, 37)])
    np.testing.assert_array_equal(chunks, batch)


def test_learned_metrics_predict_in_float32_unless_told():
    X, y = make_classification(n_samples=200, n_features=6, random_state=0)
    model = MetricAttentionClassifier(max_iter=2, random_state=0).fit(X, y)
    assert model._compute_dtype() == torch.float32
    assert MetricAttentionClassifier("euclidean").fit(X, y)._compute_dtype() == torch.float64
    proba = model.predict_proba(X)
    assert proba.dtype == np.float64
    model.set_params(dtype="float64")  # the same fitted model predicting in float64
    assert model._compute_dtype() == torch.float64
    # float32 squared distances round to about 1e-7 of the squared norms (|q|^2 ~ 14 here):
    # a query at distance 0 from a key (a training point) gets about 1e-3, its logit about
    # 1e-3 / T (T ~ 0.35): probabilities within a few 1e-3 there, 1e-5 elsewhere
    np.testing.assert_allclose(model.predict_proba(X), proba, atol=5e-3)
    assert np.median(np.abs(model.predict_proba(X) - proba)) < 1e-5
    assert not np.array_equal(model.predict_proba(X), proba)


@pytest.mark.parametrize("metric", ["tabular", "euclidean"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_regressor_single_rows_equal_batch_rows(metric, dtype):
    # a few rows take predict's few-rows path (one block, the fitted tensors ready on the
    # device); batches the general one: the same numbers, trend included
    X, y = make_regression(n_samples=700, n_features=12, noise=5.0, random_state=0)
    X = X.astype(dtype)
    model = MetricAttentionRegressor(metric, max_iter=3, random_state=0).fit(X, y)
    batch = model.predict(X[:300])
    alone = np.concatenate([model.predict(X[i : i + 1]) for i in range(0, 300, 13)])
    np.testing.assert_array_equal(alone, batch[::13])
    assert batch.dtype == np.float64


def test_warm_start_on_levels_it_did_not_see_warns():
    # a warm start keeps the first fit's encoding: data whose categorical levels are all new
    # was read as one "unseen" level without a word (score 0.667 against 1.0 fitted cold)
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(0)
    first = pd.DataFrame({"c": rng.choice(list("abc"), 300), "z": rng.normal(size=300)})
    other = pd.DataFrame({"c": rng.choice(list("uvw"), 300), "z": rng.normal(size=300)})
    model = MetricAttentionClassifier(warm_start=True, max_iter=2, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(first, first.c == "a")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(first, first.c == "a")  # the same levels: nothing to say
        assert not [w for w in caught if "warm_start keeps" in str(w.message)]
        with pytest.warns(UserWarning, match=r"warm_start keeps .*\['c'\].*warm_start=False"):
            model.fit(other, other.c == "u")


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
@pytest.mark.parametrize("metric", ["linear", "tabular"])
def test_fit_trains_under_the_callers_no_grad(mode, metric):
    # a fit in a serving loop's torch.no_grad(): the step's backward found no graph
    X, y = make_classification(200, 5, random_state=0)
    expected = MetricAttentionClassifier(metric, max_iter=2, random_state=0).fit(X, y)
    with mode():
        got = MetricAttentionClassifier(metric, max_iter=2, random_state=0).fit(X, y)
    np.testing.assert_array_equal(got.predict_proba(X), expected.predict_proba(X))


def test_a_float64_fit_keeps_its_map_in_float64(noisy_classification):
    # its predictions map the queries with the weights it trained, not float32 roundings
    Xtr, Xte, ytr, _ = noisy_classification
    clf = MetricAttentionClassifier("mlp", dtype="float64", max_iter=2, random_state=0)
    clf.fit(Xtr, ytr)
    assert {p.dtype for p in clf.map_.parameters()} == {torch.float64}
    default = MetricAttentionClassifier("mlp", max_iter=2, random_state=0).fit(Xtr, ytr)
    assert {p.dtype for p in default.map_.parameters()} == {torch.float32}
    np.testing.assert_allclose(clf.predict_proba(Xte).sum(1), 1.0)
