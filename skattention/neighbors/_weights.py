"""``weights="distance"`` (or a callable) of the neighbour configurations: the selected keys'
votes weighted by their distances, as scikit-learn's neighbour estimators weight them; and the
k-NN regressor's uniform means at ``temperature=np.inf``, taken as ``KNeighborsRegressor``
takes them (``np.mean``, whose pairwise summation from 8 neighbours no product's order
reproduces).

The engine selects the neighbours (the k nearest, or those within the radius, exactly); the
weights and the weighted averages are computed here in float64 in the order scikit-learn
computes them (its ``_get_weights``, its classifiers' vote accumulation, its regressors'
weighted means), so that ``temperature=np.inf`` equals its estimators. At a finite temperature
the weights also carry the attention's ``exp(-f / T)`` over the selected keys.
"""

import numpy as np
from sklearn.base import is_classifier


def distance_weights(dist, weights):
    """Weights of neighbours at distances ``dist`` (2-d array): ``1 / dist``, except that a
    row with a neighbour at distance 0 gives weight 1 to those and 0 to the others; or
    ``weights(dist)`` for a callable."""
    if callable(weights):
        return np.asarray(weights(dist), dtype=np.float64)
    with np.errstate(divide="ignore"):
        inverse = 1.0 / dist
    at_zero = np.isinf(inverse)
    rows = np.any(at_zero, axis=1)
    inverse[rows] = at_zero[rows]
    return inverse


def check_weights(weights, rows, classifier, padding=None):
    """The weights, with a clear error where a callable's cannot weigh a row; ``padding``: the
    entries of no neighbour (their weights, of an infinite distance, are 0 in the result).
    A regressor's weighted mean takes negative weights, as ``KNeighborsRegressor``'s does; a
    classifier's votes do not (scikit-learn's probabilities were then NaN or negative)."""
    if weights.shape != rows:
        raise ValueError(f"weights returned an array of shape {weights.shape}; expected {rows} "
                         "(one weight per neighbour).")
    if padding is not None:
        weights = np.where(padding, 0.0, weights)
    if not np.all(np.isfinite(weights)):
        raise ValueError("weights returned infinite or NaN values; a neighbour's weight must "
                         "be a finite number.")
    if classifier and np.any(weights < 0):
        raise ValueError("weights returned negative values; a classifier's votes need "
                         "weights >= 0.")
    # (a regressor's mean divides by the sum of the weights)
    if np.any(~(weights > 0).any(axis=1) if classifier else weights.sum(axis=1) == 0):
        raise ValueError(
            "All neighbors of some sample is getting zero weights. Please modify 'weights' to "
            "avoid this case if you are using a user-defined function."
        )
    return weights


def attention_factor(f, temperature):
    """The attention weights ``exp(-(f - min f) / T)`` of each row's selected keys (1 at
    ``T = inf``)."""
    if np.isinf(temperature) or temperature == 0:  # (0: one neighbour)
        return 1.0
    shifted = (f - np.min(np.where(np.isfinite(f), f, np.inf), axis=1, keepdims=True))
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(f), np.exp(-shifted / temperature), 0.0)


def votes(values, indices, weights):
    """``sum_i weights[:, i] * values[indices[:, i]]`` accumulated neighbour by neighbour (the
    order of scikit-learn's ``KNeighborsClassifier.predict_proba``)."""
    out = np.zeros((indices.shape[0], values.shape[1]))
    for i in range(indices.shape[1]):
        out += weights[:, i, None] * values[indices[:, i]]
    return out


def weighted_means(values, indices, weights):
    """Per output column, ``sum(values * weights) / sum(weights)`` over each row's neighbours
    (``KNeighborsRegressor.predict``'s expression)."""
    out = np.empty((indices.shape[0], values.shape[1]))
    denominator = np.sum(weights, axis=1)
    for j in range(values.shape[1]):
        out[:, j] = np.sum(values[indices, j] * weights, axis=1) / denominator
    return out


def neighbour_weighting(estimator):
    """The :class:`DistanceWeighting` that computes ``estimator``'s outputs from its selected
    neighbours, or ``None`` where the engine's attention does: weights other than
    ``"uniform"``, and a regressor's uniform means of the ``n_neighbors`` nearest at
    ``temperature=np.inf`` of unit-weight training points in memory. (A radius's means
    stay the engine's: it sums a ball within any memory budget, where a ball's neighbours at
    once need up to a row of every training point; the two differ in the last bit.)"""
    classifier = is_classifier(estimator)
    if estimator.weights == "uniform":
        keys = estimator._keys
        if (classifier or estimator.temperature_ != np.inf or keys.sharded
                or estimator.n_neighbors is None or estimator.radius is not None):
            return None
        if np.any(keys.log_prior != 0):  # sample weights: the engine's multiplicity
            return None
    elif estimator._keys.sharded:
        estimator._keys.in_memory_only()
    return DistanceWeighting(estimator.weights, estimator.temperature_, estimator.n_neighbors,
                             estimator.radius, classifier)


class DistanceWeighting:
    """The weighted neighbour vote of an estimator with ``weights`` other than ``"uniform"``:
    its neighbours selected by the fitted keys, their values averaged here.

    ``classifier``: class votes (normalised later, as scikit-learn's classifiers normalise
    them) rather than weighted means of the values.
    """

    def __init__(self, weights, temperature, n_neighbors, radius, classifier):
        self.weights = weights
        self.temperature = temperature
        self.n_neighbors = n_neighbors
        self.radius = radius
        self.classifier = classifier

    def propagate(self, keys, metric, Z, selection_kwargs):
        """``(outputs, no_neighbour)`` of the mapped queries ``Z``, as
        :meth:`~._keys.FittedKeys.propagate` returns them; ``selection_kwargs(Z, radius)``:
        the engine's selection arguments of a block of queries."""
        if self.radius is None:
            # temperature=0 is the nearest neighbour alone, whatever n_neighbors
            k = 1 if self.temperature == 0 else self.n_neighbors
            f, idx = keys.select(Z, k, False, selection_kwargs(Z, None))
            if self.weights == "uniform":  # KNeighborsRegressor's expression
                return np.mean(keys.values[idx], axis=1), None
            # fewer unmasked keys (weight 0) than k: the padding (-1) weighs nothing
            padding = idx < 0
            idx = np.where(padding, 0, idx)
            dist = np.where(padding, np.inf, metric.exact_distances(Z, keys.points, idx))
            w = distance_weights(dist.copy(), self.weights)
            w = check_weights(w, dist.shape, self.classifier, padding)
            w = w * attention_factor(f, self.temperature)
            if self.classifier:
                return votes(keys.values, idx, w), None
            return weighted_means(keys.values, idx, w), None
        out = np.zeros((Z.shape[0], keys.values.shape[1]))
        empty = np.zeros(Z.shape[0], dtype=bool)
        for rows, f, idx in keys.within(Z, self.radius, False, selection_kwargs):
            for j, i in enumerate(rows.tolist()):
                found = idx[j] >= 0
                order = np.argsort(idx[j][found], kind="stable")  # index order
                ind = idx[j][found][order]
                if not ind.size:
                    empty[i] = True
                    continue
                row_f = f[j][found][order][None]
                dist = metric.exact_distances(Z[i:i + 1], keys.points, ind[None])
                w = distance_weights(dist.copy(), self.weights)
                check_weights(w, dist.shape, self.classifier)
                w = (w * attention_factor(row_f, self.temperature))[0]
                if self.classifier:  # scikit-learn's bincount: sums in index order
                    out[i] = votes(keys.values, ind[None], w[None])[0]
                else:
                    out[i] = np.average(keys.values[ind], axis=0, weights=w)
        return out, empty

