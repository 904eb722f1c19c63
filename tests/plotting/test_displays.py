"""The displays draw what the estimators computed (checked on the artists, not on pixels)."""

import sys
import warnings

import numpy as np
import pytest
from sklearn.datasets import make_blobs

mpl = pytest.importorskip("matplotlib")
mpl.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from skattention import (  # noqa: E402
    AttentionDiffusionEmbedding,
    AttentionKMeans,
    MetricAttentionClassifier,
    MetricAttentionRegressor,
)
from skattention.manifold import spectral_cluster_count  # noqa: E402
from skattention.plotting import (  # noqa: E402
    AttentionWeightsDisplay,
    DiffusionSpectrumDisplay,
    EmbeddingDisplay,
    TrainingCurveDisplay,
)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def blobs():
    return make_blobs(90, centers=[[0, 0], [10, 0], [0, 10]], random_state=0)


@pytest.fixture(scope="module")
def learned(blobs):
    X, y = blobs
    return MetricAttentionClassifier(
        "linear", max_iter=6, n_iter_no_change=100, random_state=0, device="cpu"
    ).fit(X, y)


def test_attention_weights_2d_points_sized_and_coloured_by_weight(blobs):
    X, y = blobs
    clf = MetricAttentionClassifier("euclidean", device="cpu").fit(X, y)
    query = np.array([0.5, 0.5])
    disp = AttentionWeightsDisplay.from_estimator(clf, X, query, n_weights=7)
    weights, indices = clf.attention_weights(query[None], n_weights=7)
    assert isinstance(disp, AttentionWeightsDisplay)
    assert disp.ax_.figure is disp.figure_
    assert len(disp.background_.get_offsets()) == X.shape[0]
    shown = np.asarray(disp.scatter_.get_offsets())
    assert shown.shape == (7, 2)
    colours, sizes = disp.scatter_.get_array(), disp.scatter_.get_sizes()
    # drawn smallest weight first, so the largest sits on top; sizes follow the weights
    assert np.all(np.diff(colours) >= 0) and np.all(np.diff(sizes) >= 0)
    np.testing.assert_allclose(np.sort(colours), np.sort(weights[0]))
    np.testing.assert_allclose(shown[-1], X[indices[0, 0]])  # the top weight is drawn last
    np.testing.assert_allclose(disp.query_.get_offsets()[0], query)
    assert sizes[-1] == pytest.approx(300.0)


def test_attention_weights_high_dimension_uses_pca(learned):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 5))
    y = (X[:, 0] > 0).astype(int)
    reg = MetricAttentionRegressor(
        "euclidean", n_neighbors=4, temperature=np.inf, device="cpu"
    ).fit(X, y.astype(float))
    disp = AttentionWeightsDisplay.from_estimator(reg, X, X[3] + 0.01)
    assert disp.ax_.get_xlabel() == "principal component 1"
    np.testing.assert_allclose(disp.scatter_.get_array(), 0.25)  # k-NN: uniform weights on 4 points
    assert len(disp.scatter_.get_offsets()) == 4
    with pytest.raises(ValueError, match="fitted on 60"):
        AttentionWeightsDisplay.from_estimator(reg, X[:10], X[0])
    with pytest.raises(ValueError, match="single point"):
        AttentionWeightsDisplay.from_estimator(reg, X, X[:2])


def test_training_curve_lines_equal_the_recorded_curves(learned):
    disp = TrainingCurveDisplay.from_estimator(learned)
    x, loss = disp.loss_line_.get_data()
    np.testing.assert_array_equal(loss, learned.loss_curve_)
    np.testing.assert_array_equal(x, np.arange(1, len(learned.loss_curve_) + 1))
    np.testing.assert_array_equal(
        disp.validation_loss_line_.get_ydata(), learned.validation_loss_curve_
    )
    np.testing.assert_array_equal(
        disp.validation_score_line_.get_ydata(), learned.validation_scores_
    )
    assert disp.ax_score_.get_ylabel() == "validation accuracy"
    best = np.argmin(learned.validation_loss_curve_) + 1
    assert disp.best_epoch_line_.get_xdata()[0] == best


def test_training_curve_without_validation_and_euclidean_error(blobs):
    X, y = blobs
    clf = MetricAttentionClassifier(
        "linear", max_iter=3, early_stopping=False, random_state=0, device="cpu"
    ).fit(X, y)
    disp = TrainingCurveDisplay.from_estimator(clf)
    assert disp.validation_loss_line_ is None and disp.ax_score_ is None
    assert len(disp.loss_line_.get_ydata()) == clf.n_iter_
    with pytest.raises(ValueError, match="euclidean"):
        TrainingCurveDisplay.from_estimator(
            MetricAttentionClassifier("euclidean", device="cpu").fit(X, y)
        )


def test_spectrum_from_data_highlights_the_cluster_count(blobs):
    X, _ = blobs
    count, eigenvalues = spectral_cluster_count(
        X, max_clusters=8, return_eigenvalues=True, random_state=0
    )
    assert count == 3
    disp = DiffusionSpectrumDisplay.from_data(X, max_clusters=8, random_state=0)
    assert disp.n_clusters_ == count == len(disp.near_zero_.get_offsets())
    assert len(disp.rest_.get_offsets()) == 8 - count
    np.testing.assert_allclose(
        np.sort(np.r_[disp.near_zero_.get_offsets()[:, 1], disp.rest_.get_offsets()[:, 1]]),
        eigenvalues,
    )
    assert "3 clusters" in disp.ax_.get_title()
    assert disp.threshold_line_.get_ydata()[0] == pytest.approx(1e-3)


def test_spectrum_from_estimator_adds_the_trivial_eigenvalue(blobs):
    X, _ = blobs
    emb = AttentionDiffusionEmbedding(n_components=4, alpha=0.0, random_state=0).fit(X)
    disp = DiffusionSpectrumDisplay.from_estimator(emb, threshold=1e-3)
    values = np.sort(np.r_[disp.near_zero_.get_offsets()[:, 1], disp.rest_.get_offsets()[:, 1]])
    np.testing.assert_allclose(values, np.sort(np.r_[0.0, 1.0 - emb.eigenvalues_]))
    assert disp.n_clusters_ == int(np.sum(values < 1e-3)) == 3


def test_embedding_display_colours_by_label(blobs):
    X, y = blobs
    labels = np.array(["a", "b", "c"])[y]
    emb = AttentionDiffusionEmbedding(n_components=2, random_state=0).fit(X)
    fig, ax = plt.subplots()
    disp = EmbeddingDisplay.from_estimator(emb, X, labels, ax=ax)
    assert disp.ax_ is ax
    np.testing.assert_allclose(disp.scatter_.get_offsets(), emb.embedding_, atol=1e-8)
    np.testing.assert_array_equal(disp.classes_[disp.scatter_.get_array().astype(int)], labels)
    assert [t.get_text() for t in disp.legend_.get_texts()] == ["a", "b", "c"]
    # continuous target: a colour bar instead of a legend
    disp = EmbeddingDisplay(emb.embedding_, X[:, 0]).plot()
    assert disp.legend_ is None and disp.colorbar_ is not None and disp.classes_ is None
    with pytest.raises(ValueError, match="needs at least 4"):
        EmbeddingDisplay.from_estimator(emb, X, components=(0, 3))
    for components in [(-1, 0), (0, 1, 2), (0.0, 1)]:  # (mislabelled, an unpacking error)
        with pytest.raises(ValueError, match="pair of non-negative column indices"):
            EmbeddingDisplay.from_estimator(emb, X, components=components)


def test_embedding_display_gives_each_of_many_classes_its_own_colour():
    # tab20 alone drew every class from the 20th on in its last colour
    rng = np.random.default_rng(0)
    disp = EmbeddingDisplay(rng.normal(size=(250, 2)), np.arange(250) % 25).plot()
    colours = {tuple(np.round(h.get_facecolor()[0], 6)) if hasattr(h, "get_facecolor")
               else tuple(np.round(h.get_markerfacecolor(), 6))
               for h in disp.legend_.legend_handles}
    assert len(colours) == 25
    plt.close("all")


def test_displays_name_the_estimator_they_take(blobs):
    # a fitted classifier was "not fitted yet"; k-means was told euclidean learns nothing
    X, y = blobs
    clf = MetricAttentionClassifier("euclidean", device="cpu").fit(X, y)
    with pytest.raises(TypeError, match="takes a fitted AttentionDiffusionEmbedding"):
        DiffusionSpectrumDisplay.from_estimator(clf)
    with pytest.raises(TypeError, match="AttentionKMeans has no training curve"):
        TrainingCurveDisplay.from_estimator(AttentionKMeans(3, random_state=0).fit(X))


def test_import_without_matplotlib_and_clear_error(monkeypatch):
    # a fresh import of skattention.plotting with matplotlib unimportable: importing works,
    # drawing raises an ImportError naming the extra
    import skattention

    monkeypatch.setattr(skattention, "plotting", skattention.plotting)  # restored afterwards
    for name in [m for m in sys.modules if m.startswith("skattention.plotting")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    import skattention.plotting as fresh

    assert fresh.EmbeddingDisplay is not EmbeddingDisplay
    with pytest.raises(ImportError, match=r"skattention\[plot\]"):
        fresh.EmbeddingDisplay([[0.0, 1.0]]).plot()


@pytest.mark.parametrize("pipeline", [False, True])
def test_attention_weights_of_a_model_fitted_on_a_dataframe_warn_nothing(blobs, pipeline):
    # the query reached the estimator without its column names: scikit-learn's "X does not
    # have valid feature names" warning on every call
    pd = pytest.importorskip("pandas")
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = blobs
    frame = pd.DataFrame(X, columns=["a", "b"])
    clf = MetricAttentionClassifier("euclidean", temperature=0.5)
    model = (make_pipeline(StandardScaler(), clf) if pipeline else clf).fit(frame, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        display = AttentionWeightsDisplay.from_estimator(model, frame, frame.iloc[3], n_weights=4)
    assert display.indices[0] == 3


def test_attention_weights_through_a_pipeline(blobs):
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = blobs
    pipe = make_pipeline(
        StandardScaler(), MetricAttentionClassifier("euclidean", device="cpu")
    ).fit(X, y)
    disp = AttentionWeightsDisplay.from_estimator(pipe, X, X[0], n_weights=5)
    weights, indices = pipe[-1].attention_weights(pipe[0].transform(X[:1]), n_weights=5)
    np.testing.assert_allclose(disp.scatter_.get_array(), weights[0][::-1])  # drawn smallest first
    np.testing.assert_allclose(
        disp.scatter_.get_offsets(), X[indices[0][::-1]]
    )  # in the input space


@pytest.mark.parametrize(
    "display",
    [AttentionWeightsDisplay, DiffusionSpectrumDisplay, EmbeddingDisplay, TrainingCurveDisplay],
)
def test_every_way_to_draw_has_a_doctested_example(display):
    import inspect

    methods = [m for m in ("plot", "from_estimator", "from_data") if hasattr(display, m)]
    assert "plot" in methods and "from_estimator" in methods
    for name in methods:
        doc = inspect.getdoc(getattr(display, name))
        assert "Examples\n--------\n>>> import matplotlib" in doc, f"{display.__name__}.{name}"
