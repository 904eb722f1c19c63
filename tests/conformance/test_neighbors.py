"""The neighbour configurations the README calls exact, against scikit-learn, on data with ties.

Written for skattention after scikit-learn 1.9's ``sklearn/neighbors/tests/test_neighbors.py``
(same data and assertions where they apply to a claimed configuration) plus the cases real data
brings: distance ties (integer grids, one-hot rows), duplicated rows, points exactly on the
radius, float32 and float64, small working-memory budgets and any batching of the queries.
"""

import re
import warnings

import numpy as np
import pytest
from sklearn.datasets import load_digits, load_iris, make_classification
from sklearn.model_selection import train_test_split
from sklearn.neighbors import (
    KNeighborsClassifier,
    KNeighborsRegressor,
    NearestNeighbors,
    RadiusNeighborsClassifier,
    RadiusNeighborsRegressor,
)

import skattention
from skattention import MetricAttentionClassifier, MetricAttentionRegressor

from ._cases import (
    CONFIGS,
    DATA,
    INF,
    KNeighborsClassifierByIndex,
    kth_tie,
    make_data,
    outputs,
    with_neighbor,
)


def cases(with_dtype=True):
    out = []
    for config in CONFIGS:
        for data in DATA:
            for dtype in [np.float64, np.float32] if with_dtype else [np.float64]:
                ids = f"{config}-{data}" + (f"-{dtype.__name__}" if with_dtype else "")
                args = (config, data, dtype) if with_dtype else (config, data)
                out.append(pytest.param(*args, id=ids))
    return out


def fitted(config, data, dtype=np.float64):
    ours, ref, classifier = CONFIGS[config]
    X, y_class, y_reg, Xq = make_data(data, dtype)
    y = y_class if classifier else y_reg
    if config.startswith("radius"):
        Xq = with_neighbor(X, Xq)
    return ours().fit(X, y), ref().fit(X, y), Xq, classifier


def assert_same(ours, ref, Xq, classifier, dtype=np.float64):
    # float32 inputs too: the targets and votes are averaged in float64, as scikit-learn
    # averages them (a float32 average missed KNeighborsRegressor by up to 1.5e-7 relative)
    np.testing.assert_allclose(
        outputs(ours, Xq, classifier), outputs(ref, Xq, classifier), rtol=1e-12, atol=1e-12
    )
    if classifier:
        np.testing.assert_array_equal(ours.predict(Xq), ref.predict(Xq))


@pytest.mark.parametrize("config, data, dtype", cases())
def test_matches_scikit_learn(config, data, dtype):
    ours, ref, Xq, classifier = fitted(config, data, dtype)
    assert_same(ours, ref, Xq, classifier, dtype)


@pytest.mark.parametrize("config, data", [
    case for case in cases(with_dtype=False)
    # a weighted radius vote holds each query's neighbours within the radius at once (up to
    # all 60 training points), beyond this 1 KiB budget: it raises MemoryError there
    if not case.values[0].startswith("radius_distance")
])
def test_matches_scikit_learn_in_small_blocks(config, data):
    # 1 KiB: blocks of a few queries and of 32 keys or fewer (the 60 training points split).
    with skattention.config_context(working_memory=0.001):
        ours, ref, Xq, classifier = fitted(config, data)
        assert_same(ours, ref, Xq, classifier)


@pytest.mark.parametrize("data", ["continuous", "integer_grid"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_predictions_do_not_depend_on_batching(config, data):
    # The same decisions (labels, neighbour sets) whatever the batch; the averages may differ
    # in the last bit, as the matrix products behind them are blocked differently.
    ours, _, Xq, classifier = fitted(config, data)
    Xq = np.repeat(Xq, 3, axis=0)  # enough queries for several blocks under the small budget
    whole = outputs(ours, Xq, classifier)

    def same(out, rows=slice(None)):
        np.testing.assert_allclose(out, whole[rows], rtol=1e-12, atol=1e-14)
        if classifier:
            np.testing.assert_array_equal(out.argmax(1), whole[rows].argmax(1))

    rows = np.arange(0, len(Xq), 5)
    same(np.concatenate([outputs(ours, Xq[i : i + 1], classifier) for i in rows]), rows)
    for part in np.array_split(np.random.default_rng(0).permutation(len(Xq)), 5):
        same(outputs(ours, Xq[part], classifier), part)
    # (a weighted radius vote needs more than 1 KiB per query: see the small-blocks test)
    budget = 0.01 if config.startswith("radius_distance") else 0.001
    with skattention.config_context(working_memory=budget):
        same(outputs(ours, Xq, classifier))


@pytest.mark.parametrize("data", list(DATA))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_nadaraya_watson(data, dtype):
    X, _, y, Xq = make_data(data, dtype)
    h = 0.7
    ours = MetricAttentionRegressor("euclidean", temperature=2 * h**2).fit(X, y)
    d2 = ((Xq[:, None, :].astype(float) - X[None].astype(float)) ** 2).sum(2)
    w = np.exp(-(d2 - d2.min(1, keepdims=True)) / (2 * h**2))
    expected = w @ y / w.sum(1)
    np.testing.assert_allclose(
        ours.predict(Xq), expected, rtol=1e-10 if dtype == np.float64 else 2e-5, atol=1e-6
    )


def weight_cases():
    out = []
    for config in [*CONFIGS, "nadaraya_watson"]:
        if "distance" in config:
            continue  # weights other than "uniform" take no sample weights (a clear error)
        for data in ("continuous", "integer_grid"):
            # Repetition changes the keys' centring, hence the rounding that decides the grid's
            # ties and boundary points.
            out.append(pytest.param(config, data, id=f"{config}-{data}"))
    return out


@pytest.mark.parametrize("config, data", weight_cases())
def test_integer_sample_weight_is_repetition(config, data):
    X, y_class, y_reg, Xq = make_data(data)
    if config == "nadaraya_watson":

        def make():
            return MetricAttentionRegressor("euclidean", temperature=0.5)

        classifier = False
    else:
        make, _, classifier = CONFIGS[config]
    y = y_class if classifier else y_reg
    w = np.random.default_rng(1).integers(1, 4, len(X))
    if config.startswith("radius"):
        Xq = with_neighbor(X, Xq)
    weighted = make().fit(X, y, sample_weight=w)
    repeated = make().fit(np.repeat(X, w, axis=0), np.repeat(y, w))
    np.testing.assert_allclose(
        outputs(weighted, Xq, classifier), outputs(repeated, Xq, classifier), rtol=1e-12, atol=1e-12
    )


# ---------------------------------------------------------------- the issue's reproductions


def test_issue_point_exactly_on_the_radius():
    X, y = [[4, 6], [1, 9], [3, 14]], [1, 10, 100]
    expected = RadiusNeighborsRegressor(radius=5).fit(X, y).predict([[3, 19]])
    assert expected.tolist() == [100.0]
    ours = MetricAttentionRegressor("euclidean", radius=5, temperature=INF).fit(X, y)
    np.testing.assert_array_equal(ours.predict([[3, 19]]), expected)


def test_issue_integer_grid_radius_predictions():
    rng = np.random.default_rng(0)
    X = rng.integers(0, 20, size=(400, 2)).astype(float)  # integer points of a 20 x 20 square
    y = rng.normal(size=len(X))
    Xq = rng.integers(0, 20, size=(300, 2)).astype(float)
    ref = RadiusNeighborsRegressor(radius=3).fit(X, y)
    ours = MetricAttentionRegressor("euclidean", radius=3, temperature=INF).fit(X, y)
    np.testing.assert_allclose(ours.predict(Xq), ref.predict(Xq), rtol=1e-12)


def test_issue_nearest_on_the_boundary_of_a_float_radius():
    # scikit-learn's test_radius_neighbors_boundary_handling: 3.0 is exactly 3 from 0.
    X, y = np.array([[1.5], [3.0], [3.01]]), np.array([1.0, 10.0, 100.0])
    ours = MetricAttentionRegressor("euclidean", radius=3.0, temperature=INF).fit(X, y)
    assert NearestNeighbors(radius=3.0).fit(X).radius_neighbors([[0.0]])[1][0].tolist() == [0, 1]
    np.testing.assert_array_equal(ours.predict([[0.0]]), [5.5])


def test_issue_equidistant_kth_neighbour():
    # scikit-learn's test_query_equidistant_kth_nn: among equal distances the lower index wins.
    P, labels = [[1, 0], [0, 1], [-1, 0], [0, -1]], [0, 1, 2, 3]
    ref = KNeighborsClassifier(n_neighbors=2).fit(P, labels)
    assert ref.predict_proba([[0, 0]]).tolist() == [[0.5, 0.5, 0.0, 0.0]]
    ours = MetricAttentionClassifier("euclidean", n_neighbors=2, temperature=INF).fit(P, labels)
    np.testing.assert_array_equal(ours.predict_proba([[0, 0]]), ref.predict_proba([[0, 0]]))


def test_issue_iris_row_depends_on_its_batch():
    # Row 77's 5th and 6th nearest (rows 76 and 110) are both at squared distance 0.18: the lower
    # index, 76, is taken whatever the batch (scikit-learn's heap keeps 110: [0, .6, .4]).
    X, y = load_iris(return_X_y=True)
    ours = MetricAttentionClassifier("euclidean", n_neighbors=5, temperature=INF).fit(X, y)
    ref = KNeighborsClassifierByIndex(n_neighbors=5).fit(X, y)
    assert ref.predict_proba(X[77:78]).tolist() == [[0.0, 0.8, 0.2]]
    np.testing.assert_array_equal(ours.predict_proba(X[77:78]), ref.predict_proba(X[77:78]))
    np.testing.assert_array_equal(ours.predict_proba(X)[77:78], ref.predict_proba(X[77:78]))


def test_issue_zero_temperature_on_a_small_integer_grid():
    rng = np.random.default_rng(0)
    X = np.array([(i, j) for i in range(4) for j in range(4)], dtype=float)
    y = rng.integers(0, 3, len(X))
    Xq = rng.integers(0, 7, size=(200, 2)) / 2.0  # half-integers: up to four nearest at once
    ref = KNeighborsClassifier(n_neighbors=1).fit(X, y)
    ours = MetricAttentionClassifier("euclidean", temperature=0).fit(X, y)
    np.testing.assert_array_equal(ours.predict(Xq), ref.predict(Xq))


def test_zero_temperature_ties_are_brute_force_1nn():
    # docs/special_cases.md: among points tied at the nearest distance the lowest index, as
    # scikit-learn's brute force; its trees (what "auto" picks here) return another on some
    # queries, so the default KNeighborsClassifier differs where tied points' labels differ
    rng = np.random.default_rng(0)
    X = rng.integers(0, 3, size=(300, 2)).astype(float)
    y = rng.integers(0, 3, len(X))
    Xq = rng.integers(0, 3, size=(200, 2)) + 0.5  # four nearest points at once
    ours = MetricAttentionClassifier("euclidean", temperature=0).fit(X, y)
    brute = KNeighborsClassifier(n_neighbors=1, algorithm="brute").fit(X, y)
    np.testing.assert_array_equal(ours.predict_proba(Xq), brute.predict_proba(Xq))
    default = KNeighborsClassifier(n_neighbors=1).fit(X, y)
    assert default._fit_method == "kd_tree"
    assert (default.predict(Xq) != brute.predict(Xq)).any()


def test_issue_zero_temperature_tie():
    T, ty = [[-1], [1], [-5], [5]], [3, 1, 2, 2]
    assert KNeighborsClassifier(n_neighbors=1).fit(T, ty).predict([[0]]).tolist() == [3]
    ours = MetricAttentionClassifier("euclidean", temperature=0).fit(T, ty)
    assert ours.predict([[0]]).tolist() == [3]
    np.testing.assert_array_equal(ours.predict_proba([[0]]), [[0.0, 0.0, 1.0]])


def test_issue_weight_is_multiplicity_among_the_k_nearest():
    X, y, w = [[0], [1], [2]], [0, 1, 1], [3, 1, 1]
    repeated = KNeighborsClassifier(n_neighbors=2).fit(np.repeat(X, w, axis=0), np.repeat(y, w))
    assert repeated.predict_proba([[0.4]]).tolist() == [[1.0, 0.0]]
    ours = MetricAttentionClassifier("euclidean", n_neighbors=2, temperature=INF).fit(
        X, y, sample_weight=w
    )
    np.testing.assert_array_equal(ours.predict_proba([[0.4]]), [[1.0, 0.0]])


def test_radius_regressor_without_neighbour_predicts_nan_with_a_warning():
    # scikit-learn's test_radius_neighbors_regressor, last part
    rng = np.random.RandomState(0)
    X = 2 * rng.rand(40, 3) - 1
    y = np.sqrt((X**2).sum(1))
    ours = MetricAttentionRegressor("euclidean", radius=0.5, temperature=INF).fit(X, y / y.max())
    message = "One or more samples have no neighbors within specified radius; predicting NaN."
    with pytest.warns(UserWarning, match=re.escape(message)):
        pred = ours.predict(np.full((1, 3), -1.0))
    assert np.all(np.isnan(pred))


def test_radius_classifier_outlier_label():
    # scikit-learn's test_radius_neighbors_classifier_outlier_labeling
    X = np.array([[1.0, 1.0], [2.0, 2.0], [0.99, 0.99], [0.98, 0.98], [2.01, 2.01]])
    y = np.array([1, 2, 1, 1, 2])
    z = np.array([[1.4, 1.4], [1.01, 1.01], [2.01, 2.01]])
    ours = MetricAttentionClassifier(
        "euclidean", radius=0.1, temperature=INF, outlier_label=-1
    ).fit(X, y)
    with pytest.warns(UserWarning, match="Outlier label -1 is not in training classes"):
        np.testing.assert_array_equal(ours.predict(z), [-1, 1, 2])
    with pytest.warns(UserWarning, match="Outlier label -1 is not in training classes"):
        np.testing.assert_array_equal(ours.predict_proba(z)[0], [0, 0])


@pytest.mark.parametrize("w", [[5, 1, 1, 1, 1], [3, 1, 1, 1, 3], [1, 1, 1, 1, 4],
                               [1, 0, 0, 0, 1]], ids=["heavy", "tie", "rare", "zero"])
def test_radius_classifier_most_frequent_counts_sample_weight(w):
    # an integer weight acts as repeating the row: "most_frequent" is RadiusNeighborsClassifier's
    # on the repeated rows (ties: the smallest label; a class of zero-weight rows cannot win)
    X = np.array([[0.0], [1.0], [2.0], [3.0], [4.0]])
    Y = np.column_stack([[0, 1, 1, 1, 2], [7, 7, 8, 8, 9]])
    Q = np.array([[100.0]])  # no training point within the radius
    for y in (Y[:, 0], Y):
        ref = RadiusNeighborsClassifier(radius=0.5, outlier_label="most_frequent").fit(
            np.repeat(X, w, axis=0), np.repeat(y, w, axis=0)
        )
        ours = MetricAttentionClassifier(
            "euclidean", radius=0.5, temperature=INF, outlier_label="most_frequent"
        ).fit(X, y, sample_weight=w)
        np.testing.assert_array_equal(ours.outlier_label_, ref.outlier_label_)
        np.testing.assert_array_equal(ours.predict(Q), ref.predict(Q))


def test_radius_classifier_outlier_label_matches_predict_proba():
    # scikit-learn's test_radius_neighbors_predict_proba
    for seed in range(5):
        X, y = make_classification(
            n_samples=50,
            n_features=5,
            n_informative=3,
            n_redundant=0,
            n_classes=3,
            random_state=seed,
        )
        X_tr, X_te, y_tr, _ = train_test_split(X, y, random_state=0)
        outlier = int(2 - seed)
        ref = RadiusNeighborsClassifier(radius=2, outlier_label=outlier).fit(X_tr, y_tr)
        ours = MetricAttentionClassifier(
            "euclidean", radius=2, temperature=INF, outlier_label=outlier
        )
        ours.fit(X_tr, y_tr)
        np.testing.assert_array_equal(ours.predict(X_te), ref.predict(X_te))
        np.testing.assert_allclose(ours.predict_proba(X_te), ref.predict_proba(X_te), atol=1e-12)


def test_tied_votes_pick_the_first_class_as_scikit_learn():
    # 24 neighbours, 9 / 9 / 6 votes: the first of the two tied classes is predicted.
    X, yc, _, Xq = make_data("duplicated_rows", seed=1)
    Xq = with_neighbor(X, Xq)
    ref = RadiusNeighborsClassifier(radius=2.0).fit(X, yc)
    ours = MetricAttentionClassifier("euclidean", radius=2.0, temperature=INF).fit(X, yc)
    np.testing.assert_array_equal(ours.predict_proba(Xq), ref.predict_proba(Xq))
    np.testing.assert_array_equal(ours.predict(Xq), ref.predict(Xq))


# ---------------------------------------------------------------- scikit-learn's own cases


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("config", ["knn", "radius"])
def test_classifier_recovers_the_training_labels_near_the_points(config, dtype):
    # test_kneighbors_classifier / test_radius_neighbors_classifier: 40 points in [-1, 1]^5,
    # queries shifted by 1e-5 recover their labels, also as strings.
    rng = np.random.RandomState(0)
    X = 2 * rng.rand(40, 5).astype(dtype) - 1
    y = ((X**2).sum(axis=1) < 0.5).astype(int)
    params = {"n_neighbors": 5} if config == "knn" else {"radius": 0.5}
    model = MetricAttentionClassifier("euclidean", temperature=INF, **params)
    epsilon = 1e-5 * (2 * rng.rand(1, 5) - 1)
    np.testing.assert_array_equal(model.fit(X, y).predict(X[:10] + epsilon), y[:10])
    np.testing.assert_array_equal(
        model.fit(X, y.astype(str)).predict(X[:10] + epsilon), y[:10].astype(str)
    )


def test_predict_proba_on_a_small_integer_set():
    # test_kneighbors_classifier_predict_proba's data, with the Euclidean distance (ties at k=3)
    X = np.array([[0, 2, 0], [0, 2, 1], [2, 0, 0], [2, 2, 0], [0, 0, 2], [0, 0, 1]], dtype=float)
    y = np.array([4, 4, 5, 5, 1, 1])
    ref = KNeighborsClassifier(n_neighbors=3).fit(X, y)
    ours = MetricAttentionClassifier("euclidean", n_neighbors=3, temperature=INF).fit(X, y)
    np.testing.assert_array_equal(ours.predict_proba(X), ref.predict_proba(X))
    ours.fit(X, y.astype(str))
    np.testing.assert_array_equal(ours.predict_proba(X), ref.predict_proba(X))


def test_zero_distance_queries():
    # test_radius_neighbors_classifier_zero_distance and test_neighbors_regressors_zero_distance
    X, y = np.array([[1.0, 1.0], [2.0, 2.0]]), np.array([1, 2])
    clf = MetricAttentionClassifier("euclidean", radius=0.1, temperature=INF).fit(X, y)
    np.testing.assert_array_equal(clf.predict([[1.01, 1.01], [2.0, 2.0]]), [1, 2])
    X = np.array([[1.0, 1.0], [1.0, 1.0], [2.0, 2.0], [2.5, 2.5]])
    y = np.array([1.0, 1.5, 2.0, 0.0])
    z = np.array([[1.1, 1.1], [2.0, 2.0]])
    rnn = MetricAttentionRegressor("euclidean", radius=0.2, temperature=INF).fit(X, y)
    np.testing.assert_allclose(rnn.predict(z), [1.25, 2.0])
    knn = MetricAttentionRegressor("euclidean", n_neighbors=2, temperature=INF).fit(X, y)
    np.testing.assert_allclose(knn.predict(z), [1.25, 1.0])


def test_multioutput_regressors_average_their_neighbours():
    # test_KNeighborsRegressor_multioutput_uniform_weight and the radius variant
    rng = np.random.RandomState(0)
    X, y = rng.rand(40, 5), rng.rand(40, 4)
    X_train, X_test, y_train, _ = train_test_split(X, y, random_state=0)
    knn = MetricAttentionRegressor("euclidean", n_neighbors=5, temperature=INF).fit(
        X_train, y_train
    )
    _, idx = knn.attention_weights(X_test)
    np.testing.assert_allclose(knn.predict(X_test), y_train[idx].mean(1), rtol=1e-12)
    ref = KNeighborsRegressor().fit(X_train, y_train)
    np.testing.assert_allclose(knn.predict(X_test), ref.predict(X_test), rtol=1e-12)
    rnn = MetricAttentionRegressor("euclidean", radius=1.0, temperature=INF).fit(X_train, y_train)
    ref = RadiusNeighborsRegressor().fit(X_train, y_train)
    np.testing.assert_allclose(rnn.predict(X_test), ref.predict(X_test), rtol=1e-12)


def test_iris_and_digits_sanity():
    # test_neighbors_iris and test_neighbors_digits
    rng = np.random.RandomState(0)
    iris = load_iris()
    perm = rng.permutation(150)
    X, y = iris.data[perm], iris.target[perm]
    one = MetricAttentionClassifier("euclidean", temperature=0).fit(X, y)
    np.testing.assert_array_equal(one.predict(X), y)
    nine = MetricAttentionClassifier("euclidean", n_neighbors=9, temperature=INF).fit(X, y)
    assert np.mean(nine.predict(X) == y) > 0.95
    reg = MetricAttentionRegressor("euclidean", n_neighbors=5, temperature=INF).fit(X, y)
    assert np.mean(reg.predict(X).round() == y) > 0.95
    digits = load_digits()
    X, y = digits.data.astype("uint8")[:800], digits.target[:800]
    train, test = slice(0, 600), slice(600, None)
    model = MetricAttentionClassifier("euclidean", temperature=0)
    score_uint8 = model.fit(X[train], y[train]).score(X[test], y[test])
    score_float = model.fit(X[train].astype(float), y[train]).score(X[test].astype(float), y[test])
    assert score_uint8 == score_float


def test_duplicates_leave_one_out_order():
    # test_k_and_radius_neighbors_duplicates: each point's nearest other copy. scikit-learn
    # answers [1, 0, 1]: kneighbors() queries k + 1 neighbours and drops the last column when the
    # point itself is not among them, and its heap lists 1 before 0 for the third point. The
    # (distance, index) rule takes the lowest other index: [1, 0, 0].
    X = np.ones((3, 1))
    ref_idx = NearestNeighbors(n_neighbors=1, algorithm="brute").fit(X).kneighbors()[1]
    assert ref_idx.ravel().tolist() == [1, 0, 1]
    ours = MetricAttentionClassifier("euclidean", n_neighbors=1, temperature=INF).fit(X, [0, 1, 2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        np.testing.assert_array_equal(ours.attention_weights(n_weights=1)[1], [[1], [0], [0]])


@pytest.mark.parametrize("config", ["knn_classifier", "knn_regressor",
                                    "knn_distance_classifier", "knn_distance_regressor"])
@pytest.mark.parametrize("data", list(DATA))
def test_reference_is_scikit_learn_without_kth_ties(config, data):
    # The (distance, index) reference (_cases._ByIndex) is scikit-learn's own estimator on every
    # query where no tie straddles the k-th distance; where one does, scikit-learn's choice is
    # its heap's and the reference takes the lower index.
    _, _, classifier = CONFIGS[config]
    X, y_class, y_reg, Xq = make_data(data)
    y = y_class if classifier else y_reg
    Estimator = KNeighborsClassifier if classifier else KNeighborsRegressor
    by_index = CONFIGS[config][1]().fit(X, y)
    ref = Estimator(n_neighbors=3, weights=by_index.weights).fit(X, y)
    clear = ~kth_tie(X, Xq, 3)
    np.testing.assert_allclose(
        outputs(by_index, Xq[clear], classifier), outputs(ref, Xq[clear], classifier), rtol=1e-12
    )
