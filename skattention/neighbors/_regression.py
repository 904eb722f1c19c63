"""MetricAttentionRegressor: attention from queries to the training set, propagating targets."""

import numpy as np
from sklearn.base import RegressorMixin, _fit_context
from sklearn.utils.validation import validate_data

from ._base import _BaseMetricAttention


class MetricAttentionRegressor(RegressorMixin, _BaseMetricAttention):
    """Regressor by attention over the training set under a pseudo-metric.

    The prediction for a query ``x`` is the attention-weighted average of the training targets,
    ``y(x) = sum_j a_j(x) y_j`` with ``a_j(x) proportional to w_j exp(-f(x, x_j) / T)`` over the
    admitted training points. Exact special cases:

    * ``n_neighbors=k, temperature=np.inf``: :class:`~sklearn.neighbors.KNeighborsRegressor`;
    * ``radius=r, temperature=np.inf``: :class:`~sklearn.neighbors.RadiusNeighborsRegressor`;
    * ``n_neighbors=None, temperature=2 * h**2``: Nadaraya-Watson kernel regression with a
      Gaussian kernel of bandwidth ``h``;
    * ``temperature=0``: 1-nearest-neighbour regression.

    Parameters
    ----------
    metric : {"euclidean"}, default="euclidean"
        Pseudo-metric ``f``. ``"euclidean"``: the squared Euclidean distance ``||x - y||^2``.
    temperature : float >= 0 or "auto", default="auto"
        Softmax temperature ``T`` in units of ``f``. ``"auto"`` picks, among 8 values from
        1/8 to 16 times the median squared distance between a training point and its nearest
        distinct neighbour, the one with the lowest leave-one-out squared error (on at most
        2000 training points); the result is stored in ``temperature_``.
    n_neighbors : int, default=None
        k-NN prior: each query attends only to its ``n_neighbors`` nearest training points.
    radius : float, default=None
        Radius prior: each query attends only to training points within ``radius``.
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"
        Where the attention runs.
    dtype : {"float32", "float64"}, default=None
        Compute precision. ``None``: float32 when the training data is float32, else float64.

    Attributes
    ----------
    temperature_ : float
        The temperature used.
    n_samples_fit_ : int
        Number of training samples.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Names of features seen during fit, when ``X`` has string column names.

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
    >>> reg = MetricAttentionRegressor(n_neighbors=2, temperature=np.inf).fit(X, y)
    >>> reg.predict([[1.4]])
    array([2.5])
    >>> h = 0.5  # Nadaraya-Watson with a Gaussian kernel of bandwidth h
    >>> nw = MetricAttentionRegressor(temperature=2 * h**2).fit(X, y)
    >>> w = np.exp(-(1.4 - X[:, 0]) ** 2 / (2 * h**2))
    >>> bool(np.isclose(nw.predict([[1.4]])[0], w @ y / w.sum()))
    True
    """

    def __init__(
        self,
        metric="euclidean",
        *,
        temperature="auto",
        n_neighbors=None,
        radius=None,
        device="auto",
        dtype=None,
    ):
        self.metric = metric
        self.temperature = temperature
        self.n_neighbors = n_neighbors
        self.radius = radius
        self.device = device
        self.dtype = dtype

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Store the training set as the keys and values of the attention.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training data.
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            Target values.
        sample_weight : array-like of shape (n_samples,), default=None
            Prior weight of each training point (an additive log-bias of the attention).

        Returns
        -------
        self : MetricAttentionRegressor
            The fitted regressor.
        """
        X, y = validate_data(
            self, X, y, dtype=[np.float64, np.float32], multi_output=True, y_numeric=True
        )
        self._y_1d = y.ndim == 1
        self._fit_keys(X, np.asarray(y, dtype=np.float64).reshape(X.shape[0], -1), sample_weight)
        return self

    def _loo_loss(self, pred, rows, weight):
        """Weighted squared error of leave-one-out predictions (for temperature="auto")."""
        err = ((pred - self._fit_values[rows]) ** 2).sum(1)
        return np.average(err, weights=weight)

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
        out = self._propagate(X)
        return out[:, 0] if self._y_1d else out

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags
