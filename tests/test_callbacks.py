"""scikit-learn's callback API (1.9+): each fit a task, each training epoch a subtask."""

import numpy as np
import pytest
from sklearn.datasets import make_classification

from tests.conftest import CHEAP, cheap

callback = pytest.importorskip("sklearn.callback", reason="scikit-learn < 1.9: no callbacks")


class Recorder:
    """Records the hooks; auto-propagated (into Pipeline and GridSearchCV's clones)."""

    max_propagation_depth = None

    def __init__(self, stop_after=None):
        self.events, self.stop_after = [], stop_after

    def setup(self, estimator, context):
        self.events.append(("setup", type(estimator).__name__, context.task_name))

    def teardown(self, estimator, context):
        self.events.append(("teardown", type(estimator).__name__, context.task_name))

    def on_fit_task_begin(self, estimator, context):
        self.events.append(("begin", type(estimator).__name__, context.task_name))

    def on_fit_task_end(self, estimator, context):
        self.events.append(("end", type(estimator).__name__, context.task_name))
        epochs = sum(e[0] == "end" and e[2] == "epoch" for e in self.events)
        return self.stop_after is not None and epochs >= self.stop_after


@pytest.fixture(scope="module")
def data():
    return make_classification(n_samples=80, n_features=4, random_state=0)


EPOCHS = {"MetricAttentionClassifier", "MetricAttentionRegressor",
          "MetricAttentionTransformer", "AttentionNetworkClassifier"}


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("name", sorted(CHEAP))
def test_fit_and_epochs_are_tasks(data, name):
    X, y = data
    recorder = Recorder()
    est = cheap(name).set_callbacks(recorder)
    est.fit(X, y)
    name_events = [e for e in recorder.events if e[1] == name]
    assert name_events[0] == ("setup", name, "fit")
    assert name_events[1] == ("begin", name, "fit")
    assert name_events[-2:] == [("end", name, "fit"), ("teardown", name, "fit")]
    steps = [e for e in name_events if e[2] in ("epoch", "run", "step")]
    if name in EPOCHS:
        assert len(steps) == 2 * est.n_iter_ and est.n_iter_ > 0
    elif name == "AttentionKMeans":
        assert steps == [("begin", name, "run"), ("end", name, "run")] * est.n_init
    elif name == "AttentionMeanShift":
        assert steps and len(steps) % 2 == 0 and {e[2] for e in steps} == {"step"}
    else:
        assert not steps
    assert not hasattr(est, "_callback_fit_ctx")  # torn down


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_a_callback_stops_training(data):
    X, y = data
    est = cheap("MetricAttentionClassifier", max_iter=20, early_stopping=False)
    est.set_callbacks(Recorder(stop_after=3)).fit(X, y)
    assert est.n_iter_ == 3


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_callbacks_inside_pipeline_and_grid_search(data):
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = data
    recorder = Recorder()
    search = GridSearchCV(
        make_pipeline(StandardScaler(), cheap("MetricAttentionClassifier")),
        {"metricattentionclassifier__max_iter": [1, 2]}, cv=2,
    ).set_callbacks(recorder)
    search.fit(X, y)
    ours = [e for e in recorder.events if e[1] == "MetricAttentionClassifier"]
    # 2 candidates x 2 folds + the refit: one fit task each, with their epochs
    assert sum(e[:3] == ("begin", "MetricAttentionClassifier", "fit") for e in ours) == 5
    refit_epochs = search.best_params_["metricattentionclassifier__max_iter"]
    assert sum(e[0] == "end" and e[2] == "epoch" for e in ours) == 2 * (1 + 2) + refit_epochs


def test_scoring_monitor_scores_the_fit(data):
    X, y = data
    monitor = callback.ScoringMonitor(scoring="accuracy")
    est = cheap("MetricAttentionClassifier", metric="euclidean").set_callbacks(monitor)
    est.fit(X, y)
    log = monitor.get_logs()
    scores = [row["accuracy"] for row in log.data if "accuracy" in row]
    assert scores == [pytest.approx(est.score(X, y))]
    assert np.isfinite(scores).all()
