"""The ConvergenceWarning of the estimators that train for up to ``max_iter`` epochs."""

import warnings

from sklearn.exceptions import ConvergenceWarning


def warn_if_max_iter_reached(estimator, epochs_run, rule):
    """Warn, as MLPClassifier does, when this fit ran all ``estimator.max_iter`` epochs: its
    stopping ``rule`` (what would have stopped it earlier) was not met."""
    if epochs_run < estimator.max_iter:
        return
    warnings.warn(
        f"{type(estimator).__name__}: training stopped at max_iter={estimator.max_iter} epochs "
        f"before {rule}; the model may not have converged. Raise max_iter (or warm_start and "
        "fit again) if the training loss is still falling (loss_curve_).",
        ConvergenceWarning,
        stacklevel=2,
    )
