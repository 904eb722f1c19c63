"""
The attention weights behind one prediction
===========================================

A k-NN classifier explains a prediction by its ``k`` neighbours, each with weight ``1/k``.
:class:`~skattention.MetricAttentionClassifier` predicts with attention weights
``a_j(x) = softmax_j(-f(x, x_j) / T)`` over *all* training points, and
``attention_weights`` returns the largest of them, the analogue of ``kneighbors``.
:class:`~skattention.plotting.AttentionWeightsDisplay` draws them.

1. Two moons with the plain Euclidean metric: the weights decay with distance, so the attended
   points are the nearest neighbours, but with unequal, smoothly decaying weights.
2. Handwritten digits with a *learned* linear metric ``||W x - W y||^2``: the digits a query
   attends to need no longer be its Euclidean nearest neighbours.
"""

# %%
# Two moons: attention weights vs the 10 nearest neighbours
# ---------------------------------------------------------
import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import load_digits, make_moons
from sklearn.model_selection import train_test_split
from sklearn.neighbors import NearestNeighbors

from skattention import MetricAttentionClassifier
from skattention.plotting import AttentionWeightsDisplay

X, y = make_moons(n_samples=300, noise=0.25, random_state=0)
clf = MetricAttentionClassifier("euclidean", device="cpu").fit(X, y)
query = np.array([0.5, 0.25])  # between the two moons

fig, ax = plt.subplots(figsize=(7, 5))
display = AttentionWeightsDisplay.from_estimator(clf, X, query, n_weights=30, ax=ax)
_, knn = NearestNeighbors(n_neighbors=10).fit(X).kneighbors(query[None])
ax.scatter(X[knn[0], 0], X[knn[0], 1], s=160, facecolors="none", edgecolors="red", lw=1.2,
           label="10 nearest neighbours")
ax.legend(loc="lower left", fontsize="small")
proba = clf.predict_proba(query[None])[0]
ax.set_title(f"moons, Euclidean attention (T={clf.temperature_:.3g}): p(class 1) = {proba[1]:.2f}")

all_weights, all_indices = clf.attention_weights(query[None], n_weights=len(X))
mass_on_knn = all_weights[0][np.isin(all_indices[0], knn[0])].sum()
print(
    f"moons: T={clf.temperature_:.3g}, top weight {display.weights[0]:.3f}, the 10 nearest "
    f"neighbours carry {mass_on_knn:.3f} of the attention; attention p(class 1) = {proba[1]:.2f}, "
    f"10-NN vote {y[knn[0]].mean():.2f}"
)

# %%
# With the Euclidean metric the largest weights fall on exactly the nearest points (the weight
# is a decreasing function of the distance), but they are not equal: the attention mass is
# spread over more or fewer points according to the temperature, which was chosen by
# leave-one-out likelihood.
#
# Digits: a learned metric
# ------------------------
# The classifier learns a linear map ``W`` (64 -> 64) and the temperature from the training
# labels. We pick, deterministically, the first test digit whose 10 Euclidean nearest training
# digits do not all share one label (an ambiguous query), and compare the training digits it
# attends to with its Euclidean nearest neighbours.
digits, labels = load_digits(return_X_y=True)
X_train, X_test, y_train, y_test = train_test_split(digits, labels, test_size=0.25, stratify=labels,
                                                    random_state=0)
clf = MetricAttentionClassifier("linear", random_state=0, device="cpu").fit(X_train, y_train)
nn = NearestNeighbors(n_neighbors=10).fit(X_train)
_, neighbours = nn.kneighbors(X_test)
ambiguous = np.flatnonzero([len(np.unique(y_train[row])) > 1 for row in neighbours])
q = ambiguous[0]
print(f"digits: test accuracy {clf.score(X_test, y_test):.3f} (learned linear metric, "
      f"T={clf.temperature_:.3g}); query = test digit {q} (true label {y_test[q]}), "
      f"{len(ambiguous)} of {len(X_test)} test digits are ambiguous for 10-NN")

fig = plt.figure(figsize=(11, 8))
top = fig.add_gridspec(3, 1, height_ratios=[2.4, 1, 1], hspace=0.45)
ax = fig.add_subplot(top[0])
display = AttentionWeightsDisplay.from_estimator(clf, X_train, X_test[q], n_weights=8, ax=ax)
ax.set_title(f"test digit {q} (label {y_test[q]}), predicted {clf.predict(X_test[q:q + 1])[0]}: "
             "its 8 largest attention weights (PCA plane)", fontsize=10)
# the figure is completed in the next cell
# sphinx_gallery_defer_figures

# %%
# The same query as images: the 8 training digits with the largest attention weights, and the
# 8 Euclidean nearest neighbours (what ``KNeighborsClassifier`` would vote with).
# Training digits that are close in pixel space but of another class can get almost no weight
# under the learned metric; the printed line says how many of the two sets coincide here.
inner = top[1].subgridspec(1, 9)
inner_knn = top[2].subgridspec(1, 9)
image_ax = fig.add_subplot(inner[0])
image_ax.imshow(X_test[q].reshape(8, 8), cmap="gray_r")
image_ax.set_title("query", fontsize=9)
image_ax.axis("off")
fig.add_subplot(inner_knn[0]).axis("off")
for k in range(8):
    i, w = display.indices[k], display.weights[k]
    a = fig.add_subplot(inner[k + 1])
    a.imshow(X_train[i].reshape(8, 8), cmap="gray_r")
    a.set_title(f"{y_train[i]}: w={w:.2f}", fontsize=9)
    a.axis("off")
    j = neighbours[q, k]
    b = fig.add_subplot(inner_knn[k + 1])
    b.imshow(X_train[j].reshape(8, 8), cmap="gray_r")
    b.set_title(f"{y_train[j]}: NN {k + 1}", fontsize=9)
    b.axis("off")
fig.text(0.01, 0.34, "attention\n(learned metric)", fontsize=9)
fig.text(0.01, 0.12, "Euclidean\nnearest\nneighbours", fontsize=9)

shared = len(np.intersect1d(display.indices[:8], neighbours[q, :8]))
att_votes = np.bincount(y_train[display.indices], weights=display.weights, minlength=10)
print(f"query {q}: top-8 attended labels {y_train[display.indices].tolist()} "
      f"(weights sum {display.weights.sum():.3f}, heaviest label {att_votes.argmax()}); "
      f"8 nearest neighbours' labels {y_train[neighbours[q, :8]].tolist()}; {shared}/8 in common")

# %%
# Over the whole test set: how many of the 10 training points with the largest attention
# weights are also among the 10 Euclidean nearest neighbours? With a learned metric the answer
# is "some": the metric re-ranks the neighbours.
_, att_idx = clf.attention_weights(X_test, n_weights=10)
overlap = np.mean([len(np.intersect1d(a, b)) for a, b in zip(att_idx, neighbours)])
print(f"digits: on average {overlap:.1f} of the 10 most attended training digits are among the "
      f"10 Euclidean nearest neighbours")

plt.show()
