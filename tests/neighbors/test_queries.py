"""kneighbors / radius_neighbors equal scikit-learn's NearestNeighbors; metric="precomputed"
equals scikit-learn's neighbour estimators on precomputed distances."""

import numpy as np
import pytest
import torch
from scipy.spatial.distance import cdist
from sklearn.datasets import make_classification
from sklearn.neighbors import (
    KNeighborsClassifier,
    KNeighborsRegressor,
    NearestNeighbors,
    RadiusNeighborsClassifier,
    RadiusNeighborsRegressor,
)
from sklearn.utils.estimator_checks import check_positive_only_tag_during_fit

from skattention import (
    MetricAttentionClassifier,
    MetricAttentionRegressor,
    MetricAttentionTransformer,
)


@pytest.fixture(scope="module")
def continuous():
    X, y = make_classification(n_samples=400, n_features=5, n_informative=3, random_state=0)
    return X[:300], y[:300], X[300:]


@pytest.fixture(scope="module")
def integer_duplicates():
    """Small integer coordinates: many exact ties, and duplicated rows."""
    rng = np.random.default_rng(0)
    X = rng.integers(0, 4, size=(120, 3)).astype(float)
    X = np.vstack([X, X[:30]])  # duplicated rows
    y = rng.integers(0, 3, size=len(X))
    return X, y, rng.integers(0, 4, size=(40, 3)).astype(float)


def reference_kneighbors(Xq, X, k, exclude_self=False):
    """Exact k nearest in (distance, index) order, from float64 distances."""
    d = cdist(Xq.astype(np.float64), X.astype(np.float64))
    if exclude_self:
        np.fill_diagonal(d, np.inf)
    order = np.lexsort((np.broadcast_to(np.arange(X.shape[0]), d.shape), d), axis=1)[:, :k]
    return np.take_along_axis(d, order, 1), order


def euclidean(cls=MetricAttentionClassifier, **params):
    return cls("euclidean", temperature=np.inf, **params)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("k", [1, 5, 17])
def test_kneighbors_equals_nearest_neighbors(continuous, dtype, k):
    X, y, Xq = (a.astype(dtype) if a.dtype.kind == "f" else a for a in continuous)
    nn = NearestNeighbors(n_neighbors=k).fit(X)
    att = euclidean(n_neighbors=k).fit(X, y)
    for query in (Xq, None):
        dist, ind = att.kneighbors(query)
        ref_dist, ref_ind = nn.kneighbors(query)
        np.testing.assert_array_equal(ind, ref_ind)
        assert dist.dtype == np.float64 and ind.dtype == np.int64
        # 5 features: scikit-learn's k-d tree, its float64 distances summed term by term (of
        # float32 data too: computed in float64 from the coordinates, not rounded to float32)
        np.testing.assert_array_equal(dist, ref_dist)
        np.testing.assert_array_equal(att.kneighbors(query, return_distance=False), ind)
        radius = float(np.median(ref_dist))
        for ours, theirs in zip(att.radius_neighbors(query, radius, sort_results=True),
                                nn.radius_neighbors(query, radius, sort_results=True),
                                strict=True):
            for a, b in zip(ours, theirs, strict=True):
                np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kneighbors_ties_and_duplicates(integer_duplicates, dtype):
    X, y, Xq = integer_duplicates
    X, Xq = X.astype(dtype), Xq.astype(dtype)
    att = euclidean(n_neighbors=7).fit(X, y)
    nn = NearestNeighbors(n_neighbors=7).fit(X)
    for query, exclude in ((Xq, False), (None, True)):
        dist, ind = att.kneighbors(query)
        ref_dist, ref_ind = reference_kneighbors(X if query is None else Xq, X, 7, exclude)
        np.testing.assert_array_equal(ind, ref_ind)  # ties: the lower index first
        np.testing.assert_array_equal(dist, ref_dist)  # integer data: exact
        np.testing.assert_allclose(dist, nn.kneighbors(query)[0], atol=1e-6)
    # X=None excludes the point itself but not its duplicate (distance 0)
    dist, ind = att.kneighbors(None, n_neighbors=1)
    assert np.all(dist[:30] == 0) and np.all(dist[120:] == 0)
    assert np.all(ind[:, 0] != np.arange(len(X)))
    assert np.all(ind[120:, 0] < 120)  # the lowest index among the duplicates


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_radius_neighbors_equals_nearest_neighbors(integer_duplicates, dtype):
    X, y, Xq = integer_duplicates
    X, Xq = X.astype(dtype), Xq.astype(dtype)
    nn = NearestNeighbors().fit(X)
    att = euclidean(MetricAttentionRegressor, radius=1.5).fit(X, y.astype(float))
    for query in (Xq, None):
        for radius in (None, 1.0, 2.0, 10.0):  # 10: every training point
            dist, ind = att.radius_neighbors(query, radius=radius)
            ref_dist, ref_ind = nn.radius_neighbors(query, radius=radius or 1.5)
            assert ind.dtype == object and len(ind) == len(ref_ind)
            for d, i, rd, ri in zip(dist, ind, ref_dist, ref_ind, strict=True):
                np.testing.assert_array_equal(i, np.sort(ri))  # unsorted: index order
                np.testing.assert_allclose(d, rd[np.argsort(ri)], atol=1e-6)
        dist, ind = att.radius_neighbors(query, radius=2.0, sort_results=True)
        for d, i in zip(dist, ind, strict=True):
            assert np.all(np.diff(d) >= 0)
            ties = np.diff(d) == 0
            assert np.all(np.diff(i)[ties] > 0)  # equal distances: the lower index first
    # a point exactly at the radius is a neighbour (integer data: distance 1 exactly)
    _, ind = att.radius_neighbors([[0.0, 0.0, 0.0]], radius=1.0)
    assert np.all(np.abs(X[ind[0]]).sum(1) <= 1) and ind[0].size > 0
    assert np.any(np.abs(X[ind[0]]).sum(1) == 1)


def test_radius_neighbors_more_than_first_gather(continuous):
    """Queries with many neighbours (more than the first gathered width) get all of them."""
    X, y, Xq = continuous
    att = euclidean(radius=50.0).fit(X, y)
    _, ind = att.radius_neighbors(Xq[:3])
    assert all(i.size == X.shape[0] for i in ind)


@pytest.mark.parametrize("metric", ["linear", "mlp", "tabular"])  # tabular: not squared
def test_kneighbors_in_the_learned_space(continuous, metric):
    X, y, Xq = continuous
    att = MetricAttentionClassifier(
        metric, n_neighbors=4, temperature=np.inf, max_iter=3, hidden_size=8, random_state=0
    ).fit(X, y)
    Z = att._keys.points
    nn = NearestNeighbors(n_neighbors=4).fit(Z)
    dist, ind = att.kneighbors(Xq)
    Zq = np.concatenate([att._strategy.embed(Q, "query", torch.device("cpu"), att._compute_dtype())
                         for Q in att._encoded_blocks(Xq)])  # encoded, mapped
    ref_dist, ref_ind = nn.kneighbors(Zq)
    np.testing.assert_array_equal(ind, ref_ind)
    np.testing.assert_allclose(dist, ref_dist, rtol=1e-5)
    # the neighbours behind the k-NN prediction
    proba = att.predict_proba(Xq)
    votes = np.stack([np.bincount(r, minlength=2) for r in y[ind]]) / 4
    np.testing.assert_allclose(proba, votes, atol=1e-6)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("metric", ["linear", "tabular"])
def test_transformer_queries_equal_nearest_neighbors_on_its_output(continuous, metric):
    """The transformer's kneighbors / radius_neighbors: NearestNeighbors (Euclidean) fitted on
    ``transform(X)`` and queried with ``transform`` of the queries."""
    X, y, Xq = continuous
    weight = np.ones(len(X))
    weight[5] = 0.0  # a point of zero weight is no one's neighbour, as in prediction
    tr = MetricAttentionTransformer(n_components=3, metric=metric, max_iter=3, hidden_size=8,
                                    random_state=0).fit(X, y, sample_weight=weight)
    Z, Zq = tr.transform(X), tr.transform(Xq)
    kept = np.flatnonzero(weight > 0)
    nn = NearestNeighbors(n_neighbors=6).fit(Z[kept])
    dist, ind = tr.kneighbors(Xq, n_neighbors=6)
    ref_dist, ref_ind = nn.kneighbors(Zq)
    np.testing.assert_array_equal(ind, kept[ref_ind])
    np.testing.assert_allclose(dist, ref_dist, rtol=1e-5, atol=1e-6)
    assert tr.kneighbors(Xq[:4], n_neighbors=2, return_distance=False).shape == (4, 2)
    # X=None: each training point's neighbours but itself
    ind_self = tr.kneighbors(n_neighbors=3, return_distance=False)
    assert ind_self.shape == (len(X), 3)
    assert not np.any(ind_self == np.arange(len(X))[:, None]) and not np.any(ind_self == 5)
    radius = float(np.median(ref_dist[:, 2]))
    r_dist, r_ind = tr.radius_neighbors(Xq, radius=radius, sort_results=True)
    ref_r_dist, ref_r_ind = nn.radius_neighbors(Zq, radius=radius, sort_results=True)
    assert sum(i.size for i in r_ind) > 0
    for d, i, ref_d, ref_i in zip(r_dist, r_ind, ref_r_dist, ref_r_ind, strict=True):
        np.testing.assert_array_equal(i, kept[ref_i])
        np.testing.assert_allclose(d, ref_d, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="needs a radius"):
        tr.radius_neighbors(Xq)  # the transformer has no radius of its own


def test_kneighbors_errors(continuous):
    X, y, Xq = continuous
    att = euclidean(n_neighbors=3).fit(X, y)
    for k in (0, 0.0, -1.5):
        with pytest.raises(ValueError, match="n_neighbors > 0"):
            att.kneighbors(Xq, n_neighbors=k)
    for k in (2.0, 2.5, True):  # scikit-learn's TypeError
        with pytest.raises(TypeError, match="n_neighbors does not take"):
            att.kneighbors(Xq, n_neighbors=k)
    with pytest.raises(ValueError, match="n_neighbors <= 299"):
        att.kneighbors(None, n_neighbors=300)
    assert att.kneighbors(Xq, n_neighbors=300)[1].shape == (100, 300)
    with pytest.raises(ValueError, match="needs a radius"):
        att.radius_neighbors(Xq)
    with pytest.raises(ValueError, match="sort_results"):
        att.radius_neighbors(Xq, radius=1.0, return_distance=False, sort_results=True)
    with pytest.raises(ValueError, match="features"):
        att.kneighbors(Xq[:, :3])
    dot = MetricAttentionClassifier("dot", max_iter=1, random_state=0).fit(X, y)
    with pytest.raises(ValueError, match="distance metric"):
        dot.radius_neighbors(Xq, radius=1.0)
    # zero-weight training points are removed: no one's neighbour
    w = np.ones(len(X))
    w[:10] = 0
    _, ind = euclidean(n_neighbors=3).fit(X, y, sample_weight=w).kneighbors(X[:10])
    assert np.all(ind >= 10)


def test_more_attention_weights_than_a_selection_holds_are_zero_padded(continuous):
    X, y, Xq = continuous
    att = euclidean(n_neighbors=3).fit(X, y)
    weights, indices = att.attention_weights(Xq[:4], n_weights=5)
    three, first = att.attention_weights(Xq[:4])
    np.testing.assert_array_equal(weights[:, :3], three)
    np.testing.assert_array_equal(indices[:, :3], first)
    assert np.all(weights[:, 3:] == 0) and np.all(indices[:, 3:] == -1)
    # weights of a half count as half a key: the selection holds six keys
    half = euclidean(n_neighbors=3).fit(X, y, sample_weight=np.full(len(X), 0.5))
    weights, indices = half.attention_weights(Xq[:4], n_weights=8)
    assert np.all(indices[:, :6] >= 0) and np.all(indices[:, 6:] == -1)
    np.testing.assert_allclose(weights.sum(1), 1.0)


# ---------------------------------------------------------------------- metric="precomputed"


@pytest.fixture(scope="module")
def distances(continuous):
    X, y, Xq = continuous  # no ties: scikit-learn's order among tied distances is arbitrary
    return cdist(X, X), y, cdist(Xq, X)


@pytest.fixture(scope="module")
def tied_distances(integer_duplicates):
    X, y, Xq = integer_duplicates
    return cdist(X, X), y, cdist(Xq, X)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("k", [1, 6])
def test_precomputed_knn(distances, dtype, k):
    D, y, Dq = (a.astype(dtype) if a.dtype.kind == "f" else a for a in distances)
    ref = KNeighborsClassifier(k, metric="precomputed").fit(D, y)
    att = MetricAttentionClassifier("precomputed", n_neighbors=k, temperature=np.inf).fit(D, y)
    np.testing.assert_allclose(att.predict_proba(Dq), ref.predict_proba(Dq), atol=1e-12)
    np.testing.assert_array_equal(att.kneighbors(Dq)[1], ref.kneighbors(Dq)[1])
    np.testing.assert_array_equal(att.kneighbors()[1], ref.kneighbors()[1])
    nn1 = KNeighborsClassifier(1, metric="precomputed").fit(D, y)
    att0 = MetricAttentionClassifier("precomputed", temperature=0).fit(D, y)
    np.testing.assert_array_equal(att0.predict_proba(Dq), nn1.predict_proba(Dq))
    reg_ref = KNeighborsRegressor(k, metric="precomputed").fit(D, y.astype(float))
    reg = MetricAttentionRegressor("precomputed", n_neighbors=k, temperature=np.inf)
    np.testing.assert_allclose(reg.fit(D, y.astype(float)).predict(Dq), reg_ref.predict(Dq),
                               rtol=1e-12)



@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_precomputed_ties(tied_distances, dtype):
    """Tied and duplicated distances: (distance, index) order, X=None excluding only itself."""
    D, y, Dq = (a.astype(dtype) if a.dtype.kind == "f" else a for a in tied_distances)
    k = 6
    att = MetricAttentionClassifier("precomputed", n_neighbors=k, temperature=np.inf).fit(D, y)
    for queries, own in ((Dq, None), (None, np.arange(len(D)))):
        dist, ind = att.kneighbors(queries)
        rows = (D if queries is None else Dq).astype(np.float64)
        if own is not None:
            rows = rows.copy()
            rows[own, own] = np.inf  # each training point excluded from its own neighbours
        order = np.lexsort((np.broadcast_to(np.arange(len(D)), rows.shape), rows), axis=1)
        np.testing.assert_array_equal(ind, order[:, :k])  # ties: the lower index first
        np.testing.assert_array_equal(dist, np.take_along_axis(rows, ind, 1))



def test_precomputed_equals_euclidean(integer_duplicates):
    """Precomputed Euclidean distances give the euclidean estimator's neighbours and
    predictions at every temperature."""
    X, y, Xq = integer_duplicates
    D, Dq = cdist(X, X), cdist(Xq, X)
    for params in (dict(n_neighbors=5, temperature=np.inf), dict(temperature=0),
                   dict(temperature=0.7), dict(n_neighbors=9, temperature=2.0)):
        pre = MetricAttentionClassifier("precomputed", **params).fit(D, y)
        euc = MetricAttentionClassifier("euclidean", **params).fit(X, y)
        np.testing.assert_allclose(pre.predict_proba(Dq), euc.predict_proba(Xq), atol=1e-12)
        np.testing.assert_array_equal(pre.kneighbors(n_neighbors=4)[1],
                                      euc.kneighbors(n_neighbors=4)[1])
        np.testing.assert_array_equal(pre.kneighbors(Dq)[1], euc.kneighbors(Xq)[1])


def test_precomputed_kneighbors_ignores_the_estimators_radius(distances):
    """kneighbors is the k nearest whatever the estimator's radius, as with the features
    (found in the redesign: a precomputed model's radius masked its kneighbors)."""
    D, y, Dq = distances
    radius = float(np.quantile(Dq, 0.01))  # most queries have fewer than 3 points within it
    att = MetricAttentionClassifier("precomputed", radius=radius, temperature=np.inf).fit(D, y)
    ref = NearestNeighbors(n_neighbors=3, metric="precomputed").fit(D)
    dist, ind = att.kneighbors(Dq, 3)
    ref_dist, ref_ind = ref.kneighbors(Dq)
    np.testing.assert_array_equal(ind, ref_ind)
    np.testing.assert_allclose(dist, ref_dist, rtol=1e-12)
    np.testing.assert_array_equal(att.kneighbors(None, 2)[1], ref.kneighbors(None, 2)[1])


def test_precomputed_radius(tied_distances):
    D, y, Dq = tied_distances
    radius = 1.0  # integer coordinates: many training points at exactly this distance
    has = (Dq <= radius).any(1)
    ref = RadiusNeighborsClassifier(radius, metric="precomputed").fit(D, y)
    att = MetricAttentionClassifier("precomputed", radius=radius, temperature=np.inf).fit(D, y)
    np.testing.assert_allclose(att.predict_proba(Dq[has]), ref.predict_proba(Dq[has]),
                               atol=1e-12)
    reg_ref = RadiusNeighborsRegressor(radius, metric="precomputed").fit(D, y.astype(float))
    reg = MetricAttentionRegressor("precomputed", radius=radius, temperature=np.inf)
    reg.fit(D, y.astype(float))
    np.testing.assert_allclose(reg.predict(Dq[has]), reg_ref.predict(Dq[has]), rtol=1e-12)
    dist, ind = att.radius_neighbors(Dq, radius=radius)
    ref_dist, ref_ind = NearestNeighbors(metric="precomputed").fit(D).radius_neighbors(
        Dq, radius=radius)
    for d, i, rd, ri in zip(dist, ind, ref_dist, ref_ind, strict=True):
        np.testing.assert_array_equal(i, np.sort(ri))
        np.testing.assert_array_equal(d, rd[np.argsort(ri)])
    if not has.all():
        with pytest.raises(ValueError, match="No neighbors found"):
            att.predict(Dq)


def test_precomputed_errors(tied_distances):
    D, y, Dq = tied_distances
    att = MetricAttentionClassifier("precomputed", n_neighbors=3, temperature=np.inf)
    with pytest.raises(ValueError, match="must be square"):
        att.fit(D[:, :-1], y)
    negative = D.copy()
    negative[0, 1] = -1.0
    with pytest.raises(ValueError, match="Negative values"):
        att.fit(negative, y)
    with pytest.raises(ValueError, match="temperature='auto'"):
        MetricAttentionClassifier("precomputed").fit(D, y)
    att.fit(D, y)
    with pytest.raises(ValueError, match="features"):
        att.predict(Dq[:, :-1])
    with pytest.raises(ValueError, match="Negative values"):
        att.predict(-Dq)
    with pytest.raises(ValueError, match="NaN"):
        att.fit(np.where(D == 0, np.nan, D), y)
    with pytest.raises(TypeError, match="dense distance matrix"):
        from scipy import sparse
        att.fit(sparse.csr_matrix(D), y)
    assert att.__sklearn_tags__().input_tags.pairwise



@pytest.mark.parametrize("cls", [MetricAttentionClassifier, MetricAttentionRegressor])
def test_precomputed_distances_are_tagged_positive_only(cls):
    # negative distances are refused, so the tag says so (scikit-learn's
    # check_positive_only_tag_during_fit then expects that refusal instead of a fit)
    estimator = cls("precomputed", temperature=1.0)
    assert estimator.__sklearn_tags__().input_tags.positive_only
    assert not cls("euclidean").__sklearn_tags__().input_tags.positive_only
    check_positive_only_tag_during_fit(cls.__name__, estimator)

# ---------------------------------------------------------------------- multi-output


@pytest.fixture(scope="module")
def multi_output(continuous):
    X, y, Xq = continuous
    rng = np.random.default_rng(1)
    Y = np.column_stack([y, rng.choice(["a", "b", "c"], size=len(y)), (X[:, 0] > 0) * 2])
    return X, Y, Xq


@pytest.mark.parametrize("params", [dict(n_neighbors=5, temperature=np.inf),
                                    dict(temperature=0), dict(radius=2.5, temperature=np.inf)])
def test_multi_output_classification(multi_output, params):
    X, Y, Xq = multi_output
    if "radius" in params:
        ref = RadiusNeighborsClassifier(params["radius"], outlier_label="most_frequent")
    else:
        ref = KNeighborsClassifier(params.get("n_neighbors", 1))
    ref.fit(X, Y)
    att = MetricAttentionClassifier("euclidean", outlier_label="most_frequent", **params)
    att.fit(X, Y)
    assert att.outputs_2d_ and len(att.classes_) == 3
    for c, rc in zip(att.classes_, ref.classes_, strict=True):
        np.testing.assert_array_equal(c, rc)
    proba, ref_proba = att.predict_proba(Xq), ref.predict_proba(Xq)
    assert isinstance(proba, list) and len(proba) == 3
    for p, rp in zip(proba, ref_proba, strict=True):
        np.testing.assert_allclose(p, rp, atol=1e-12)
    untied = np.all([np.sort(p, 1)[:, -1] > np.sort(p, 1)[:, -2] for p in ref_proba], axis=0)
    pred = att.predict(Xq)
    assert pred.shape == (len(Xq), 3)
    np.testing.assert_array_equal(pred[untied], ref.predict(Xq)[untied])


def test_multi_output_learned_and_single_column(multi_output):
    X, Y, Xq = multi_output
    att = MetricAttentionClassifier("linear", max_iter=3, hidden_size=4, random_state=0)
    pred = att.fit(X, Y).predict(Xq)
    assert pred.shape == (len(Xq), 3) and set(pred[:, 1]) <= {"a", "b", "c"}
    att.set_params(class_weight="balanced").fit(X, Y)
    # a single column: one output, with scikit-learn's warning
    from sklearn.exceptions import DataConversionWarning
    with pytest.warns(DataConversionWarning):
        one = MetricAttentionClassifier("euclidean", n_neighbors=3, temperature=np.inf).fit(
            X, Y[:, :1])
    assert not one.outputs_2d_ and one.predict(Xq).shape == (len(Xq),)
    with pytest.raises(ValueError, match="2 labels but y has 3 outputs"):
        MetricAttentionClassifier("euclidean", radius=1.0, outlier_label=[0, 1]).fit(X, Y)


def test_queries_do_not_depend_on_the_batching(integer_duplicates):
    """Small working memory: many query blocks, each excluding its own training points."""
    import skattention

    X, y, Xq = integer_duplicates
    att = euclidean(MetricAttentionRegressor, n_neighbors=4).fit(X, y.astype(float))
    expected = att.kneighbors(), att.radius_neighbors(radius=1.5, sort_results=True)
    with skattention.config_context(working_memory=0.01):
        got = att.kneighbors(), att.radius_neighbors(radius=1.5, sort_results=True)
    for e, g in zip(expected[0], got[0], strict=True):
        np.testing.assert_array_equal(e, g)
    for e, g in zip(expected[1], got[1], strict=True):
        for a, b in zip(e, g, strict=True):
            np.testing.assert_array_equal(a, b)


def test_precomputed_pickles_without_its_identity_keys(distances):
    import pickle

    D, y, Dq = distances
    att = MetricAttentionClassifier("precomputed", n_neighbors=3, temperature=np.inf).fit(D, y)
    expected = att.predict_proba(Dq)
    blob = pickle.dumps(att)
    assert len(blob) < 1.5 * D.nbytes  # the distances, not also an identity of their size
    np.testing.assert_array_equal(pickle.loads(blob).predict_proba(Dq), expected)


# ---------------------------------------------------------------------- graphs


@pytest.mark.parametrize("mode", ["connectivity", "distance"])
def test_graphs_equal_nearest_neighbors(integer_duplicates, mode):
    """kneighbors_graph / radius_neighbors_graph: scipy CSR matrices equal to
    NearestNeighbors' (ties included: scikit-learn's brute force keeps the lower index)."""
    X, y, Xq = integer_duplicates
    att = euclidean(n_neighbors=4, radius=1.5).fit(X, y)
    nn = NearestNeighbors(n_neighbors=4, radius=1.5, algorithm="brute").fit(X)
    for query in (Xq, None):
        ours, ref = att.radius_neighbors_graph(query, mode=mode), \
            nn.radius_neighbors_graph(query, mode=mode)
        assert ours.format == "csr" and ours.shape == ref.shape == (len(query)
                                                                    if query is not None
                                                                    else len(X), len(X))
        np.testing.assert_allclose(ours.toarray(), ref.toarray(), rtol=1e-12)
    continuous_X = X + np.random.default_rng(1).normal(scale=0.05, size=X.shape)  # no ties
    att.fit(continuous_X, y)
    nn.fit(continuous_X)
    for query in (Xq, None):
        ours, ref = att.kneighbors_graph(query, mode=mode), nn.kneighbors_graph(query, mode=mode)
        assert ours.format == "csr" and ours.nnz == ref.nnz
        # (distances from expanded products, as scikit-learn's: close, not bit for bit)
        np.testing.assert_allclose(ours.toarray(), ref.toarray(), rtol=1e-9)
    with pytest.raises(ValueError, match="Unsupported mode"):
        att.kneighbors_graph(Xq, mode="weights")


def test_graph_rows_sorted_by_distance(continuous):
    X, y, Xq = continuous
    att = euclidean(radius=2.0).fit(X, y)
    graph = att.radius_neighbors_graph(Xq[:5], mode="distance", sort_results=True)
    for i in range(5):
        row = graph.data[graph.indptr[i]:graph.indptr[i + 1]]
        assert np.all(np.diff(row) >= 0)


@pytest.mark.parametrize("labels, outlier", [([0, 1], "unknown"), (["no", "yes"], 5)])
def test_an_outlier_label_of_another_kind_than_the_classes_is_an_error(labels, outlier):
    # as RadiusNeighborsClassifier: a string label made every numeric prediction a string
    X = np.arange(6.0).reshape(-1, 1)
    y = np.array(labels)[np.arange(6) % 2]
    clf = MetricAttentionClassifier("euclidean", radius=0.5, temperature=np.inf,
                                    outlier_label=outlier)
    with pytest.raises(TypeError, match="outlier_label .* inconsistent with classes"):
        clf.fit(X, y)
    with pytest.raises(TypeError, match="inconsistent"):
        clf.set_params(outlier_label=[0, outlier]).fit(X, np.column_stack([y, y]))
    # a label of the classes' kind, also one not among them, keeps working
    clf.set_params(outlier_label="maybe" if outlier == 5 else -1).fit(X, y)
    with pytest.warns(UserWarning, match="not in training classes"):
        assert clf.predict([[100.0]]).dtype.kind == y.dtype.kind
    if outlier == 5:  # object classes hold any label
        clf.set_params(outlier_label=outlier).fit(X, y.astype(object))
        with pytest.warns(UserWarning, match="not in training classes"):
            assert clf.predict([[100.0]])[0] == outlier


def test_a_column_constant_at_fit_is_a_distance_for_the_fixed_metric():
    # a learned map's untrained columns are held at their fitted value; a fixed metric's
    # distances are the input's (the held column put every query at distance 0 of the keys)
    rng = np.random.default_rng(0)
    X = np.c_[rng.normal(size=(60, 2)), np.ones(60)]
    Q = np.c_[rng.normal(size=(5, 2)), np.full(5, 4.0)]
    y = rng.integers(0, 2, 60)
    att = euclidean(n_neighbors=3).fit(X, y)
    for ours, theirs in zip(att.kneighbors(Q), NearestNeighbors(n_neighbors=3).fit(X).kneighbors(Q),
                            strict=True):
        np.testing.assert_array_equal(ours, theirs)
    assert all(len(i) == 0 for i in att.radius_neighbors(Q, 1.0, return_distance=False))
