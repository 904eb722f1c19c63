"""scikit-learn's callback API (1.9+): each fit a task, each training epoch, k-means run and
iteration, mean-shift step and diffusion-embedding step a subtask."""

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.datasets import make_blobs, make_classification
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from skattention import (
    AttentionDiffusionEmbedding,
    AttentionKMeans,
    AttentionMeanShift,
    AttentionNetworkClassifier,
)
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
        runs = [e for e in name_events if e[2] == "run"]
        assert runs[0] == ("begin", name, "run") and runs[-1] == ("end", name, "run")
        assert len(runs) == 2 * est.n_init
    elif name == "AttentionDiffusionEmbedding":  # dense eigen-solve: no Lanczos solves
        assert [e[2] for e in name_events if e[0] == "end"] == [
            "bandwidth", "operator", "eigenpairs", "fit"]
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


def _epoch_and_fit_accuracies(monitor):
    """A ScoringMonitor's accuracies of the epochs' models and of the fitted model."""
    rows = monitor.get_logs().data
    return ([row["accuracy"] for row in rows if row["task_name"] == task]
            for task in ("epoch", "fit"))


def test_scoring_monitor_scores_each_epoch(data):
    # the model after each epoch is scored; after the last one it is the fitted model (no
    # validation split, a fixed temperature: nothing changes after the training loop)
    X, y = data
    monitor = callback.ScoringMonitor(scoring="accuracy")
    est = cheap("MetricAttentionClassifier", metric="linear", max_iter=4, early_stopping=False,
                temperature=1.0, learning_rate=0.05).set_callbacks(monitor)
    with pytest.warns(ConvergenceWarning):
        est.fit(X, y)
    epochs, fit = _epoch_and_fit_accuracies(monitor)
    assert len(epochs) == est.n_iter_ == 4
    assert fit == [pytest.approx(est.score(X, y))]
    assert epochs[-1] == pytest.approx(fit[0])
    assert len(set(epochs)) > 1  # the epochs' own models, not the final one four times
    assert not hasattr(est, "_callback_fit_data")


class TaskTree:
    """Records every task as (name, depth) and, at the end of an iteration, the prediction of
    the model after it; stops after ``stop_after`` tasks named ``stop_at`` end."""

    def __init__(self, stop_at=None, stop_after=None):
        self.begun, self.ended, self.predictions = [], [], []
        self.stop_at, self.stop_after = stop_at, stop_after

    def setup(self, estimator, context):
        pass

    def teardown(self, estimator, context):
        pass

    def on_fit_task_begin(self, estimator, context):
        self.begun.append((context.task_name, _depth(context), context.max_subtasks))

    def on_fit_task_end(self, estimator, context, *, X=None, fitted_estimator=None):
        self.ended.append((context.task_name, _depth(context)))
        if context.task_name == "iteration":
            self.predictions.append(fitted_estimator.predict(X))
        done = sum(name == self.stop_at for name, _ in self.ended)
        return self.stop_after is not None and done >= self.stop_after

    def count(self, name, depth):
        return sum(task == (name, depth) for task in self.ended)


def _depth(context):
    return 0 if context.parent is None else 1 + _depth(context.parent)


@pytest.fixture(scope="module")
def blobs():
    return make_blobs(n_samples=150, centers=4, cluster_std=2.0, random_state=0)[0]


@pytest.mark.parametrize("temperature", [0, 2.0])
def test_kmeans_iterations_are_subtasks_of_runs(blobs, temperature):
    tree = TaskTree()
    km = AttentionKMeans(4, temperature=temperature, init="random", n_init=3, max_iter=50,
                         random_state=0).set_callbacks(tree).fit(blobs)
    assert tree.begun[0] == ("fit", 0, 3)
    assert tree.begun.count(("run", 1, 50)) == 3 and tree.count("run", 1) == 3
    iterations = tree.count("iteration", 2)
    assert 3 <= iterations <= 3 * 50 and iterations == len(tree.ended) - 4
    assert {name for name, _ in tree.ended} == {"fit", "run", "iteration"}
    assert not km.stopped_by_callback_
    # the model after an iteration predicts with that iteration's centres
    assert all(p.shape == (blobs.shape[0],) for p in tree.predictions)


def test_kmeans_annealing_reports_its_lloyd_iterations(blobs):
    tree = TaskTree()
    km = AttentionKMeans(4, random_state=0).set_callbacks(tree).fit(blobs)
    # n_iter_ counts the annealing EM steps too; only the Lloyd iterations are reported
    assert 1 <= tree.count("iteration", 2) <= km.n_iter_
    assert tree.count("run", 1) == 1


@pytest.mark.parametrize("temperature", [0, 2.0])
def test_a_callback_stops_kmeans_after_an_iteration(blobs, temperature):
    settings = dict(n_clusters=4, temperature=temperature, init="random", n_init=3,
                    random_state=0)
    tree = TaskTree(stop_at="iteration", stop_after=2)
    km = AttentionKMeans(**settings).set_callbacks(tree).fit(blobs)
    assert km.stopped_by_callback_ and km.n_iter_ == 2
    assert tree.count("run", 1) == 1 and tree.count("iteration", 2) == 2  # no further run
    # stopped where max_iter=2 would stop the first run: the same, usable model
    expected = AttentionKMeans(**{**settings, "n_init": 1, "max_iter": 2}).fit(blobs)
    np.testing.assert_allclose(km.cluster_centers_, expected.cluster_centers_)
    np.testing.assert_array_equal(km.predict(blobs), expected.predict(blobs))
    assert km.inertia_ == pytest.approx(expected.inertia_)
    # the model after iteration 2 is the fitted one
    np.testing.assert_array_equal(tree.predictions[-1], km.labels_)


def test_a_callback_stops_kmeans_after_a_run(blobs):
    tree = TaskTree(stop_at="run", stop_after=1)
    km = AttentionKMeans(4, temperature=0, init="random", n_init=3,
                         random_state=0).set_callbacks(tree).fit(blobs)
    assert km.stopped_by_callback_ and tree.count("run", 1) == 1
    assert tree.count("iteration", 2) == km.n_iter_  # the one run's iterations


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_kmeans_on_dask_reports_and_stops_as_in_memory(blobs):
    da = pytest.importorskip("dask.array")
    import dask

    settings = dict(n_clusters=4, temperature=0, init=blobs[:4], random_state=0)
    in_memory = AttentionKMeans(**settings).set_callbacks(TaskTree("iteration", 3)).fit(blobs)
    tree = TaskTree(stop_at="iteration", stop_after=3)
    with dask.config.set(scheduler="synchronous"):
        sharded = AttentionKMeans(**settings).set_callbacks(tree).fit(
            da.from_array(blobs, chunks=50)
        )
    assert sharded.stopped_by_callback_ and sharded.n_iter_ == in_memory.n_iter_ == 3
    assert tree.count("run", 1) == 1 and tree.count("iteration", 2) == 3
    np.testing.assert_allclose(sharded.cluster_centers_, in_memory.cluster_centers_)


def test_diffusion_embedding_reports_its_steps_and_lanczos_solves():
    X = make_blobs(n_samples=120, centers=3, random_state=0)[0]
    settings = dict(n_components=2, n_neighbors=10, eigen_solver="arpack", random_state=0)
    # a stop request is ignored: the fit has no embedding before its eigen-solve has run
    tree = TaskTree(stop_at="Lanczos solve", stop_after=1)
    est = AttentionDiffusionEmbedding(**settings).set_callbacks(tree).fit(X)
    assert tree.begun[0] == ("fit", 0, 4)
    assert [task for task in tree.ended if task[1] == 1] == [
        ("k-NN graph", 1), ("bandwidth", 1), ("operator", 1), ("eigenpairs", 1)]
    assert ("eigenpairs", 1, None) in tree.begun
    assert tree.count("Lanczos solve", 2) > 1
    expected = AttentionDiffusionEmbedding(**settings).fit(X)
    np.testing.assert_allclose(est.embedding_, expected.embedding_)


def _progress_bar():
    pytest.importorskip("rich")
    return callback.ProgressBar(max_propagation_depth=None)


# the nested tasks each estimator reports (the bars below the fit's)
NESTED = {"AttentionKMeans": "iteration", "AttentionDiffusionEmbedding": "Lanczos solve",
          "MetricAttentionClassifier": "epoch"}


# ProgressBar draws from a thread: an error there would only be a warning
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("name", sorted(NESTED))
def test_progress_bar_inside_pipeline_and_grid_search(data, name):
    X, y = data
    step = cheap(name) if name != "AttentionKMeans" else cheap(name, n_init=2, temperature=0)
    if name == "AttentionDiffusionEmbedding":
        step.set_params(n_neighbors=10, eigen_solver="arpack")
    recorder = Recorder()
    pipeline = make_pipeline(StandardScaler(), step)
    pipeline.set_callbacks(_progress_bar(), recorder).fit(X, y)
    nested = sum(e[:3] == ("end", name, NESTED[name]) for e in recorder.events)
    assert nested > 0
    grid = {"standardscaler__with_mean": [True, False]}
    scoring = None if name == "MetricAttentionClassifier" else (lambda est, X, y: 0.0)
    search = GridSearchCV(make_pipeline(StandardScaler(), clone(step)), grid, cv=2,
                          scoring=scoring)
    recorder = Recorder()
    search.set_callbacks(_progress_bar(), recorder).fit(X, y)
    # 2 candidates x 2 folds + the refit, each with its nested tasks
    assert sum(e[:3] == ("begin", name, "fit") for e in recorder.events) == 5
    assert sum(e[:3] == ("end", name, NESTED[name]) for e in recorder.events) >= 5
    assert not hasattr(search.best_estimator_[-1], "_callback_fit_ctx")


@pytest.mark.parametrize("blurring", [False, True])
def test_a_callback_stops_mean_shift_after_a_step(blobs, blurring):
    tree = TaskTree(stop_at="step", stop_after=2)
    ms = AttentionMeanShift(bandwidth=2.0, blurring=blurring, max_iter=50)
    ms.set_callbacks(tree).fit(blobs)
    assert ms.stopped_by_callback_ and ms.n_iter_ == 2 and tree.count("step", 1) == 2
    converged = AttentionMeanShift(bandwidth=2.0, blurring=blurring, max_iter=50).fit(blobs)
    assert not converged.stopped_by_callback_ and converged.n_iter_ > 2
    # usable: the modes merged from where the moving seeds (points) stopped
    assert ms.predict(blobs).shape == (blobs.shape[0],)
    assert np.isfinite(ms.cluster_centers_).all()


def test_scoring_monitor_scores_each_epoch_of_the_network(data):
    X, y = data
    monitor = callback.ScoringMonitor(scoring="accuracy")
    est = AttentionNetworkClassifier(max_iter=3, n_iter_no_change=100, random_state=0,
                                     width=8).set_callbacks(monitor)
    with pytest.warns(ConvergenceWarning):
        est.fit(X, y)
    epochs, fit = _epoch_and_fit_accuracies(monitor)
    assert len(epochs) == est.n_iter_ == 3
    assert epochs[-1] == pytest.approx(fit[0]) == pytest.approx(est.score(X, y))


class ThreadsSeen(Recorder):
    """Records torch's thread count each task's hooks see."""

    def setup(self, estimator, context):
        pass

    def teardown(self, estimator, context):
        pass

    def on_fit_task_begin(self, estimator, context):
        self.events.append((context.task_name, torch.get_num_threads()))

    def on_fit_task_end(self, estimator, context):
        self.events.append((context.task_name, torch.get_num_threads()))


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("name", sorted(CHEAP))
def test_hooks_run_on_the_callers_threads(data, name):
    # a fit of small steps (or small k-means runs) runs its loop on one thread; the hooks (a
    # ScoringMonitor's scoring) ran there too, unlike a large fit's
    X, y = data
    seen = ThreadsSeen()
    with threadpool_limits(2, user_api="openmp"):
        threads = torch.get_num_threads()
        cheap(name).set_callbacks(seen).fit(X, y)
    assert threads == 2 and seen.events
    assert {count for _, count in seen.events} == {threads}
