"""The regressor's linear trend: ridge regression whose penalty is chosen by efficient
leave-one-out cross-validation (GCV), as :class:`~sklearn.linear_model.RidgeCV` chooses it.

``RidgeCV`` on a sparse design (the trend's one-hot levels) multiplies the design by a (width x
width) matrix for every candidate penalty, which made it a noticeable part of a regressor's fit
on tables with many levels (docs/performance.md, "The trend's penalty"). The same leave-one-out
errors need that product only once, in the eigenbasis of the centred design's covariance: for
every penalty at once, chunk by chunk of rows; the chosen penalty's coefficients come from the
same eigenbasis (a ``RidgeCV`` fitted again at that penalty alone would decompose the design a
second time).
"""

import numpy as np
from scipy import linalg, sparse
from sklearn.linear_model import RidgeCV
from threadpoolctl import threadpool_limits

# rows of the design taken at once (a chunk's product is rows x width numbers)
_GCV_ROWS = 4096


def fit_trend(design, values, sample_weight, alphas):
    """``RidgeCV(alphas)`` fitted to ``design`` (sparse or dense, ``n`` rows) and ``values``
    (``(n,)`` or ``(n, n_outputs)``) with ``sample_weight``: its penalty (``alpha_``, the least
    leave-one-out error, :func:`gcv_penalty`), ``best_score_`` (the negative mean of those
    errors), ``coef_`` and ``intercept_``, as ``RidgeCV(alphas=alphas).fit`` sets them (up to
    rounding), from one eigendecomposition."""
    # One BLAS thread: the products are a few small ones per chunk of rows, and OpenBLAS's
    # threads wait for each other at every one of them when other programs keep a core busy
    # (docs/performance.md, "Shared machines").
    with threadpool_limits(limits=1, user_api="blas"):
        gcv = _LeaveOneOut(design, values, sample_weight, alphas)
    best = int(np.argmin(gcv.squared))
    coef = gcv.V @ gcv.projections[:, best, :gcv.n_targets]  # (width, n_targets)
    intercept = gcv.y_mean - gcv.mean @ coef
    trend = RidgeCV(alphas=[float(alphas[best])])
    trend.alpha_ = float(alphas[best])
    trend.best_score_ = -float(gcv.squared[best]) / (gcv.y.shape[0] * gcv.n_targets)
    # RidgeCV's shapes and dtype: one target's coefficients flat, a 1-D target's intercept a
    # scalar, float32 for a float32 design
    dtype = np.float32 if design.dtype == np.float32 else np.float64
    trend.coef_ = (coef[:, 0] if gcv.n_targets == 1 else coef.T).astype(dtype)
    intercept = intercept.astype(dtype)
    trend.intercept_ = intercept[0] if np.ndim(values) == 1 else intercept
    trend.n_features_in_ = design.shape[1]
    return trend


def gcv_penalty(design, values, sample_weight, alphas):
    """The penalty among ``alphas`` whose ridge regression (with an intercept, weighted) has
    the least mean squared leave-one-out error, the first of equal ones: ``RidgeCV``'s
    ``alpha_`` without a scorer."""
    return float(alphas[int(np.argmin(_LeaveOneOut(design, values, sample_weight,
                                                   alphas).squared))])


class _LeaveOneOut:
    """The leave-one-out errors of ridge regressions at every penalty of ``alphas``. With
    ``X`` the weighted, centred design scaled by the square roots of the weights and ``X^T X =
    V diag(l) V^T``, the hat matrix of penalty ``a`` is ``(X V) diag(1 / (l + a)) (X V)^T``: its
    diagonal and its products with the targets, for every penalty, from ``X V`` alone.
    ``squared[i]``: the summed squared errors at ``alphas[i]``; ``V @ projections[:, i, :k]``
    that penalty's coefficients."""

    def __init__(self, design, values, sample_weight, alphas):
        sw = np.asarray(sample_weight, dtype=np.float64)
        self.y = y = np.asarray(values, dtype=np.float64).reshape(sw.shape[0], -1)
        alphas = np.asarray(alphas, dtype=np.float64)
        sw_sum = sw.sum()
        root = np.sqrt(sw)
        if sparse.issparse(design):
            X = sparse.csr_matrix(design, dtype=np.float64).multiply(root[:, None]).tocsr()
        else:
            X = np.asarray(design, dtype=np.float64) * root[:, None]
        self.mean = mean = np.asarray(X.T @ root).ravel() / sw_sum  # the weighted column means
        self.y_mean = sw @ y / sw_sum
        y_root = (y - self.y_mean) * root[:, None]
        # the centred design is X - root mean^T: its covariance and its products, without it
        cov = (X.T @ X).toarray() if sparse.issparse(X) else X.T @ X
        eigenvalues, V = linalg.eigh(cov - sw_sum * np.outer(mean, mean))
        self.V = V
        targets = np.column_stack([y_root, root])  # the intercept's column last
        XT_targets = np.asarray(X.T @ targets) - np.outer(mean, root @ targets)
        inverse = 1.0 / (eigenvalues[:, None] + alphas[None, :])  # (width, penalties)
        self.projections = inverse[:, :, None] * (V.T @ XT_targets)[:, None, :]
        projections = self.projections.reshape(V.shape[1], -1)
        mean_V = mean @ V
        self.n_targets = n_targets = y.shape[1]
        self.squared = squared = np.zeros(alphas.shape[0])
        for start in range(0, X.shape[0], _GCV_ROWS):
            rows = slice(start, start + _GCV_ROWS)
            XV = np.asarray(X[rows] @ V) - root[rows, None] * mean_V[None, :]
            hat = (XV * XV) @ inverse  # the hat matrix's diagonal, per penalty
            fitted = (XV @ projections).reshape(XV.shape[0], alphas.shape[0], n_targets + 1)
            residual = y_root[rows, None, :] - fitted[:, :, :n_targets]
            # the intercept's leverage, as RidgeCV counts it
            leverage = 1.0 - hat - (root[rows, None] - fitted[:, :, n_targets]) * (
                root[rows, None] / sw_sum)
            squared += ((residual / leverage[:, :, None]) ** 2).sum(axis=(0, 2))
