"""``kneighbors`` and ``radius_neighbors`` of the metric-attention estimators, with
scikit-learn's signatures and semantics, on the engine's exact selection."""

from functools import partial
from numbers import Integral, Real

import numpy as np
import torch
from scipy import sparse
from sklearn.utils.validation import check_is_fitted

from .._engine import budget_bytes, plan_rows, resolve_device
from ..utils._sklearn_compat import _num_samples
from ..utils._threads import uses_n_jobs

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
        # scikit-learn's errors, in its order
        if isinstance(n_neighbors, Real) and not isinstance(n_neighbors, bool) and (
                n_neighbors <= 0):
            raise ValueError(f"Expected n_neighbors > 0. Got {n_neighbors!r}.")
        if not isinstance(n_neighbors, Integral) or isinstance(n_neighbors, bool):
            raise TypeError(f"n_neighbors does not take {type(n_neighbors)} value, enter "
                            f"integer value (got {n_neighbors!r}).")
        n_neighbors = int(n_neighbors)
        available = self._n_keys_available(X is None)
        if n_neighbors > available:
            raise ValueError(
                f"Expected n_neighbors <= {available}, the training points that can be "
                f"neighbours{' (each but the query itself)' if X is None else ''}; got "
                f"n_neighbors={n_neighbors}."
            )
        device = resolve_device(self.device)

        def chunk(Z, own):
            f, idx = self._keys.select(Z, n_neighbors, own, self._selection_kwargs(device, Z))
            return (self._neighbour_distances(Z, f, idx) if return_distance else None), idx

        dist, ind = query_rows_in_chunks(
            self, X, device, [(n_neighbors, np.float64) if return_distance else None,
                              (n_neighbors, np.int64)], 32 * n_neighbors, chunk)
        return (dist, ind) if return_distance else ind

    def _neighbour_distances(self, Z, f, idx):
        """The distances of the selected keys ``idx`` (``-1``: padding) of the mapped queries
        ``Z``: the selection's values ``f`` where they are exact (float64), else computed in
        float64 from the coordinates (as scikit-learn's trees compute them for float32 data;
        not over keys sharded on a Dask cluster, whose points stay there)."""
        if (self._compute_dtype() == torch.float64 or self.metric == "dot"
                or self._keys.sharded):
            return self._strategy.distances(f)
        return self._strategy.exact_distances(Z, self._keys.points, np.maximum(idx, 0))

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
        # 0 (exact matches) and inf (every point) as scikit-learn's
        if not isinstance(radius, Real) or isinstance(radius, bool) or not radius >= 0:
            raise ValueError(f"radius must be a number >= 0, got {radius!r}.")
        if sort_results and not return_distance:
            raise ValueError("return_distance must be True if sort_results is True.")
        if self.metric == "dot":
            raise ValueError("radius_neighbors needs a distance metric; metric='dot' has none.")
        # Each chunk's neighbours become its rows' arrays at once (views of the chunk's found
        # entries), so the result is held once, not also as flat copies and a global sort.
        n_rows = _n_query_rows(self, X)
        ind = np.empty(n_rows, dtype=object)
        dist = np.empty(n_rows, dtype=object) if return_distance else None
        device, offset = resolve_device(self.device), 0
        for Z, exclude_self in self._embedded_blocks(X, device):
            for rows, f, idx in self._keys.within(Z, float(radius), exclude_self,
                                                  partial(self._selection_kwargs, device)):
                found = idx >= 0  # each row's keys come first (row-major order keeps them)
                counts = found.sum(1)
                rows_ind = idx[found]
                rows_dist = (self._neighbour_distances(Z[rows], f, idx)[found]
                             if return_distance else None)
                if not sort_results:  # index order, as scikit-learn's brute-force search gives
                    # one sort of (row, index) pairs (a row holds a key once)
                    order = np.argsort(np.repeat(np.arange(counts.size), counts)
                                       * self._keys.n_samples + rows_ind)
                    rows_ind = rows_ind[order]
                    rows_dist = rows_dist[order] if return_distance else None
                ends = np.cumsum(counts)
                ind[offset + rows] = _row_arrays(rows_ind, ends - counts, ends)
                if return_distance:
                    dist[offset + rows] = _row_arrays(rows_dist, ends - counts, ends)
            offset += Z.shape[0]
        return (dist, ind) if return_distance else ind

    def kneighbors_graph(self, X=None, n_neighbors=None, mode="connectivity"):
        """The graph of the nearest training points of each query, as
        :meth:`sklearn.neighbors.NearestNeighbors.kneighbors_graph`.

        Parameters
        ----------
        X : array-like of shape (n_queries, n_features), default=None
            Query points; ``None``: the training points, each not its own neighbour.
        n_neighbors : int, default=None
            Number of neighbours; by default the estimator's ``n_neighbors``, else 5.
        mode : {"connectivity", "distance"}, default="connectivity"
            ``"connectivity"``: ones; ``"distance"``: the distances (as :meth:`kneighbors`).

        Returns
        -------
        A : sparse matrix of shape (n_queries, n_samples_fit)
            ``A[i, j]`` for each neighbour ``j`` of query ``i`` (CSR).

        Examples
        --------
        >>> import numpy as np
        >>> from skattention import MetricAttentionClassifier
        >>> X = np.array([[0.0], [1.0], [3.0]])
        >>> clf = MetricAttentionClassifier("euclidean", n_neighbors=1, temperature=np.inf)
        >>> clf.fit(X, [0, 0, 1]).kneighbors_graph([[2.5]], mode="distance").toarray()
        array([[0. , 0. , 0.5]])
        """
        if mode not in ("connectivity", "distance"):
            raise ValueError('Unsupported mode, must be one of "connectivity", or "distance" '
                             f'but got "{mode}" instead')
        if n_neighbors is None:
            n_neighbors = self.n_neighbors or _DEFAULT_N_NEIGHBORS
        if mode == "connectivity":  # (no distances computed or held)
            ind = self.kneighbors(X, n_neighbors, return_distance=False)
            data = np.ones(ind.size)
        else:
            dist, ind = self.kneighbors(X, n_neighbors)
            data = np.ravel(dist)
        indptr = np.arange(0, ind.size + 1, ind.shape[1])
        return sparse.csr_matrix((data, ind.ravel(), indptr),
                                 shape=(ind.shape[0], self.n_samples_fit_))

    def radius_neighbors_graph(self, X=None, radius=None, mode="connectivity",
                               sort_results=False):
        """The graph of the training points within ``radius`` of each query, as
        :meth:`sklearn.neighbors.NearestNeighbors.radius_neighbors_graph`.

        Parameters
        ----------
        X : array-like of shape (n_queries, n_features), default=None
            Query points; ``None``: the training points, each not its own neighbour.
        radius : float, default=None
            Radius of the neighbourhoods; by default the estimator's ``radius``.
        mode : {"connectivity", "distance"}, default="connectivity"
            ``"connectivity"``: ones; ``"distance"``: the distances.
        sort_results : bool, default=False
            With ``mode="distance"``, each row's entries by increasing distance.

        Returns
        -------
        A : sparse matrix of shape (n_queries, n_samples_fit)
            ``A[i, j]`` for each training point ``j`` within ``radius`` of query ``i`` (CSR).

        Examples
        --------
        >>> import numpy as np
        >>> from skattention import MetricAttentionRegressor
        >>> X = np.array([[0.0], [1.0], [3.0]])
        >>> reg = MetricAttentionRegressor("euclidean", radius=1.5, temperature=np.inf)
        >>> reg.fit(X, [0.0, 1.0, 2.0]).radius_neighbors_graph([[2.5]]).toarray()
        array([[0., 1., 1.]])
        """
        if mode not in ("connectivity", "distance"):
            raise ValueError('Unsupported mode, must be one of "connectivity", or "distance" '
                             f'but got "{mode}" instead')
        if mode == "connectivity":  # (no distances computed or held)
            ind = self.radius_neighbors(X, radius, return_distance=False)
        else:
            dist, ind = self.radius_neighbors(X, radius, sort_results=sort_results)
        counts = np.array([len(i) for i in ind], dtype=np.int64)
        columns = np.concatenate(list(ind)) if len(ind) else np.zeros(0, np.int64)
        data = (np.ones(columns.size) if mode == "connectivity"
                else np.concatenate(list(dist)) if len(dist) else np.zeros(0))
        indptr = np.concatenate([[0], np.cumsum(counts)])
        return sparse.csr_matrix((data, columns, indptr),
                                 shape=(len(ind), self.n_samples_fit_))

    # ------------------------------------------------------------------ helpers

    def _selection_kwargs(self, device, Z, radius=None):
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


def query_rows_in_chunks(estimator, X, device, columns, row_bytes, chunk):
    """Arrays of one row per query of ``X`` (``None``: the training points), one per
    ``(width, dtype)`` of ``columns`` (``None`` for a ``None`` entry), filled with the arrays
    that ``chunk(Z, exclude_self)`` returns in that order for row chunks of the queries
    mapped into the metric space (``exclude_self`` as ``estimator._embedded_blocks`` gives
    it), each chunk as many rows as the budget holds at ``row_bytes`` per row."""
    # The whole result is allocated first, as scikit-learn's is: a result too large for memory
    # fails at once (numpy's MemoryError) instead of after most of the search, and the engine
    # is called on row chunks within the budget, so that its outputs and their conversions are
    # scratch, not further copies of the result.
    n_rows = _n_query_rows(estimator, X)
    out = [None if c is None else np.empty((n_rows, c[0]), c[1]) for c in columns]
    rows, stop = plan_rows(None, row_bytes=row_bytes, budget=budget_bytes()), 0
    for Z, exclude_self in estimator._embedded_blocks(X, device):
        for start in range(0, Z.shape[0], rows):
            Zc, own = Z[start:start + rows], exclude_self
            if isinstance(own, np.ndarray):
                own = own[start:start + rows]
            stop, begin = stop + Zc.shape[0], stop
            for array, part in zip(out, chunk(Zc, own), strict=True):
                if array is not None:
                    array[begin:stop] = part
    return out


def _n_query_rows(estimator, X):
    """Rows of the queries ``X`` (``None``: the training points), before their checks."""
    if X is None:
        return estimator.n_samples_fit_
    try:
        return _num_samples(X)
    except TypeError:  # not array-like: the checks of the first block say so
        return 0


def _row_arrays(flat, starts, ends):
    """An object array of the rows ``flat[starts[i]:ends[i]]`` (views of ``flat``)."""
    out = np.empty(len(starts), dtype=object)
    for i, (start, end) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        out[i] = flat[start:end]
    return out
