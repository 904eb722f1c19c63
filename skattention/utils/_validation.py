"""Input preparation shared by the estimators (scikit-learn side)."""

import contextlib

import numpy as np
from sklearn.exceptions import DataConversionWarning
from sklearn.utils.multiclass import check_classification_targets

from .._engine import ComputeOverflowError, overflow_message
from ._dask import is_dask_collection, lazy_predict
from ._threads import uses_n_jobs
from ._warnings import warn_user

# Below this largest value the squares of a column's (non-zero) deviations, at least its spacing
# (about 2**-52 of it) squared, can be subnormal (below 2**-1022) or 0.
_TINY_PEAK = 2.0**-400


def standardisation(X):
    """Per-feature mean and scale that standardise ``X`` (scale 1 for constant features).

    The statistics are computed in float64: the float32 variance of data at a tiny scale
    (~1e-20 and below) underflows to 0 and would leave the data unscaled. They are returned in
    ``X``'s dtype unless the scale overflows it. A constant feature is centred on its value
    exactly: the mean of n copies of a number is not always the number (of 1e300, 1e300 + 2e285:
    a constant feature standardised to 2e285, beyond float32).
    """
    # the sum of values near float64's largest overflows the mean, and the variance of values
    # beyond ~1e154 the spread (every row would be standardised to 0)
    top, bottom = X.max(0), X.min(0)
    peak = np.maximum(top, -bottom).astype(np.float64)  # (no |X| copy)
    constant = top == bottom
    mean = np.where(constant, X[0], _in_units_of_the_largest(X, np.mean, peak)).astype(X.dtype)
    scale = _in_units_of_the_largest(X, np.std, peak)
    scale = scale.astype(X.dtype) if np.all(scale < np.finfo(X.dtype).max) else scale
    return mean, np.where((scale > 0) & ~constant, scale, 1.0)


def _in_units_of_the_largest(X, statistic, peak):
    """``statistic`` (``np.mean`` or ``np.std``) of each column of ``X`` in float64, computed
    again in units of the column's largest absolute value ``peak`` where it overflows (not of
    its deviations, which can overflow too: values of both signs near the largest), and where
    the values are below ``_TINY_PEAK``: the squares of their deviations underflow (a spread of
    0, and the column was left unscaled)."""
    with np.errstate(over="ignore"):
        out = statistic(X, 0, dtype=np.float64)
    redo = ~np.isfinite(out) | ((peak > 0) & (peak < _TINY_PEAK))
    if np.any(redo):
        values = X[:, redo].astype(np.float64)
        unit = np.where(peak[redo] > 0, peak[redo], 1.0)
        out[redo] = unit * statistic(values / unit, 0)
    return out


def encode_classes(estimator, y, single_class=False):
    """``(classes, y_encoded)`` of classification targets; a clear error for a single class
    unless ``single_class`` (an estimator that, like KNeighborsClassifier, then predicts it)."""
    check_classification_targets(y)
    classes, y_encoded = np.unique(y, return_inverse=True)
    if classes.size < 2 and not single_class:
        raise ValueError(
            f"{type(estimator).__name__} needs samples of at least 2 classes in the data, but the "
            f"data contains only one class: {classes[0]!r}."
        )
    return classes, y_encoded


def label_columns(y):
    """Classification targets as 1-d labels or a 2-d array of outputs; a single column is
    one output, with scikit-learn's warning (as in KNeighborsClassifier)."""
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        warn_user(
            "A column-vector y was passed when a 1d array was expected. Please change the shape "
            "of y to (n_samples,), for example using ravel().",
            DataConversionWarning,
        )
        return y[:, 0]
    return y


class ProbabilisticClassifierMixin:
    """``predict_proba`` and ``predict`` of a classifier from its ``_predict_proba(X)``."""

    @uses_n_jobs
    def predict_proba(self, X):
        """Class probabilities of each query.

        Parameters
        ----------
        X : array-like of shape (n_queries, n_features)
            Query points.

        Returns
        -------
        proba : ndarray of shape (n_queries, n_classes), or a list of them
            Class probabilities, columns ordered as ``classes_``; with several outputs, one
            array per output (as ``classes_``).
        """
        if is_dask_collection(X):
            return lazy_predict(self, "predict_proba", X)
        proba = self._predict_proba(X)
        if not getattr(self, "outputs_2d_", False):
            return proba
        sizes = [c.size for c in self._classes_per_output()]
        return [np.ascontiguousarray(p) for p in output_blocks(proba, sizes)]

    def predict_log_proba(self, X):
        """Logarithm of the class probabilities of each query.

        Parameters
        ----------
        X : array-like of shape (n_queries, n_features)
            Query points.

        Returns
        -------
        log_proba : ndarray of shape (n_queries, n_classes), or a list of them
            ``log`` of :meth:`predict_proba` (``-inf`` where a probability is 0).
        """
        if is_dask_collection(X):
            return lazy_predict(self, "predict_log_proba", X)
        proba = self.predict_proba(X)
        with np.errstate(divide="ignore"):
            if isinstance(proba, list):
                return [np.log(p) for p in proba]
            return np.log(proba)

    def predict(self, X):
        """Most probable class of each query.

        Parameters
        ----------
        X : array-like of shape (n_queries, n_features)
            Query points.

        Returns
        -------
        y : ndarray of shape (n_queries,) or (n_queries, n_outputs)
            Predicted class labels.
        """
        if is_dask_collection(X):
            return lazy_predict(self, "predict", X)
        proba = self.predict_proba(X)
        multi = getattr(self, "outputs_2d_", False)
        classes = self._classes_per_output()
        labels = getattr(self, "outlier_label_", None)
        labels = labels if multi and labels is not None else [labels] * len(classes)
        preds = [
            _most_probable(p, c, label)
            for p, c, label in zip(proba if multi else [proba], classes, labels, strict=True)
        ]
        return np.column_stack(preds) if multi else preds[0]

    def _classes_per_output(self):
        return self.classes_ if getattr(self, "outputs_2d_", False) else [self.classes_]


def output_blocks(proba, sizes):
    """Views of ``proba``'s columns, one block of ``sizes[i]`` columns per output."""
    return np.split(proba, np.cumsum(sizes)[:-1], axis=1)


def rows_summing_to_one(proba, sizes):
    """``proba`` with each row of each output's block of ``sizes`` columns divided by its sum
    (rows of zeros stay zeros), as scikit-learn's neighbour classifiers normalise their votes."""
    for block in output_blocks(proba, sizes):
        total = block.sum(1, keepdims=True)
        block /= np.where(total > 0, total, 1.0)  # (a view: proba itself)
    return proba


def _most_probable(proba, classes, outlier_label):
    pred = classes[np.argmax(proba, axis=1)]
    if outlier_label is None:  # no outlier label: every row has some probability (or raised)
        return pred
    # No probability at all: a radius query with no neighbour whose outlier label is no class
    # (MetricAttentionClassifier); it gets that label, as in scikit-learn.
    unlabelled = ~proba.any(axis=1)
    if unlabelled.any():
        pred = pred.astype(np.result_type(pred, np.asarray(outlier_label)))
        pred[unlabelled] = outlier_label
    return pred


@contextlib.contextmanager
def overflow_advice(advise):
    """The engine's overflow errors within, as a ValueError whose advice is ``advise(exc)`` (a
    list of what to do in the estimator's own terms: the engine's names its own options, such
    as ``dtype`` or ``temperature``, which an estimator may not have)."""
    try:
        yield
    except ComputeOverflowError as exc:
        raise ValueError(overflow_message(exc.cause, advise(exc))).with_traceback(
            exc.__traceback__) from None
