"""The one module that imports private scikit-learn names (as imbalanced-learn's module of the
same name does): when scikit-learn moves or changes them, this file alone changes.

Supported: scikit-learn >= 1.6 (``validate_data`` and ``__sklearn_tags__`` first appear in 1.6).
Tested: 1.6.1 and 1.9.1. There is no upper bound: an upstream change to these names breaks this
module's imports at once, in CI, rather than silently.

scikit-learn's callback API (``sklearn.callback``, new in 1.9) is used where it exists:
``CallbackSupportMixin`` is an empty mixin before 1.9 (the estimators then have no
``set_callbacks``), and ``_fit_context`` makes each ``fit`` the root task of the estimator's
callbacks (see ``utils/_callbacks.py``).

Private torch names: one, a tensor's version counter (``Tensor._version``, in every torch 2.x),
read by the engine's ``PreparedKeys.remembered`` alone (the engine, torch only, must not import
this module since it imports scikit-learn); the engine tells dropout modules apart by their
public classes.
"""

import functools

import torch
from sklearn.base import _fit_context as _sklearn_fit_context
from sklearn.utils._param_validation import (
    HasMethods,
    Hidden,
    Interval,
    StrOptions,
    validate_params,
)
from sklearn.utils.validation import _check_sample_weight, _num_samples

from .._engine import autograd_on

try:
    from sklearn.callback import CallbackSupportMixin
except ImportError:  # scikit-learn < 1.9: no callbacks

    class CallbackSupportMixin:
        """Before scikit-learn 1.9: no ``set_callbacks``."""

__all__ = [
    "CallbackSupportMixin",
    "HasMethods",
    "Hidden",
    "Interval",
    "StrOptions",
    "_check_sample_weight",
    "_fit_context",
    "_num_samples",
    "validate_params",
]


def _fit_context(*, prefer_skip_nested_validation):
    """scikit-learn's ``_fit_context`` (parameter validation; callbacks torn down after fit),
    with the fit as the root task of the estimator's callbacks when it supports them:
    ``on_fit_task_begin`` before it, ``on_fit_task_end`` (with the fitted estimator) after it.
    An estimator's ``_fit_subtasks()`` gives the number of subtasks (epochs, iterations) it
    reports under the root task (0 when it has none). The fit's ``X``, ``y`` and metadata are
    held in ``_callback_fit_data`` during the fit, for the subtasks' hooks
    (``utils/_callbacks.py``: ``ScoringMonitor`` scores a subtask's model on them), and the
    caller's torch thread count in ``_callback_threads``, on which those hooks run."""

    def decorator(fit_method):
        @functools.wraps(fit_method)
        def fit_task(estimator, X, y=None, *args, **kwargs):
            with autograd_on():  # a fit under the caller's torch.no_grad() trains too
                return fit_with_callbacks(estimator, X, y, *args, **kwargs)

        def fit_with_callbacks(estimator, X, y=None, *args, **kwargs):
            if not hasattr(estimator, "_init_callback_context"):
                return fit_method(estimator, X, y, *args, **kwargs)
            subtasks = getattr(estimator, "_fit_subtasks", lambda: 0)()
            context = estimator._init_callback_context(max_subtasks=subtasks)
            weight = kwargs.get("sample_weight")
            metadata = None if weight is None else {"sample_weight": weight}
            context.call_on_fit_task_begin(estimator=estimator, X=X, y=y, metadata=metadata)
            # a fit may run inside another (the Dask fits fit a sample in memory)
            outer = estimator.__dict__.get("_callback_fit_data")
            outer_threads = estimator.__dict__.get("_callback_threads")
            estimator._callback_fit_data = {"X": X, "y": y, "metadata": metadata}
            # the subtasks' hooks run on the caller's thread count, not on the one thread of
            # a loop of small steps (utils/_callbacks.py)
            estimator._callback_threads = torch.get_num_threads()
            try:
                fitted = fit_method(estimator, X, y, *args, **kwargs)
            finally:
                if outer is None:
                    del estimator._callback_fit_data  # no reference to the data after the fit
                    del estimator._callback_threads
                else:
                    estimator._callback_fit_data = outer
                    estimator._callback_threads = outer_threads
            context.call_on_fit_task_end(
                estimator=estimator, X=X, y=y, metadata=metadata, reconstruction_attributes={}
            )
            return fitted

        return _sklearn_fit_context(
            prefer_skip_nested_validation=prefer_skip_nested_validation
        )(fit_task)

    return decorator
