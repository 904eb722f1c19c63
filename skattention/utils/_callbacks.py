"""Subtasks of scikit-learn's callback API (``sklearn.callback``, 1.9+) inside a fit.

The fit itself is the root task (``utils._sklearn_compat._fit_context``); the training epochs
of the estimators that train are its subtasks, reported by :class:`EpochTasks` from the
engine's training loop, so that ``ProgressBar`` shows them, within ``Pipeline`` and
``GridSearchCV`` too. Before scikit-learn 1.9 nothing is reported.
"""


class EpochTasks:
    """Engine training callback: each epoch, a subtask of the estimator's fit task.

    ``on_fit_task_begin`` and ``on_fit_task_end`` of the epoch run after it (the engine's loop
    reports epochs once they are done); a callback returning ``True`` from
    ``on_fit_task_end`` stops the training, as the engine's own callbacks can.
    """

    def __init__(self, estimator, task_name="epoch"):
        self.estimator, self.task_name = estimator, task_name
        # the fit's root task, while a fit with callbacks runs
        self.context = getattr(estimator, "_callback_fit_ctx", None)

    def on_epoch_end(self, history):
        if self.context is None:
            return False
        epoch = self.context.subcontext(task_name=self.task_name)
        epoch.call_on_fit_task_begin(estimator=self.estimator)
        return bool(epoch.call_on_fit_task_end(estimator=self.estimator))

    def on_train_end(self, history):
        pass
