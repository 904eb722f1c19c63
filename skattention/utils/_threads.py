"""``n_jobs``: the thread count of the engine's CPU kernels for the duration of a call."""

import functools
from contextlib import nullcontext

import joblib
import torch

from .._engine import cpu_threads


def n_jobs_threads(n_jobs):
    """Context in which the engine's CPU kernels use ``n_jobs`` threads (:func:`threads_of`);
    ``None`` changes nothing."""
    if n_jobs is None:
        return nullcontext()
    return cpu_threads(threads_of(n_jobs))


def threads_of(n_jobs):
    """The threads of ``n_jobs`` as scikit-learn's OpenMP loops count them: a negative
    ``n_jobs`` counts back from the threads the caller allows (torch's count in this thread:
    ``OMP_NUM_THREADS``, ``threadpoolctl``'s limits, a joblib worker's share; at most the
    CPUs), ``-1`` all of them, as ``_openmp_effective_n_threads`` does; a positive one at most
    the CPUs this process may run on (more threads than cores only wait for each other, and
    the OpenMP team outlives the call). ``0`` is joblib's error."""
    cpus = joblib.cpu_count()
    if n_jobs < 0:
        return max(1, min(torch.get_num_threads(), cpus) + 1 + n_jobs)
    return min(joblib.effective_n_jobs(n_jobs), cpus)


def uses_n_jobs(method):
    """Run an estimator's method under its ``n_jobs`` thread count."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with n_jobs_threads(getattr(self, "n_jobs", None)):
            return method(self, *args, **kwargs)

    return wrapper
