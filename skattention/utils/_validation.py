"""Input preparation shared by the estimators (scikit-learn side)."""

import numpy as np
from sklearn.utils.multiclass import check_classification_targets

from ._dask import is_dask_collection, lazy_predict


def standardisation(X):
    """Per-feature mean and scale that standardise ``X`` (scale 1 for constant features).

    The statistics are computed in float64: the float32 variance of data at a tiny scale
    (~1e-20 and below) underflows to 0 and would leave the data unscaled. They are returned in
    ``X``'s dtype unless the scale overflows it.
    """
    mean = X.mean(0, dtype=np.float64).astype(X.dtype)
    scale = X.std(0, dtype=np.float64)
    scale = scale.astype(X.dtype) if np.all(scale < np.finfo(X.dtype).max) else scale
    return mean, np.where(scale > 0, scale, 1.0)


def encode_classes(estimator, y):
    """``(classes, y_encoded)`` of classification targets; a clear error for a single class."""
    check_classification_targets(y)
    classes, y_encoded = np.unique(y, return_inverse=True)
    if classes.size < 2:
        raise ValueError(
            f"{type(estimator).__name__} needs samples of at least 2 classes in the data, but the "
            f"data contains only one class: {classes[0]!r}."
        )
    return classes, y_encoded


class ProbabilisticClassifierMixin:
    """``predict_proba`` and ``predict`` of a classifier from its ``_predict_proba(X)``."""

    def predict_proba(self, X):
        """Class probabilities of each query.

        Parameters
        ----------
        X : array-like of shape (n_queries, n_features)
            Query points.

        Returns
        -------
        proba : ndarray of shape (n_queries, n_classes)
            Class probabilities, columns ordered as ``classes_``.
        """
        if is_dask_collection(X):
            return lazy_predict(self, "predict_proba", X)
        proba = self._predict_proba(X)
        # Rounding can leave sums a few ulp from 1; renormalise like scikit-learn's neighbours
        # (a row of zeros, a radius query with no neighbour, stays zeros).
        total = proba.sum(axis=1, keepdims=True)
        return proba / np.where(total > 0, total, 1.0)

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
        if is_dask_collection(X):
            return lazy_predict(self, "predict", X)
        proba = self.predict_proba(X)
        pred = self.classes_[np.argmax(proba, axis=1)]
        # No probability at all: a radius query with no neighbour whose outlier_label_ is no
        # class (MetricAttentionClassifier); it gets that label, as in scikit-learn.
        unlabelled = ~proba.any(axis=1)
        if unlabelled.any():
            pred = pred.astype(np.result_type(pred, np.asarray(self.outlier_label_)))
            pred[unlabelled] = self.outlier_label_
        return pred
