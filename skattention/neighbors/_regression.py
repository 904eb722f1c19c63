"""MetricAttentionRegressor: attention from queries to the training set, propagating targets."""

import numpy as np
from sklearn.base import RegressorMixin
from sklearn.utils import check_random_state

from .._engine import LEARNED_METRICS
from ..utils._dask import is_dask_collection, lazy_predict
from ..utils._param_validation import StrOptions
from ..utils._sklearn_compat import _check_sample_weight, _fit_context
from ..utils._threads import uses_n_jobs
from ..utils._warnings import warn_user
from . import _docs
from ._base import _BaseMetricAttention
from ._queries import NeighborsQueryMixin
from ._trend import fit_trend

# Fewer positively weighted rows than this fit no trend.
_MIN_TREND_ROWS = 3
# Ridge penalties searched by generalised cross-validation for a linear trend, and the widest
# design it is fitted on (the search's eigendecomposition is cubic in the width).
_TREND_ALPHAS = np.logspace(-3, 3, 13)
TREND_MAX_WIDTH = 1024
# the trend is fitted on at most this many rows, drawn at random (its penalty search holds and
# factors the design of every row it is given; a linear model of at most TREND_MAX_WIDTH
# columns is as well determined by these)
_TREND_MAX_ROWS = 65536


class MetricAttentionRegressor(RegressorMixin, NeighborsQueryMixin, _BaseMetricAttention):
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
    trend : {"auto", "linear"} or None, default="auto"
        ``"linear"``: a ridge regression on the encoded features (the numeric block and one-hot
        categorical levels; penalty by leave-one-out cross-validation) is fitted first, the
        attention propagates its residuals and the prediction adds it back: attention corrects
        a global linear trend locally, where averaging neighbours alone flattens trends at the
        edges of the data. ``"auto"``: ``"linear"`` for the learned metrics (with at most
        1,024 numeric features after encoding), ``None`` for ``metric="euclidean"`` (whose
        special cases equal scikit-learn's estimators) and ``"precomputed"``. The trend's
        one-hot columns stop at 1,024 columns in all: the categorical columns with the most
        levels are left to the attention first. It is fitted on at most 65,536 training rows
        (drawn with ``random_state``), its residuals computed for all. On a Dask collection the
        trend is fitted on
        the sample the map is trained on, and the residuals are computed on the workers.
    {LEARNING}
    {DEVICE}
    {CATEGORICAL}

    Attributes
    ----------
    {FIT_ATTRIBUTES}
    {PROTOTYPE_ATTRIBUTES}
    trend_ : sklearn.linear_model.RidgeCV or None
        The fitted linear trend (``trend``), or None: fitted at the penalty (``alpha_``) whose
        leave-one-out error is least among ``numpy.logspace(-3, 3, 13)``, as ``RidgeCV`` with
        those ``alphas`` chooses it (its ``alphas`` are that penalty alone).

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

    _parameter_constraints: dict = {
        **_BaseMetricAttention._parameter_constraints,
        "trend": [StrOptions({"auto", "linear"}), None],
    }

    def __init__(self, metric="tabular", *, temperature="auto", n_neighbors=None, radius=None,
                 weights="uniform", p=2, prototypes="auto",
                 trend="auto", n_components=None, numeric_embedding="auto", hidden_size=256,
                 n_blocks=1, activation="relu", dropout=0.0, max_iter=100, batch_size="auto",
                 learning_rate=1e-2, weight_decay=2e-4, sample_rate="auto", early_stopping=True,
                 validation_fraction=0.15, n_iter_no_change=3, tol=1e-4, warm_start=False,
                 random_state=None, verbose=0, device="auto", dtype=None, n_jobs=None,
                 categorical_features="from_dtype"):
        super().__init__(
            metric, temperature=temperature, n_neighbors=n_neighbors, radius=radius,
            weights=weights, p=p, prototypes=prototypes,
            n_components=n_components, numeric_embedding=numeric_embedding,
            hidden_size=hidden_size, n_blocks=n_blocks,
            activation=activation, dropout=dropout, max_iter=max_iter, batch_size=batch_size,
            learning_rate=learning_rate, weight_decay=weight_decay, sample_rate=sample_rate,
            early_stopping=early_stopping, validation_fraction=validation_fraction,
            n_iter_no_change=n_iter_no_change, tol=tol, warm_start=warm_start,
            random_state=random_state, verbose=verbose, device=device, dtype=dtype,
            n_jobs=n_jobs, categorical_features=categorical_features,
        )
        self.trend = trend

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
        if is_dask_collection(X):  # keys sharded over the cluster (docs/scaling.md)
            self._fit_sharded(X, y, sample_weight)
            return self
        X, y = self._validate_train(X, y, sample_weight, multi_output=True, y_numeric=True)
        self._y_1d = y.ndim == 1
        values = np.asarray(y, dtype=np.float64).reshape(X.shape[0], -1)
        sample_weight = _check_sample_weight(
            sample_weight, X, dtype=np.float64, ensure_non_negative=True
        )
        self.trend_ = None
        # (a handful of weighted rows cannot tell a trend; _fit_attention rejects all-zero ones)
        design = None
        if self._uses_trend() and np.count_nonzero(sample_weight) >= _MIN_TREND_ROWS:
            design = self._trend_design(X)
        # (a design without columns, a single categorical column of more levels than the trend
        # takes: no trend, the attention alone)
        if design is not None and design.shape[1]:
            rows = slice(None)
            if X.shape[0] > _TREND_MAX_ROWS:
                rng = check_random_state(self.random_state)
                rows = np.sort(rng.choice(X.shape[0], _TREND_MAX_ROWS, replace=False))
            self.trend_ = fit_trend(design[rows], values[rows], sample_weight[rows],
                                    _TREND_ALPHAS)
            values = values - self.trend_.predict(design).reshape(values.shape)
        scale = values.std(0)
        train_values = (values - values.mean(0)) / np.where(scale > 0, scale, 1.0)
        self._fit_attention(
            X, values, sample_weight, loss="squared_error", train_values=train_values
        )
        return self

    def _uses_trend(self):
        """``trend="auto"``: a linear trend for the learned metrics, none for the fixed ones
        (whose special cases equal scikit-learn's neighbours regressors)."""
        if self.trend == "auto":
            # not on inputs too wide for the trend's penalty search (cubic in the width)
            return (self.metric in LEARNED_METRICS
                    and self._strategy.input.layout.n_numeric <= TREND_MAX_WIDTH)
        if self.trend == "linear" and self.metric == "precomputed":
            raise ValueError(
                "trend='linear' needs the features of the points; with metric='precomputed' X "
                "holds distances. Use trend=None."
            )
        return self.trend == "linear"

    def _trend_design(self, X):
        """The linear trend's features of encoded rows ``X``: the encoder's numeric block
        (scaled numbers and missing indicators) and one-hot categorical levels, the columns
        with the most levels left out beyond ``TREND_MAX_WIDTH`` columns in all."""
        return self._strategy.input.linear_features(X, TREND_MAX_WIDTH)

    def _value_offset(self, block):
        """What the attention's output is added to for encoded rows ``block``: the trend."""
        if getattr(self, "trend_", None) is None:
            return None
        if block.shape[0] == 0:  # no query row (RidgeCV's predict refuses them)
            return np.zeros((0, np.size(self.trend_.intercept_)))
        return self.trend_.predict(self._trend_design(block)).reshape(block.shape[0], -1)

    def _loo_loss(self, pred, rows, weight, values):
        """Weighted squared error of leave-one-out predictions (for temperature="auto")."""
        err = ((pred - values[rows]) ** 2).sum(1)
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
        if is_dask_collection(X):
            return lazy_predict(self, "predict", X)
        out, no_neighbour = self._propagate(X)
        if no_neighbour is not None and no_neighbour.any():
            # scikit-learn's RadiusNeighborsRegressor (warnings.simplefilter("error") to raise)
            warn_user(
                "One or more samples have no neighbors within specified radius; predicting NaN.")
            out[no_neighbour] = np.nan
        return out[:, 0] if self._y_1d else out

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags


MetricAttentionRegressor.__doc__ = _docs.fill(MetricAttentionRegressor.__doc__)
