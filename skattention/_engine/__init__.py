"""The attention engine: torch only, no scikit-learn imports.

Estimators are thin scikit-learn shells over :func:`attention`.
"""

from ._attention import attention, kneighbors
from ._device import resolve_device, resolve_dtype
from ._kernels import ball_counts, gaussian_kernel, gaussian_kernel_log_sums, sqdist_log_histogram

__all__ = [
    "attention",
    "kneighbors",
    "resolve_device",
    "resolve_dtype",
    "ball_counts",
    "gaussian_kernel",
    "gaussian_kernel_log_sums",
    "sqdist_log_histogram",
]
