"""Warnings point at the user's line, not at the library's wrappers (utils/_warnings.py)."""

import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from skattention import MetricAttentionClassifier
from skattention.cluster import AttentionKMeans
from skattention.manifold import AttentionDiffusionEmbedding
from skattention.nn import AttentionNetworkClassifier

X = np.random.RandomState(0).randn(40, 2)
y = (X[:, 0] > 0).astype(int)
DUPLICATES = np.ones((10, 2))


def _warning_site(category, call):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    sites = [w.filename for w in caught if issubclass(w.category, category)]
    assert sites, f"no {category.__name__}"
    return sites[0]


@pytest.mark.parametrize(
    "category, call",
    [
        (ConvergenceWarning, lambda: AttentionKMeans(3, random_state=0).fit(DUPLICATES)),
        (ConvergenceWarning, lambda: AttentionKMeans(3, random_state=0).fit_predict(DUPLICATES)),
        (ConvergenceWarning, lambda: make_pipeline(
            StandardScaler(), AttentionKMeans(3, random_state=0)).fit(DUPLICATES)),
        (RuntimeWarning, lambda: AttentionKMeans(2, init=X[:2], n_init=3).fit(X)),
        (UserWarning, lambda: AttentionDiffusionEmbedding(epsilon=1e-6, random_state=0).fit(X)),
        (ConvergenceWarning, lambda: AttentionNetworkClassifier(max_iter=2).fit(X, y)),
        (ConvergenceWarning, lambda: MetricAttentionClassifier("mlp", max_iter=2).fit(X, y)),
        (UserWarning, lambda: MetricAttentionClassifier("euclidean").fit(X, y[:, None])),
    ],
    ids=["kmeans-fit", "kmeans-fit_predict", "kmeans-pipeline", "kmeans-n_init",
         "diffusion-not-connected", "network-max_iter", "learned-max_iter", "column-y"],
)
def test_warning_points_at_the_callers_line(category, call):
    assert _warning_site(category, call) == __file__
