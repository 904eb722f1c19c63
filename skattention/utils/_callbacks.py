"""Subtasks of scikit-learn's callback API (``sklearn.callback``, 1.9+) inside a fit.

The fit itself is the root task (``utils._sklearn_compat._fit_context``); its steps are
subtasks: the training epochs of the estimators that train (:class:`EpochTasks`, from the
engine's training loop), the k-means runs and the mean-shift steps (:func:`report_subtask`), so
that ``ProgressBar`` shows them, within ``Pipeline`` and ``GridSearchCV`` too. Before
scikit-learn 1.9 nothing is reported.
"""


def report_subtask(estimator, task_name):
    """Report one finished step of the running fit as a subtask; ``True`` when a callback asks
    to stop. Nothing happens outside a fit with callbacks."""
    context = getattr(estimator, "_callback_fit_ctx", None)
    if context is None:
        return False
    step = context.subcontext(task_name=task_name)
    step.call_on_fit_task_begin(estimator=estimator)
    return bool(step.call_on_fit_task_end(estimator=estimator))


class EpochTasks:
    """Engine training callback: each epoch, a subtask of the estimator's fit task.

    ``on_fit_task_begin`` and ``on_fit_task_end`` of the epoch run after it (the engine's loop
    reports epochs once they are done); a callback returning ``True`` from
    ``on_fit_task_end`` stops the training, as the engine's own callbacks can.
    """

    def __init__(self, estimator):
        self.estimator = estimator

    def on_epoch_end(self, history):
        return report_subtask(self.estimator, "epoch")

    def on_train_end(self, history):
        pass
