"""MetricAttentionClassifier: attention from queries to the training set, propagating labels."""

import math
from numbers import Real

import numpy as np
from sklearn.base import ClassifierMixin

from .._engine import counts_every_key
from ..utils._dask import is_dask_collection
from ..utils._param_validation import StrOptions
from ..utils._sklearn_compat import _check_sample_weight, _fit_context
from ..utils._threads import uses_n_jobs
from ..utils._validation import ProbabilisticClassifierMixin, rows_summing_to_one
from ..utils._warnings import warn_user
from . import _docs
from ._base import _BaseMetricAttention
from ._queries import NeighborsQueryMixin


class MetricAttentionClassifier(
    ProbabilisticClassifierMixin, ClassifierMixin, NeighborsQueryMixin, _BaseMetricAttention,
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
    class_weight : dict, list of dict or "balanced", default=None
        Weight of each class, multiplied into the sample weights: a prior on the training
        points as keys and a weight of their training loss. ``"balanced"`` uses
        ``n_samples / (n_classes * np.bincount(y))``. With several outputs, a list of dicts
        (one per output) or ``"balanced"``, multiplied across outputs (as
        :func:`~sklearn.utils.class_weight.compute_sample_weight`).
    outlier_label : label, "most_frequent" or list of them, default=None
        With ``radius``, the label of a query that has no training point within the radius, as
        in :class:`~sklearn.neighbors.RadiusNeighborsClassifier`: its probabilities are one-hot
        on that class (all 0, with a warning, for a label that is not a training class), and
        ``"most_frequent"`` is the most frequent training class, each point counted by its
        sample weight, as repeated points (ties: the smallest label); a label must be of the
        classes' kind (text for text labels, a number for numeric ones: ``TypeError``
        otherwise). ``None``: such a query raises ``ValueError``. Without ``radius`` every
        query has neighbours and it is not used. A list gives one per output.
    {LEARNING}
    {DEVICE}
    {CATEGORICAL}

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,) or list of them
        Class labels; with several outputs (``y`` of shape (n_samples, n_outputs)), one array
        per output.
    outputs_2d_ : bool
        Whether ``y`` had several outputs: then ``predict`` returns shape
        (n_queries, n_outputs) and ``predict_proba`` a list of arrays, one per output.
    outlier_label_ : label, list of labels or None
        The label given to queries with no neighbour within ``radius`` (one per output).
    {FIT_ATTRIBUTES}
    {PROTOTYPE_ATTRIBUTES}

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
    >>> clf = MetricAttentionClassifier(random_state=0).fit(X, y)  # learned metric="tabular"
    >>> clf.score(X, y) > 0.95
    True
    """

    _parameter_constraints: dict = {
        **_BaseMetricAttention._parameter_constraints,
        "class_weight": [dict, list, StrOptions({"balanced"}), None],
        "outlier_label": [Real, str, list, None],
    }

    def __init__(self, metric="tabular", *, temperature="auto", n_neighbors=None, radius=None,
                 weights="uniform", p=2, prototypes="auto",
                 class_weight=None, outlier_label=None, n_components=None,
                 numeric_embedding="auto", hidden_size=256, n_blocks=1, activation="relu",
                 dropout=0.0, max_iter=100, batch_size="auto", learning_rate=1e-2,
                 weight_decay=2e-4, sample_rate="auto", early_stopping=True,
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
        self.class_weight = class_weight
        self.outlier_label = outlier_label

    @_fit_context(prefer_skip_nested_validation=True)
    @uses_n_jobs
    def fit(self, X, y, sample_weight=None):
        """Fit the metric (if learned) and store the training set as keys and values.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training data.
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            Class labels (numbers or strings), one column per output.
        sample_weight : array-like of shape (n_samples,), default=None
            Weight of each training point: an additive log-prior on it as a key and the weight
            of its training loss. With ``metric="euclidean"`` an integer weight acts exactly like
            repeating the point. Zero weight removes the point.

        Returns
        -------
        self : MetricAttentionClassifier
            The fitted classifier.
        """
        if is_dask_collection(X):  # keys sharded over the cluster (docs/scaling.md)
            plan = self._fit_sharded(X, y, sample_weight)
            if isinstance(self.outlier_label, str) and self.outlier_label == "most_frequent":
                self.outlier_label_ = plan.most_frequent_class()
            return self
        self._fit_labels(X, y, sample_weight, same_classes_on_warm_start=True, multi_output=True,
                         single_class=True)
        classes = self._classes_per_output()
        labels = self.outlier_label
        if not isinstance(labels, list):
            labels = [labels] * len(classes)
        elif len(labels) != len(classes):
            raise ValueError(
                f"outlier_label has {len(labels)} labels but y has {len(classes)} outputs."
            )
        # counted by sample weight, as the repeated rows would be (argmax: the smallest label
        # among tied classes, as RadiusNeighborsClassifier)
        weight = _check_sample_weight(sample_weight, self._fit_y, dtype=np.float64)
        labels = [
            c[np.bincount(y - y.min(), weights=weight).argmax()]
            if isinstance(label, str) and label == "most_frequent" else label
            for label, c, y in zip(labels, classes, self._fit_y.T, strict=True)
        ]
        for label, c in zip(labels, classes, strict=True):
            _check_outlier_label(label, c)
        self.outlier_label_ = labels if self.outputs_2d_ else labels[0]
        return self

    def _loo_loss(self, proba, rows, weight, values):
        """Weighted log-loss of leave-one-out class probabilities (for temperature="auto")."""
        p_true = proba[np.arange(rows.size)[:, None], self._fit_y[rows]]  # (rows, n_outputs)
        return -np.average(np.log(np.clip(p_true, 1e-12, None)).sum(1), weights=weight)

    def _predict_proba(self, X):
        proba, no_neighbour = self._propagate(X)
        if not self._counts_over_total():
            # votes to normalise (weights="distance"), or weighted sums whose rounding left
            # them a few ulp (float32: 1e-7) from 1
            proba = rows_summing_to_one(proba, [c.size for c in self._classes_per_output()])
        if no_neighbour is None or not no_neighbour.any():
            return proba
        # RadiusNeighborsClassifier's handling of queries with no neighbour
        outliers = np.flatnonzero(no_neighbour)
        labels = self.outlier_label_ if self.outputs_2d_ else [self.outlier_label_]
        if any(label is None for label in labels):
            raise ValueError(
                f"No neighbors found for test samples {outliers[:10].tolist()} within "
                f"radius={self.radius}; use a larger radius, give a label for outliers "
                "(outlier_label) or remove them."
            )
        start = 0
        for classes, label in zip(self._classes_per_output(), labels, strict=True):
            match = np.flatnonzero(classes == label)
            if match.size == 1:
                proba[outliers, start + match[0]] = 1.0
            else:
                warn_user(f"Outlier label {label} is not in training classes. All class "
                          "probabilities of outliers will be assigned with 0.")
            start += classes.size
        return proba

    def _counts_over_total(self):
        """Whether the probabilities are each class's count of votes over their total (the
        uniform vote of temperature 0 or inf, every key of one weight, zero weights aside; at
        inf also integer weights, which the engine counts exactly): scikit-learn's one
        division, which a second by their rounded sum would change."""
        log_prior = self._keys.log_prior
        if (self.weights != "uniform" or self.temperature_ not in (0.0, math.inf)
                or not isinstance(log_prior, np.ndarray)):  # (keys sharded on a cluster)
            return False
        weights = log_prior[np.isfinite(log_prior)]
        if weights.size == 0 or bool(np.all(weights == weights[0])):
            return True
        # (a precomputed radius reaches the engine as a callable prior: no counting)
        return (self.temperature_ == math.inf
                and not (self.metric == "precomputed" and self.radius is not None)
                and counts_every_key(weights, self._compute_dtype()))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags


def _check_outlier_label(label, classes):
    """Text for numeric classes, or a number for text classes, would turn every prediction
    into the label's kind (``2`` into ``"2"``, unequal to the true labels):
    RadiusNeighborsClassifier's TypeError instead. Object classes hold either."""
    if label is None or classes.dtype == object:
        return
    if isinstance(label, str) != (classes.dtype.kind in "US"):
        raise TypeError(
            f"The dtype of outlier_label {label!r} is inconsistent with classes {classes} in y."
        )


MetricAttentionClassifier.__doc__ = _docs.fill(MetricAttentionClassifier.__doc__)
