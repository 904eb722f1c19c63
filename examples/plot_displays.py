"""
The four displays of skattention.plotting on one figure
=======================================================

- AttentionWeightsDisplay: the training points one query attends to (a learned linear metric on
  the wine data, 13 features, drawn on the first two principal components).
- TrainingCurveDisplay: that model's training loss, validation loss and accuracy per epoch.
- DiffusionSpectrumDisplay: the smallest eigenvalues of I - S on four blobs; four near zero.
- EmbeddingDisplay: the digits embedded by AttentionDiffusionEmbedding, coloured by digit.

Usage: ``python examples/plot_displays.py [OUTPUT.png]`` (needs matplotlib, the
``plot`` extra); with ``OUTPUT.png`` the figure is also written there.
"""

import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from sklearn.datasets import load_digits, load_wine, make_blobs  # noqa: E402

from skattention import AttentionDiffusionEmbedding, MetricAttentionClassifier  # noqa: E402
from skattention.plotting import (  # noqa: E402
    AttentionWeightsDisplay,
    DiffusionSpectrumDisplay,
    EmbeddingDisplay,
    TrainingCurveDisplay,
)

output = sys.argv[1] if len(sys.argv) > 1 else None  # a path: also write the figure there
fig, axes = plt.subplots(2, 2, figsize=(12, 10))

X, y = load_wine(return_X_y=True)
clf = MetricAttentionClassifier("linear", max_iter=15, random_state=0, device="cpu").fit(X, y)
weights = AttentionWeightsDisplay.from_estimator(clf, X, X[0] * 1.02, n_weights=15, ax=axes[0, 0])
TrainingCurveDisplay.from_estimator(clf, ax=axes[0, 1])

blobs, _ = make_blobs(400, centers=[[0, 0], [10, 0], [0, 10], [10, 10]], random_state=0)
spectrum = DiffusionSpectrumDisplay.from_data(blobs, max_clusters=10, random_state=0, ax=axes[1, 0])

digits, labels = load_digits(return_X_y=True)
digits, labels = digits[:500], labels[:500]
emb = AttentionDiffusionEmbedding(n_components=2, alpha=0.5, random_state=0).fit(digits)
EmbeddingDisplay.from_estimator(
    emb, digits, labels, ax=axes[1, 1], s=6, title="digits: attention diffusion embedding"
)

fig.tight_layout()
print(f"wine: top weight {weights.weights.max():.3f} over {len(weights.weights)} points; "
      f"blobs: {spectrum.n_clusters_} near-zero eigenvalues of I - S")
if output:
    fig.savefig(output, dpi=80)
    print(f"figure written to {output}")
plt.show()
