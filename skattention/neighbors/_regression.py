"""MetricAttentionRegressor: attention from queries to the training set, propagating targets."""

import warnings

import numpy as np
from sklearn.base import RegressorMixin

from ..utils._sklearn_compat import _fit_context
from ..utils._threads import uses_n_jobs
from . import _docs
from ._base import _BaseMetricAttention
from ._convergence import ConvergenceCheckMixin
from ._precomputed import PrecomputedMixin
from ._queries import NeighborsQueryMixin


class MetricAttentionRegressor(
    RegressorMixin, PrecomputedMixin, NeighborsQueryMixin, ConvergenceCheckMixin,
    _BaseMetricAttention,
):
    """Regressor by attention over the training set under a learned (or fixed) pseudo-metric.

    The prediction for a query ``x`` is the attention-weighted average of the training targets,
    ``y(x) = sum_j a_j(x) y_j`` with ``a_j(x) proportional to w_j exp(-f(x, x_j) / T)`` over the
    admitted training points. A learned metric is trained end to end by minimising the weighted
    squared error of the leave-one-out predictions (on standardised targets). With
    ``metric="euclidean"``, exact special cases are:

    * ``n_neighbors=k, temperature=np.inf``: :class:`~sklearn.neighbors.KNeighborsRegressor`;
    * ``radius=r, temperature=np.inf``: :class:`~sklearn.neighbors.RadiusNeighborsRegressor`;
    * ``temperature=2 * h**2``: Nadaraya-Watson kernel regression with a Gaussian kernel of
      bandwidth ``h``;
    * ``temperature=0``: 1-nearest-neighbour regression.

    Parameters
    ----------
    {METRIC}
    {TEMPERATURE}
    {NEIGHBORS}
    {LEARNING}
    {DEVICE}
    {CATEGORICAL}

    Attributes
    ----------
    {FIT_ATTRIBUTES}

    See Also
    --------
    MetricAttentionClassifier : The same attention, propagating class labels.
    sklearn.neighbors.KNeighborsRegressor : The ``n_neighbors=k, temperature=inf`` special case.

    Examples
    --------
    >>> import numpy as np
    >>> from skattention import MetricAttentionRegressor
    >>> X = np.array([[0.0], [1.0], [2.0], [3.0]])
    >>> y = np.array([0.0, 1.0, 4.0, 9.0])
    >>> knn = MetricAttentionRegressor("euclidean", n_neighbors=2, temperature=np.inf).fit(X, y)
    >>> knn.predict([[1.4]])
    array([2.5])
    >>> h = 0.5  # Nadaraya-Watson with a Gaussian kernel of bandwidth h
    >>> nw = MetricAttentionRegressor("euclidean", temperature=2 * h**2).fit(X, y)
    >>> w = np.exp(-(1.4 - X[:, 0]) ** 2 / (2 * h**2))
    >>> bool(np.isclose(nw.predict([[1.4]])[0], w @ y / w.sum()))
    True
    """

    @_fit_context(prefer_skip_nested_validation=True)
    @uses_n_jobs
    def fit(self, X, y, sample_weight=None):
        """Fit the metric (if learned) and store the training set as keys and values.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training data.
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            Target values.
        sample_weight : array-like of shape (n_samples,), default=None
            Weight of each training point: an additive log-prior on it as a key and the weight
            of its training loss.

        Returns
        -------
        self : MetricAttentionRegressor
            The fitted regressor.
        """
        X, y = self._validate_train(X, y, multi_output=True, y_numeric=True)
        self._y_1d = y.ndim == 1
        values = np.asarray(y, dtype=np.float64).reshape(X.shape[0], -1)
        scale = values.std(0)
        train_values = (values - values.mean(0)) / np.where(scale > 0, scale, 1.0)
        self._fit_attention(
            X, values, sample_weight, loss="squared_error", train_values=train_values
        )
        return self

    def _loo_loss(self, pred, rows, weight):
        """Weighted squared error of leave-one-out predictions (for temperature="auto")."""
        err = ((pred - self._fit_values[rows]) ** 2).sum(1)
        return np.average(err, weights=weight)

    @uses_n_jobs
    def predict(self, X):
        """Attention-weighted average of the training targets.

        Parameters
        ----------
        X : array-like of shape (n_queries, n_features)
            Query points.

        Returns
        -------
        y : ndarray of shape (n_queries,) or (n_queries, n_outputs)
            Predicted targets.
        """
        out, no_neighbour = self._propagate(X)
        if no_neighbour is not None and no_neighbour.any():
            # scikit-learn's RadiusNeighborsRegressor (warnings.simplefilter("error") to raise)
            warnings.warn(
                "One or more samples have no neighbors within specified radius; predicting NaN.",
                UserWarning,
                stacklevel=2,
            )
            out[no_neighbour] = np.nan
        return out[:, 0] if self._y_1d else out

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags


MetricAttentionRegressor.__doc__ = _docs.fill(MetricAttentionRegressor.__doc__)
