"""
Diffusion embedding of the S-curve and of digits, with out-of-sample points
===========================================================================

AttentionDiffusionEmbedding uses the attention matrix of the training points as a diffusion
operator (diffusion maps). Unlike scikit-learn's SpectralEmbedding it embeds *new* points:
``transform`` is attention from the new points to the training points (the Nyström extension).

Top: the S-curve (3-D) unrolled by both, coloured by the position along the curve.
Bottom: handwritten digits (64-D); the attention embedding also places 300 held-out digits
(crosses) that it never saw during ``fit``.

Usage: ``python examples/plot_diffusion_embedding.py [OUTPUT.png]`` (needs matplotlib, the
``plot`` extra); with ``OUTPUT.png`` the figure is also written there.
"""

import sys
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits, make_s_curve  # noqa: E402
from sklearn.manifold import SpectralEmbedding  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from sklearn.neighbors import KNeighborsClassifier  # noqa: E402

from skattention.manifold import AttentionDiffusionEmbedding  # noqa: E402

output = sys.argv[1] if len(sys.argv) > 1 else None  # a path: also write the figure there
fig, axes = plt.subplots(2, 2, figsize=(10, 9))

# S-curve: both on the same 10-nearest-neighbour graph size
X, t = make_s_curve(2000, random_state=0)
start = time.perf_counter()
ours = AttentionDiffusionEmbedding(n_components=2, n_neighbors=10, random_state=0).fit_transform(X)
t_ours = time.perf_counter() - start
start = time.perf_counter()
theirs = SpectralEmbedding(n_components=2, n_neighbors=10, random_state=0).fit_transform(X)
t_theirs = time.perf_counter() - start
for ax, emb, title in [
    (axes[0, 0], ours, "AttentionDiffusionEmbedding"),
    (axes[0, 1], theirs, "SpectralEmbedding"),
]:
    ax.scatter(emb[:, 0], emb[:, 1], c=t, s=4, cmap="viridis")
    ax.set_title(f"S-curve: {title}")
print(f"S-curve, n=2000: |corr(first coordinate, position)| attention "
      f"{abs(np.corrcoef(ours[:, 0], t)[0, 1]):.3f} ({t_ours:.2f} s), spectral "
      f"{abs(np.corrcoef(theirs[:, 0], t)[0, 1]):.3f} ({t_theirs:.2f} s)")

# Digits: embed 1,497 training digits, then place 300 held-out ones by attention
digits, labels = load_digits(return_X_y=True)
X_train, X_test, y_train, y_test = train_test_split(
    digits, labels, test_size=300, random_state=0, stratify=labels
)
emb = AttentionDiffusionEmbedding(n_components=2, alpha=0.5, random_state=0).fit(X_train)
train_2d, test_2d = emb.embedding_, emb.transform(X_test)
spectral_2d = SpectralEmbedding(n_components=2, random_state=0).fit_transform(X_train)
ax = axes[1, 0]
ax.scatter(train_2d[:, 0], train_2d[:, 1], c=y_train, s=4, cmap="tab10", vmin=0, vmax=9)
ax.scatter(test_2d[:, 0], test_2d[:, 1], c=y_test, s=25, marker="x", cmap="tab10", vmin=0, vmax=9)
ax.set_title("digits: attention diffusion (x: held out)")
axes[1, 1].scatter(
    spectral_2d[:, 0], spectral_2d[:, 1], c=y_train, s=4, cmap="tab10", vmin=0, vmax=9
)
axes[1, 1].set_title("digits: SpectralEmbedding (training only)")
# held-out digits land among training digits of their class
emb10 = AttentionDiffusionEmbedding(n_components=10, alpha=0.5, random_state=0).fit(X_train)
knn = KNeighborsClassifier(5).fit(emb10.embedding_, y_train)
print(f"digits: 5-NN accuracy of held-out digits placed by transform (10 components): "
      f"{knn.score(emb10.transform(X_test), y_test):.3f}")

fig.tight_layout()
if output:
    fig.savefig(output, dpi=80)
    print(f"figure written to {output}")
plt.show()
