"""``n_jobs``: the thread count of the engine's CPU kernels for the duration of a call."""

import functools
from contextlib import nullcontext

import joblib

from .._engine import cpu_threads


def n_jobs_threads(n_jobs):
    """Context in which the engine's CPU kernels use ``n_jobs`` threads (joblib's counting);
    ``None`` changes nothing."""
    if n_jobs is None:
        return nullcontext()
    return cpu_threads(joblib.effective_n_jobs(n_jobs))


def uses_n_jobs(method):
    """Run an estimator's method under its ``n_jobs`` thread count."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with n_jobs_threads(getattr(self, "n_jobs", None)):
            return method(self, *args, **kwargs)

    return wrapper
