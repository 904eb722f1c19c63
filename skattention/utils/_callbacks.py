"""Subtasks of scikit-learn's callback API (``sklearn.callback``, 1.9+) inside a fit.

The fit itself is the root task (``utils._sklearn_compat._fit_context``); its steps are
subtasks: the training epochs of the estimators that train (:class:`EpochTasks`, from the
engine's training loop), the k-means runs and, nested in each run, its Lloyd or soft k-means
iterations, the mean-shift steps, and the steps of a diffusion embedding with, nested in its
eigen-solve, the Lanczos solves (:func:`begin_subtask`, :func:`end_subtask`,
:func:`report_subtask`), so that ``ProgressBar`` shows them, within ``Pipeline`` and
``GridSearchCV`` too. Every hook is given the fit's ``X``, ``y`` and metadata; a subtask that
can give the model as it stands after it (``reconstruction_attributes``) lets ``ScoringMonitor``
score it. The hooks run on the caller's torch thread count. Before scikit-learn 1.9 nothing is
reported.
"""

from contextlib import nullcontext

from .._engine import cpu_threads


def _callers_threads(estimator):
    """The caller's torch thread count for the hooks (a subtask may run inside a loop of small
    steps on one thread, where a callback's own work, such as ``ScoringMonitor``'s scoring,
    would run on one core too); nothing changed outside a fit with callbacks."""
    threads = getattr(estimator, "_callback_threads", None)
    return nullcontext() if threads is None else cpu_threads(threads)


def _fit_data(estimator):
    """The running fit's ``X``, ``y`` and ``metadata`` for the hooks (set by ``_fit_context``)."""
    return getattr(estimator, "_callback_fit_data", {})


def begin_subtask(estimator, task_name, *, max_subtasks=0, parent=None):
    """Open a subtask of ``parent`` (``None``: the fit's root task) and call its
    ``on_fit_task_begin``; return its context, to be closed by :func:`end_subtask`.

    ``max_subtasks``: how many subtasks it has at most (``None``: not known; ``0``: none).
    Returns ``None`` (and does nothing) outside a fit with callbacks.
    """
    if parent is None:
        parent = getattr(estimator, "_callback_fit_ctx", None)
        if parent is None:
            return None
    task = parent.subcontext(task_name=task_name, max_subtasks=max_subtasks)
    with _callers_threads(estimator):
        task.call_on_fit_task_begin(estimator=estimator, **_fit_data(estimator))
    return task


def end_subtask(estimator, task, reconstruction_attributes=None):
    """Call the ``on_fit_task_end`` of a subtask opened by :func:`begin_subtask`; ``True`` when
    a callback asks to stop.

    ``reconstruction_attributes``: the fitted attributes of the model as it stands after the
    subtask (a dict, or a function returning one, called only when a callback asks for that
    model), or ``None`` when it has no such model.
    """
    if task is None:
        return False
    with _callers_threads(estimator):
        return bool(task.call_on_fit_task_end(
            estimator=estimator, reconstruction_attributes=reconstruction_attributes,
            **_fit_data(estimator),
        ))


def report_subtask(estimator, task_name, *, parent=None, reconstruction_attributes=None):
    """Report one finished step of the running fit as a subtask of ``parent`` (``None``: the
    fit's root task); ``True`` when a callback asks to stop. Nothing happens outside a fit with
    callbacks."""
    task = begin_subtask(estimator, task_name, parent=parent)
    return end_subtask(estimator, task, reconstruction_attributes)


class EpochTasks:
    """Engine training callback: each epoch, a subtask of the estimator's fit task.

    ``on_fit_task_begin`` and ``on_fit_task_end`` of the epoch run after it (the engine's loop
    reports epochs once they are done); a callback returning ``True`` from
    ``on_fit_task_end`` stops the training, as the engine's own callbacks can.
    ``fitted_attributes``, when given, is a function returning the fitted attributes of the
    model as it stands after the epoch (called only when a callback such as ``ScoringMonitor``
    asks for that model).
    """

    def __init__(self, estimator, fitted_attributes=None):
        self.estimator = estimator
        self.fitted_attributes = fitted_attributes

    def on_epoch_end(self, history):
        return report_subtask(
            self.estimator, "epoch", reconstruction_attributes=self.fitted_attributes
        )

    def on_train_end(self, history):
        pass
