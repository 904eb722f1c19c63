"""MetricAttentionClassifier: attention from queries to the training set, propagating labels."""

import warnings
from numbers import Real

import numpy as np
from sklearn.base import ClassifierMixin

from ..utils._param_validation import StrOptions
from ..utils._sklearn_compat import _fit_context
from ..utils._validation import ProbabilisticClassifierMixin
from . import _docs
from ._base import _BaseMetricAttention


class MetricAttentionClassifier(
    ProbabilisticClassifierMixin, ClassifierMixin, _BaseMetricAttention
):
    """Classifier by attention over the training set under a learned (or fixed) pseudo-metric.

    The class probabilities of a query ``x`` are the attention-weighted average of the one-hot
    training labels, ``p(c | x) = sum_j a_j(x) [y_j = c]`` with
    ``a_j(x) proportional to w_j exp(-f(x, x_j) / T)`` over the admitted training points, where
    ``f`` is the pseudo-metric, ``T`` the temperature and ``w_j`` the prior weight of ``x_j``
    (sample weight times class weight). With a learned metric, ``f`` (and ``T``) are trained
    end to end by maximising the leave-one-out likelihood of the training labels, as in NCA and
    ModernNCA. With ``metric="euclidean"``, classical neighbour classifiers are exact special cases:

    * ``n_neighbors=k, temperature=np.inf``: :class:`~sklearn.neighbors.KNeighborsClassifier`;
    * ``temperature=0``: the 1-nearest-neighbour classifier;
    * ``radius=r, temperature=np.inf``: :class:`~sklearn.neighbors.RadiusNeighborsClassifier`;
    * a finite temperature without ``n_neighbors``: a Gaussian-kernel (Nadaraya-Watson) classifier.

    Parameters
    ----------
    {METRIC}
    {TEMPERATURE}
    {NEIGHBORS}
    class_weight : dict or "balanced", default=None
        Weight of each class, multiplied into the sample weights: a prior on the training
        points as keys and a weight of their training loss. ``"balanced"`` uses
        ``n_samples / (n_classes * np.bincount(y))``.
    outlier_label : label or "most_frequent", default=None
        With ``radius``, the label of a query that has no training point within the radius, as
        in :class:`~sklearn.neighbors.RadiusNeighborsClassifier`: its probabilities are one-hot
        on that class (all 0, with a warning, for a label that is not a training class), and
        ``"most_frequent"`` is the most frequent training class. ``None``: such a query raises
        ``ValueError``. Without ``radius`` every query has neighbours and it is not used.
    {LEARNING}
    {DEVICE}
    {CATEGORICAL}

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        Class labels.
    outlier_label_ : label or None
        The label given to queries with no neighbour within ``radius``.
    {FIT_ATTRIBUTES}

    See Also
    --------
    MetricAttentionRegressor : The same attention, propagating continuous targets.
    MetricAttentionTransformer : The learned map alone, as a transformer.
    sklearn.neighbors.KNeighborsClassifier : The ``n_neighbors=k, temperature=inf`` special case.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.datasets import load_iris
    >>> from sklearn.neighbors import KNeighborsClassifier
    >>> from skattention import MetricAttentionClassifier
    >>> X, y = load_iris(return_X_y=True)
    >>> knn = KNeighborsClassifier(n_neighbors=5).fit(X, y)
    >>> att = MetricAttentionClassifier("euclidean", n_neighbors=5, temperature=np.inf).fit(X, y)
    >>> bool(np.all(att.predict(X) == knn.predict(X)))
    True
    >>> clf = MetricAttentionClassifier(random_state=0).fit(X, y)  # learned residual-MLP metric
    >>> clf.score(X, y) > 0.95
    True
    """

    _parameter_constraints: dict = {
        **_BaseMetricAttention._parameter_constraints,
        "class_weight": [dict, StrOptions({"balanced"}), None],
        "outlier_label": [Real, str, None],
    }

    def __init__(self, metric="tabular", *, temperature="auto", n_neighbors=None, radius=None,
                 class_weight=None, outlier_label=None, n_components=None,
                 numeric_embedding="auto", hidden_size=256, n_blocks=1, activation="relu",
                 dropout=0.0, max_iter=100, batch_size="auto", learning_rate=1e-2,
                 weight_decay=2e-4, sample_rate="auto", early_stopping=True,
                 validation_fraction=0.15, n_iter_no_change=8, tol=1e-4, warm_start=False,
                 random_state=None, verbose=0, device="auto", dtype=None,
                 categorical_features="from_dtype"):
        super().__init__(
            metric, temperature=temperature, n_neighbors=n_neighbors, radius=radius,
            n_components=n_components, numeric_embedding=numeric_embedding,
            hidden_size=hidden_size, n_blocks=n_blocks,
            activation=activation, dropout=dropout, max_iter=max_iter, batch_size=batch_size,
            learning_rate=learning_rate, weight_decay=weight_decay, sample_rate=sample_rate,
            early_stopping=early_stopping, validation_fraction=validation_fraction,
            n_iter_no_change=n_iter_no_change, tol=tol, warm_start=warm_start,
            random_state=random_state, verbose=verbose, device=device, dtype=dtype,
            categorical_features=categorical_features,
        )
        self.class_weight = class_weight
        self.outlier_label = outlier_label

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Fit the metric (if learned) and store the training set as keys and values.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training data.
        y : array-like of shape (n_samples,)
            Class labels (numbers or strings).
        sample_weight : array-like of shape (n_samples,), default=None
            Weight of each training point: an additive log-prior on it as a key and the weight
            of its training loss. With ``metric="euclidean"`` an integer weight acts exactly like
            repeating the point. Zero weight removes the point.

        Returns
        -------
        self : MetricAttentionClassifier
            The fitted classifier.
        """
        self._fit_labels(X, y, sample_weight, same_classes_on_warm_start=True)
        if isinstance(self.outlier_label, str) and self.outlier_label == "most_frequent":
            self.outlier_label_ = self.classes_[np.bincount(self._fit_y).argmax()]
        else:
            self.outlier_label_ = self.outlier_label
        return self

    def _loo_loss(self, proba, rows, weight):
        """Weighted log-loss of leave-one-out class probabilities (for temperature="auto")."""
        p_true = proba[np.arange(rows.size), self._fit_y[rows]]
        return -np.average(np.log(np.clip(p_true, 1e-12, None)), weights=weight)

    def _predict_proba(self, X):
        proba, no_neighbour = self._propagate(X)
        if no_neighbour is None or not no_neighbour.any():
            return proba
        # RadiusNeighborsClassifier's handling of queries with no neighbour
        outliers = np.flatnonzero(no_neighbour)
        if self.outlier_label_ is None:
            raise ValueError(
                f"No neighbors found for test samples {outliers[:10].tolist()} within "
                f"radius={self.radius}; use a larger radius, give a label for outliers "
                "(outlier_label) or remove them."
            )
        label = np.flatnonzero(self.classes_ == self.outlier_label_)
        if label.size == 1:
            proba[outliers, label[0]] = 1.0
        else:
            warnings.warn(
                f"Outlier label {self.outlier_label_} is not in training classes. All class "
                "probabilities of outliers will be assigned with 0.",
                UserWarning,
                stacklevel=3,
            )
        return proba


MetricAttentionClassifier.__doc__ = _docs.fill(MetricAttentionClassifier.__doc__)
