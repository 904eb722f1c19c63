"""``kneighbors`` and ``radius_neighbors`` of the metric-attention estimators, with
scikit-learn's signatures and semantics, on the engine's exact selection."""

import math
from numbers import Integral, Real

import numpy as np
from sklearn.utils.validation import check_is_fitted

from .._engine import budget_bytes, plan_rows, resolve_device
from ..utils._threads import uses_n_jobs

# radius_neighbors: neighbours gathered per query row at first (doubled for the rows that have
# more within the radius)
_FIRST_RADIUS_NEIGHBORS = 32
# kneighbors' default without n_neighbors (scikit-learn's NearestNeighbors default)
_DEFAULT_N_NEIGHBORS = 5


class NeighborsQueryMixin:
    """``kneighbors`` and ``radius_neighbors`` in the estimator's metric space.

    The engine selects the neighbours exactly, in (distance, index) order, as the k-NN and
    radius priors of prediction do; distances are the square roots of the pseudo-metric's
    values (its squared distances). Training points of zero weight, removed from prediction,
    are no one's neighbours.
    """

    @uses_n_jobs
    def kneighbors(self, X=None, n_neighbors=None, return_distance=True):
        """The nearest training points of each query, as
        :meth:`sklearn.neighbors.NearestNeighbors.kneighbors`.

        Distances are measured in the estimator's metric space: the Euclidean distance of the
        encoded inputs for ``metric="euclidean"``, the given distances for
        ``metric="precomputed"``, the Euclidean distance between the mapped query and the mapped
        training point for the learned ``"mlp"``, ``"linear"`` and ``"tabular"`` metrics (the
        space of :meth:`MetricAttentionTransformer.transform`),
        and the pseudo-metric's value ``-(W_Q x).(W_K y)`` itself for ``"dot"``, which is not a
        distance. Among training points at exactly the same distance the lower index comes first.

        Parameters
        ----------
        X : array-like of shape (n_queries, n_features), default=None
            Query points (for ``metric="precomputed"``, their distances to the training points,
            shape (n_queries, n_samples_fit)). ``None``: the training points, each excluded from
            its own neighbours (duplicates of it are not).
        n_neighbors : int, default=None
            Number of neighbours; by default the estimator's ``n_neighbors``, else 5.
        return_distance : bool, default=True
            Whether to return the distances.

        Returns
        -------
        neigh_dist : ndarray of shape (n_queries, n_neighbors)
            Distances to the neighbours, ascending (float64). Only with ``return_distance``.
        neigh_ind : ndarray of shape (n_queries, n_neighbors)
            Indices of the neighbours in the training set.

        Examples
        --------
        >>> import numpy as np
        >>> from skattention import MetricAttentionClassifier
        >>> X = np.array([[0.0], [1.0], [3.0], [7.0]])
        >>> clf = MetricAttentionClassifier("euclidean", n_neighbors=2, temperature=np.inf)
        >>> clf = clf.fit(X, [0, 0, 1, 1])
        >>> clf.kneighbors([[2.5]])
        (array([[0.5, 1.5]]), array([[2, 1]]))
        >>> clf.kneighbors(return_distance=False)  # each point's neighbours but itself
        array([[1, 2],
               [0, 2],
               [1, 0],
               [2, 1]])
        """
        check_is_fitted(self)
        if n_neighbors is None:
            n_neighbors = self.n_neighbors or _DEFAULT_N_NEIGHBORS
        if not isinstance(n_neighbors, Integral) or isinstance(n_neighbors, bool) or (
            n_neighbors <= 0
        ):
            raise ValueError(f"Expected n_neighbors > 0. Got {n_neighbors!r}.")
        n_neighbors = int(n_neighbors)
        available = self._n_keys_available(X is None)
        if n_neighbors > available:
            raise ValueError(
                f"Expected n_neighbors <= {available}, the training points that can be "
                f"neighbours{' (each but the query itself)' if X is None else ''}; got "
                f"n_neighbors={n_neighbors}."
            )
        dist, ind = [], []
        device = resolve_device(self.device)
        for Z, exclude_self in self._embedded_blocks(X, device):
            f, idx = self._keys.select(Z, n_neighbors, exclude_self,
                                       self._selection_kwargs(Z, device))
            dist.append(f)
            ind.append(idx)
        ind = np.concatenate(ind)
        if not return_distance:
            return ind
        return self._strategy.distances(np.concatenate(dist)), ind

    @uses_n_jobs
    def radius_neighbors(self, X=None, radius=None, return_distance=True, sort_results=False):
        """The training points within ``radius`` of each query, as
        :meth:`sklearn.neighbors.NearestNeighbors.radius_neighbors`.

        A point at distance exactly ``radius`` is included. Distances are measured as in
        :meth:`kneighbors`; ``metric="dot"`` has no distance and raises ``ValueError``.

        Parameters
        ----------
        X : array-like of shape (n_queries, n_features), default=None
            Query points (for ``metric="precomputed"``, their distances to the training points).
            ``None``: the training points, each excluded from its own neighbours.
        radius : float, default=None
            Radius of the neighbourhoods; by default the estimator's ``radius``.
        return_distance : bool, default=True
            Whether to return the distances.
        sort_results : bool, default=False
            Sort each query's neighbours by increasing distance (the lower index first among
            equal distances); otherwise they come in increasing index order. Needs
            ``return_distance=True``, as in scikit-learn.

        Returns
        -------
        neigh_dist : ndarray of shape (n_queries,) and dtype object
            Arrays of the distances to each query's neighbours. Only with ``return_distance``.
        neigh_ind : ndarray of shape (n_queries,) and dtype object
            Arrays of the indices of each query's neighbours in the training set.

        Examples
        --------
        >>> import numpy as np
        >>> from skattention import MetricAttentionRegressor
        >>> X = np.array([[0.0], [1.0], [3.0], [7.0]])
        >>> reg = MetricAttentionRegressor("euclidean", radius=2.0, temperature=np.inf)
        >>> reg = reg.fit(X, [0.0, 1.0, 2.0, 3.0])
        >>> dist, ind = reg.radius_neighbors([[2.5]], sort_results=True)
        >>> dist[0], ind[0]
        (array([0.5, 1.5]), array([2, 1]))
        """
        check_is_fitted(self)
        if radius is None:
            radius = self.radius
        if radius is None:
            raise ValueError(
                "radius_neighbors needs a radius: pass radius= or fit the estimator with one."
            )
        if not isinstance(radius, Real) or isinstance(radius, bool) or not radius > 0:
            raise ValueError(f"radius must be a positive number, got {radius!r}.")
        if sort_results and not return_distance:
            raise ValueError("return_distance must be True if sort_results is True.")
        if self.metric == "dot":
            raise ValueError("radius_neighbors needs a distance metric; metric='dot' has none.")
        dist, ind = [], []
        n_keys = self.n_samples_fit_
        device = resolve_device(self.device)
        for Z, exclude_self in self._embedded_blocks(X, device):
            for rows, f, idx in self._within(Z, float(radius), exclude_self, n_keys, device):
                dist.extend(self._strategy.distances(f[i][idx[i] >= 0]) for i in range(rows))
                ind.extend(idx[i][idx[i] >= 0] for i in range(rows))
        if not sort_results:  # index order, as scikit-learn's brute-force search gives
            orders = [np.argsort(i, kind="stable") for i in ind]
            ind = [i[o] for i, o in zip(ind, orders, strict=True)]
            dist = [d[o] for d, o in zip(dist, orders, strict=True)]
        ind = _object_array(ind)
        return (_object_array(dist), ind) if return_distance else ind

    # ------------------------------------------------------------------ helpers

    def _within(self, Z, radius, exclude_self, n_keys, device):
        """Yield ``(rows, f, idx)`` per chunk of the query block ``Z``: every unmasked key within
        ``radius`` in (distance, index) order, padded with ``inf`` and ``-1``. Chunks are
        gathered with room for ``k`` neighbours per row, ``k`` doubled for the rows that fill it
        (their k-th neighbour is within the radius, so more may be)."""
        k = min(n_keys, _FIRST_RADIUS_NEIGHBORS)
        rows = plan_rows(Z.shape[0], row_bytes=32 * k, budget=budget_bytes())
        for start in range(0, Z.shape[0], rows):
            Zc = Z[start:start + rows]
            own = exclude_self
            if isinstance(own, np.ndarray):
                own = own[start:start + rows]
            f, idx = self._keys.select(Zc, k, own, self._selection_kwargs(Zc, device, radius))
            full = np.flatnonzero(idx[:, -1] >= 0)
            width = k
            while full.size and width < n_keys:
                width = min(n_keys, 2 * width)
                f_more, idx_more = self._keys.select(
                    Zc[full], width, own[full] if isinstance(own, np.ndarray) else own,
                    self._selection_kwargs(Zc[full], device, radius),
                )
                f, idx = _widen(f, width), _widen(idx, width, -1)
                f[full], idx[full] = f_more, idx_more
                full = full[idx_more[:, -1] >= 0]
            yield Zc.shape[0], f, idx

    def _selection_kwargs(self, Z, device, radius=None):
        """The engine's selection arguments: the estimator's metric, masks and precision."""
        kwargs = self._engine_kwargs(device)
        selection = dict(metric=kwargs["metric"], log_prior=kwargs["log_prior"],
                         device=kwargs["device"], dtype=kwargs["dtype"])
        if radius is not None:
            selection.update(self._strategy.radius_kwargs(Z, radius, kwargs["log_prior"]))
        return selection

    def _n_keys_available(self, exclude_self):
        """Training points that can be a neighbour (positive weight), less the query itself."""
        n = int(np.count_nonzero(np.isfinite(self._keys.log_prior)))
        return n - 1 if exclude_self else n


def _widen(a, width, fill=math.inf):
    out = np.full((a.shape[0], width), fill, dtype=a.dtype)
    out[:, : a.shape[1]] = a
    return out


def _object_array(rows):
    out = np.empty(len(rows), dtype=object)
    for i, row in enumerate(rows):
        out[i] = row
    return out
