"""The ConvergenceWarning of the estimators that train for up to ``max_iter`` epochs."""

from sklearn.exceptions import ConvergenceWarning

from ._warnings import warn_user


def warn_if_max_iter_reached(estimator, epochs_run, rule):
    """Warn, as MLPClassifier does, when this fit ran all ``estimator.max_iter`` epochs: its
    stopping ``rule`` (what would have stopped it earlier) was not met. The hint names
    ``warm_start`` only for an estimator that has that parameter."""
    if epochs_run < estimator.max_iter:
        return
    resume = (" (or warm_start and fit again)"
              if "warm_start" in estimator.get_params(deep=False) else "")
    warn_user(
        f"{type(estimator).__name__}: training stopped at max_iter={estimator.max_iter} epochs "
        f"before {rule}; the model may not have converged. Raise max_iter{resume} if the "
        "training loss is still falling (loss_curve_).",
        ConvergenceWarning,
    )
