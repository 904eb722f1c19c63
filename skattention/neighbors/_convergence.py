"""ConvergenceWarning of the metric-attention estimators that learn a metric."""

from .._engine import LEARNED_METRICS
from ..utils._convergence import warn_if_max_iter_reached


class ConvergenceCheckMixin:
    """Warns when the learned metric's training runs all ``max_iter`` epochs without its
    early-stopping rule stopping it (counting the epochs of this fit alone on a warm start)."""

    def _fit_subtasks(self):
        """Subtasks of the fit for scikit-learn's callbacks: the training epochs."""
        return self.max_iter if self.metric in LEARNED_METRICS else 0

    def _fit_learned(self, *args, **kwargs):
        warm = self.warm_start and getattr(self, "map_", None) is not None
        before = self.n_iter_ if warm else 0
        super()._fit_learned(*args, **kwargs)
        monitored = "validation loss" if self.early_stopping else "training loss"
        warn_if_max_iter_reached(
            self, self.n_iter_ - before,
            f"the {monitored} stopped improving by tol={self.tol} for "
            f"n_iter_no_change={self.n_iter_no_change} epochs",
        )
