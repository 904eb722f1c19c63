"""How the tabular encoder scales a numeric column: robust (RealMLP), quantile-normal
(ModernNCA / TabR), standard, or not at all (the encoder's ``numeric_scaling``)."""

import numpy as np
from scipy.special import ndtri

# quantile scaling: n_quantiles = clip(n // 30, 10, 1000), as TALENT's QuantileTransformer
_QUANTILES = (10, 1000, 30)
# the normal output is clipped where a training value can land (sklearn's BOUNDS_THRESHOLD idea)
_NORMAL_CLIP = 5.2
_ROBUST_CLIP = 3.0


def column_scaling(finite, how):
    """(centre, scale, quantile grid or None) of one numeric column's finite values."""
    if finite.size == 0:  # all missing: a constant column
        return 0.0, 1.0, None
    if how is None:  # the centre is only where missing values go
        return float(np.median(finite)), 1.0, None
    if how == "standard":
        scale = finite.std()
        return finite.mean(), scale if scale > 0 else 1.0, None
    if how == "robust":
        return (*robust_scaling(finite), None)
    median = float(np.median(finite))
    low, high, per = _QUANTILES
    n_quantiles = int(np.clip(finite.size // per, low, high))
    grid = np.percentile(finite, np.linspace(0, 100, n_quantiles))
    return median, 1.0, grid


def robust_scaling(finite):
    """(median, IQR) of finite values; half the range where the IQR is 0 (RealMLP), else 1."""
    median = float(np.median(finite))
    q25, q75 = np.percentile(finite, [25, 75])
    scale = q75 - q25
    if scale <= 0:
        scale = 0.5 * (finite.max() - finite.min())
    return median, scale if scale > 0 else 1.0


def smooth_clip(z):
    """RealMLP's smooth clipping of robust-scaled numbers to about +-_ROBUST_CLIP."""
    with np.errstate(over="ignore", invalid="ignore"):
        square = (z / _ROBUST_CLIP) ** 2
        out = z / np.sqrt(1.0 + square)
    # where the square overflows (beyond about 1e154, or 1e19 in float32) that is 0 or NaN
    # (z / inf), not the limit: a number far beyond the training data mapped to its median
    far = np.isinf(square)
    return np.where(far, np.copysign(_ROBUST_CLIP, z), out) if np.any(far) else out


def scaled(values, how, centre, scale, grid=None):
    """``values`` scaled as ``how`` says, by their column's (or columns') ``centre`` and
    ``scale``, or through its quantile ``grid``."""
    if how is None:
        return values
    if grid is None:
        out = (values - centre) / scale
        return smooth_clip(out) if how == "robust" else out
    levels = np.linspace(0.0, 1.0, grid.size)
    # average of the forward and backward interpolation: ties (repeated quantiles, as in a
    # binary column) map to the middle of their probability range, as in scikit-learn
    u = 0.5 * (np.interp(values, grid, levels) - np.interp(-values, -grid[::-1], -levels[::-1]))
    z = ndtri(np.clip(u, 1e-7, 1 - 1e-7))
    return np.clip(z, -_NORMAL_CLIP, _NORMAL_CLIP)
