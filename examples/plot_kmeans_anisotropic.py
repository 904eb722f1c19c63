"""
Attention k-means and mean shift on anisotropic blobs
=====================================================

:class:`~skattention.cluster.AttentionKMeans` writes k-means as alternating attention: points
attend to centroids (soft assignments at temperature ``T``), centroids attend to points
(weighted means). ``temperature=0`` is Lloyd's algorithm exactly; the default
``temperature="auto"`` anneals ``T`` down from the critical temperature (deterministic
annealing) and finishes with exact Lloyd steps.
:class:`~skattention.cluster.AttentionMeanShift` is mean shift as repeated attention of the modes
over the data.

The data are scikit-learn's anisotropic blobs (the k-means assumptions demo): three Gaussian
blobs sheared by ``[[0.6, -0.6], [-0.4, 0.8]]``. The adjusted Rand index (ARI, 1 = the true
blobs) is in each title.

**What to expect, honestly**: attention k-means minimises the *same* Euclidean inertia as
k-means, so it makes the same mistake on sheared clusters; so does mean shift with a round
kernel. Attention changes how the optimum is searched for, not which clustering is optimal. The
fix for anisotropy is the metric (here a whitening of the data), and what annealing buys is
robustness to the initialisation, shown in the last panel on a grid of 25 blobs.
"""

# %%
# Anisotropic blobs
# -----------------
import matplotlib.pyplot as plt
import numpy as np
from sklearn.cluster import KMeans, MeanShift
from sklearn.datasets import make_blobs
from sklearn.decomposition import PCA
from sklearn.metrics import adjusted_rand_score

from skattention.cluster import AttentionKMeans, AttentionMeanShift

X, y = make_blobs(n_samples=1500, random_state=170)
X = X @ np.array([[0.6, -0.6], [-0.4, 0.8]])
X_white = PCA(whiten=True).fit_transform(X)

models = {
    "KMeans": (KMeans(n_clusters=3, random_state=0), X),
    "AttentionKMeans (annealing)": (AttentionKMeans(n_clusters=3, random_state=0, device="cpu"), X),
    "AttentionKMeans on whitened data": (
        AttentionKMeans(n_clusters=3, random_state=0, device="cpu"),
        X_white,
    ),
    "MeanShift (flat kernel)": (MeanShift(bin_seeding=True), X),
    "AttentionMeanShift (Gaussian)": (AttentionMeanShift(bin_seeding=True, device="cpu"), X),
}
fig, axes = plt.subplots(2, 3, figsize=(14, 8.5))
labels = {}
for ax, (name, (model, data)) in zip(axes.ravel(), models.items()):
    labels[name] = model.fit_predict(data)
    ari = adjusted_rand_score(y, labels[name])
    n_found = len(np.unique(labels[name]))
    # every panel is drawn in the original coordinates, whatever space the model clustered in
    ax.scatter(X[:, 0], X[:, 1], c=labels[name], s=5, cmap="viridis")
    ax.set_title(f"{name}\nARI {ari:.3f}, {n_found} clusters", fontsize=10)
    print(f"{name:<34s} ARI {ari:.3f} ({n_found} clusters)")

# Lloyd's algorithm written as attention (temperature=0) is scikit-learn's KMeans step for step
lloyd = AttentionKMeans(n_clusters=3, temperature=0, random_state=0, device="cpu").fit_predict(X)
print(f"AttentionKMeans(temperature=0) vs KMeans, same seed: ARI between their labels "
      f"{adjusted_rand_score(labels['KMeans'], lloyd):.3f}")
# the figure is completed in the next cell
# sphinx_gallery_defer_figures

# %%
# Where annealing matters: the initialisation
# -------------------------------------------
# On 25 well-separated blobs on a 5 x 5 grid, a single k-means++ run often merges two blobs and
# splits another (a local minimum of the inertia). Deterministic annealing starts with every
# centroid at the mean and lets them split as the temperature falls, so the seed matters less.
# The last panel shows the final inertia for 10 seeds (lower is better; ``n_init=1`` for both).
grid = np.array([[i, j] for i in range(5) for j in range(5)]) * 4.0
X_grid, _ = make_blobs(n_samples=2500, centers=grid, cluster_std=1.0, random_state=0)
seeds = np.arange(10)
inertia_km = [KMeans(25, n_init=1, random_state=s).fit(X_grid).inertia_ for s in seeds]
inertia_att = [
    AttentionKMeans(25, random_state=s, device="cpu").fit(X_grid).inertia_ for s in seeds
]
best = min(min(inertia_km), min(inertia_att))
reached_km = sum(i <= best * 1.001 for i in inertia_km)
reached_att = sum(i <= best * 1.001 for i in inertia_att)
ax = axes[1, 2]
ax.plot(seeds - 0.1, inertia_km, "o", label=f"KMeans(n_init=1): best in {reached_km}/10")
ax.plot(seeds + 0.1, inertia_att, "s", label=f"AttentionKMeans: best in {reached_att}/10")
ax.axhline(best, color="grey", lw=0.8, ls="--")
ax.set_xlabel("random_state")
ax.set_ylabel("inertia")
ax.set_title("25 blobs on a grid: final inertia per seed", fontsize=10)
ax.legend(fontsize=8)
print(f"25 blobs, 10 seeds: lowest inertia {best:.1f} reached (within 0.1%) by KMeans(n_init=1) "
      f"{reached_km}/10, AttentionKMeans {reached_att}/10; median inertia "
      f"{np.median(inertia_km):.1f} vs {np.median(inertia_att):.1f}")
fig.tight_layout()

# %%
# Reading the figure
# ------------------
# On the sheared blobs, KMeans and AttentionKMeans find the same partition, with cuts
# perpendicular to the lines between centroids; mean shift with either kernel merges two of
# the blobs. Whitening the data (one global linear map) makes the blobs nearly round and the
# same AttentionKMeans then recovers them. On the grid, annealing reaches the lowest inertia
# more often than a single k-means++ start, but not always: it is a heuristic, and
# ``n_init > 1`` remains the usual remedy for both.

plt.show()
