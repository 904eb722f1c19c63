"""What the in-memory and the Dask fits of AttentionKMeans share: the loop over the ``n_init``
runs (progress, scikit-learn's callbacks, the best run kept) and the warning when fewer
clusters than asked hold points."""

from dataclasses import dataclass

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning

from .._engine import progress_bar
from ..utils._callbacks import begin_subtask, end_subtask, report_subtask
from ..utils._warnings import warn_user


@dataclass
class Run:
    """One run of k-means: its centres (in the centred coordinates of the fit), labels and
    inertia, its Lloyd (or soft) iterations and annealing EM steps, and, where the labels
    are not at hand (Dask), the number of points of each cluster."""

    centers: object
    labels: object
    inertia: float
    n_iter: int
    n_anneal: int = 0
    counts: object = None


def best_run(estimator, n_init, run_once, fitted_centers, kind, weight_exponent=0):
    """Make up to ``n_init`` runs and keep the one of lowest inertia.

    ``run_once(on_iteration)`` makes one run and returns its :class:`Run`; ``on_iteration`` is
    the hook of the engine's iteration loop (``None`` when no callback listens).
    ``fitted_centers(centers)`` turns an iteration's centres into ``cluster_centers_`` (what
    the callbacks see); ``kind`` names the iterations in the lines of ``verbose >= 2``.
    ``weight_exponent``: the runs' inertias are in units of ``2**weight_exponent`` of the
    user's weights (:func:`~._inputs.checked_sample_weight`); the lines show the user's units,
    as ``inertia_`` does.

    Returns the best :class:`Run` and whether a callback stopped the fit: a stop asked at an
    iteration ends its run there, and the fit after that run.
    """
    def shown(inertia):
        with np.errstate(over="ignore"):
            return f"{float(np.ldexp(float(inertia), weight_exponent)):.6g}"

    best, stopped = None, False
    runs = progress_bar(estimator.verbose, total=n_init, desc="AttentionKMeans fit", unit="run")
    for run in range(n_init):
        # scikit-learn's callbacks: the run a subtask of the fit, each Lloyd (or soft)
        # iteration a subtask of the run (the annealing EM steps are not reported)
        run_task = begin_subtask(estimator, "run", max_subtasks=estimator.max_iter)

        def on_iteration(centers, run_task=run_task):
            nonlocal stopped
            stopped = report_subtask(
                estimator, "iteration", parent=run_task,
                reconstruction_attributes=lambda: {"cluster_centers_": fitted_centers(centers)},
            ) or stopped
            return stopped

        result = run_once(None if run_task is None else on_iteration)
        if estimator.verbose >= 2:
            runs.write(
                f"AttentionKMeans run {run}: inertia {shown(result.inertia)}, {result.n_anneal} "
                f"annealing and {result.n_iter} {kind} iterations"
            )
        if best is None or (result.inertia < best.inertia
                            and not _same_clustering(result.labels, best.labels)):
            best = result
        runs.set_postfix(inertia=shown(result.inertia), best=shown(best.inertia),
                         refresh=False)
        runs.update()
        stopped = end_subtask(estimator, run_task) or stopped
        if stopped:
            break
    runs.close()
    return best, stopped


def _same_clustering(labels, best_labels):
    """Whether two runs' labels are one partition up to the clusters' numbering (scikit-learn's
    ``_is_same_clustering``: each cluster of the first maps to a single one of the second),
    where a lower inertia is rounding, and KMeans keeps its first run; ``False`` where the
    labels are not at hand (Dask)."""
    in_memory = (np.ndarray, torch.Tensor)
    if not (isinstance(labels, in_memory) and isinstance(best_labels, in_memory)):
        return False
    a, b = (np.asarray(x.cpu() if isinstance(x, torch.Tensor) else x).astype(np.int64)
            for x in (labels, best_labels))
    pairs = np.unique(a * (int(b.max(initial=0)) + 1) + b)
    return pairs.size == np.unique(a).size


def warn_if_fewer_clusters(distinct, n_clusters):
    """KMeans's ConvergenceWarning when fewer than ``n_clusters`` clusters hold points."""
    if distinct < n_clusters:
        warn_user(
            f"Number of distinct clusters ({distinct}) found smaller than n_clusters "
            f"({n_clusters}). Possibly due to duplicate points in X.",
            ConvergenceWarning,
        )
