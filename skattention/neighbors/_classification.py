"""MetricAttentionClassifier: attention from queries to the training set, propagating labels."""

import numpy as np
from sklearn.base import ClassifierMixin, _fit_context
from sklearn.utils._param_validation import StrOptions
from sklearn.utils.class_weight import compute_class_weight
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import validate_data

from ._base import _BaseMetricAttention


class MetricAttentionClassifier(ClassifierMixin, _BaseMetricAttention):
    """Classifier by attention over the training set under a pseudo-metric.

    The class probabilities of a query ``x`` are the attention-weighted average of the one-hot
    training labels,
    ``p(c | x) = sum_j a_j(x) [y_j = c]`` with
    ``a_j(x) proportional to w_j exp(-f(x, x_j) / T)`` over the admitted training points, where
    ``f`` is the pseudo-metric, ``T`` the temperature and ``w_j`` the prior weight of ``x_j``
    (sample weight times class weight). Classical neighbour classifiers are exact special cases:

    * ``n_neighbors=k, temperature=np.inf``: :class:`~sklearn.neighbors.KNeighborsClassifier`;
    * ``temperature=0``: the 1-nearest-neighbour classifier;
    * ``radius=r, temperature=np.inf``: :class:`~sklearn.neighbors.RadiusNeighborsClassifier`;
    * ``n_neighbors=None`` and a finite temperature: a Gaussian-kernel (Nadaraya-Watson) classifier.

    Parameters
    ----------
    metric : {"euclidean"}, default="euclidean"
        Pseudo-metric ``f``. ``"euclidean"``: the squared Euclidean distance
        ``||x - y||^2`` (nothing learned).
    temperature : float >= 0 or "auto", default="auto"
        Softmax temperature ``T`` in units of ``f``. ``0`` is the arg-max (nearest neighbour)
        limit and ``np.inf`` the uniform limit. ``"auto"`` picks, among 8 values from 1/8 to 16
        times the median squared distance between a training point and its nearest distinct
        neighbour, the one with the lowest leave-one-out log-loss (on at most 2000 training
        points); the result is stored in ``temperature_``.
    n_neighbors : int, default=None
        k-NN prior: each query attends only to its ``n_neighbors`` nearest training points.
        ``None`` attends to all of them.
    radius : float, default=None
        Radius prior: each query attends only to training points within ``radius``.
    class_weight : dict or "balanced", default=None
        Prior weight of each class, multiplied into the sample weights. ``"balanced"`` uses
        ``n_samples / (n_classes * np.bincount(y))``, which rebalances the propagated labels.
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"
        Where the attention runs. ``"auto"``: CUDA when available, else the CPU. The fitted
        model holds NumPy arrays only, so it pickles and loads anywhere.
    dtype : {"float32", "float64"}, default=None
        Compute precision. ``None``: float32 when the training data is float32, else float64.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        Class labels.
    temperature_ : float
        The temperature used (resolved when ``temperature="auto"``).
    n_samples_fit_ : int
        Number of training samples.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Names of features seen during fit, when ``X`` has string column names.

    See Also
    --------
    MetricAttentionRegressor : The same attention, propagating continuous targets.
    sklearn.neighbors.KNeighborsClassifier : The ``n_neighbors=k, temperature=inf`` special case.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.datasets import load_iris
    >>> from sklearn.neighbors import KNeighborsClassifier
    >>> from skattention import MetricAttentionClassifier
    >>> X, y = load_iris(return_X_y=True)
    >>> knn = KNeighborsClassifier(n_neighbors=5).fit(X, y)
    >>> att = MetricAttentionClassifier(n_neighbors=5, temperature=np.inf).fit(X, y)
    >>> bool(np.all(att.predict(X) == knn.predict(X)))
    True
    >>> clf = MetricAttentionClassifier().fit(X, y)  # temperature chosen by leave-one-out
    >>> round(clf.score(X, y), 2)
    0.99
    """

    _parameter_constraints: dict = {
        **_BaseMetricAttention._parameter_constraints,
        "class_weight": [dict, StrOptions({"balanced"}), None],
    }

    def __init__(
        self,
        metric="euclidean",
        *,
        temperature="auto",
        n_neighbors=None,
        radius=None,
        class_weight=None,
        device="auto",
        dtype=None,
    ):
        self.metric = metric
        self.temperature = temperature
        self.n_neighbors = n_neighbors
        self.radius = radius
        self.class_weight = class_weight
        self.device = device
        self.dtype = dtype

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Store the training set as the keys and values of the attention.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training data.
        y : array-like of shape (n_samples,)
            Class labels (numbers or strings).
        sample_weight : array-like of shape (n_samples,), default=None
            Prior weight of each training point (its log is an additive attention bias); an
            integer weight acts like repeating the point. Zero weight removes the point.

        Returns
        -------
        self : MetricAttentionClassifier
            The fitted classifier.
        """
        X, y = validate_data(self, X, y, dtype=[np.float64, np.float32])
        check_classification_targets(y)
        self.classes_, y_encoded = np.unique(y, return_inverse=True)
        if self.classes_.size < 2:
            raise ValueError(
                f"{type(self).__name__} needs samples of at least 2 classes in the data, but the "
                f"data contains only one class: {self.classes_[0]!r}."
            )
        key_weight = None
        if self.class_weight is not None:
            per_class = compute_class_weight(self.class_weight, classes=self.classes_, y=y)
            key_weight = per_class[y_encoded]
        self._fit_y = y_encoded
        self._fit_keys(X, np.eye(self.classes_.size, dtype=X.dtype)[y_encoded], sample_weight, key_weight)
        return self

    def _loo_loss(self, proba, rows, weight):
        """Weighted log-loss of leave-one-out class probabilities (for temperature="auto")."""
        p_true = proba[np.arange(rows.size), self._fit_y[rows]]
        return -np.average(np.log(np.clip(p_true, 1e-12, None)), weights=weight)

    def predict_proba(self, X):
        """Attention-weighted class frequencies of each query.

        Parameters
        ----------
        X : array-like of shape (n_queries, n_features)
            Query points.

        Returns
        -------
        proba : ndarray of shape (n_queries, n_classes)
            Class probabilities, columns ordered as ``classes_``.
        """
        proba = self._propagate(X)
        # Rounding can leave sums a few ulp from 1; renormalise like scikit-learn's neighbours.
        return proba / proba.sum(axis=1, keepdims=True)

    def predict(self, X):
        """Most probable class of each query.

        Parameters
        ----------
        X : array-like of shape (n_queries, n_features)
            Query points.

        Returns
        -------
        y : ndarray of shape (n_queries,)
            Predicted class labels.
        """
        proba = self.predict_proba(X)
        return self.classes_[np.argmax(proba, axis=1)]
