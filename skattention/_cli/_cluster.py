"""``skattention cluster``: AttentionKMeans next to scikit-learn's KMeans."""

import time

import numpy as np

from ._common import CLIError, check_device, describe, progress
from ._data import labels, load_data, scaled
from ._output import emit, save_figure


def cluster(args, fig):
    """Run ``skattention cluster``; returns the exit status."""
    X, y, dataset = load_data(args)
    target = labels(y)
    n_clusters = args.n_clusters
    if n_clusters is None:
        n_clusters = np.unique(target).size if target is not None else 8
    if not 1 <= n_clusters <= X.shape[0]:
        raise CLIError(
            f"--n-clusters must be between 1 and the {X.shape[0]} samples, got {n_clusters}"
            + ("" if args.n_clusters is not None else
               " (its default: the target's classes, or 8 without a target)")
        )
    check_device(args)
    from sklearn.cluster import KMeans

    from ..cluster import AttentionKMeans

    Xs = scaled(X, args.scale)
    scored = target is not None
    settings = {"n_clusters": int(n_clusters), "scaled": args.scale,
                "scored_against_target": scored}
    results, fitted = [], {}
    for name, model in [
        ("AttentionKMeans", AttentionKMeans(n_clusters, device=args.device, random_state=0)),
        ("KMeans", KMeans(n_clusters, random_state=0)),
    ]:
        results.append(_fit(args, name, model, Xs, target))
        fitted[name] = model
    if fig is not None:
        _plot_clusters(fig, Xs, fitted["AttentionKMeans"], describe(dataset), results[0])
        save_figure(fig, args.plot)
    return emit(args, dataset, settings, results, _table(args, dataset, n_clusters, results))


def _fit(args, name, model, X, target):
    """Fit ``model``; its row: time and inertia, ARI and NMI against ``target`` if given."""
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    progress(args, f"fitting {name}")
    start = time.perf_counter()
    try:
        model.fit(X)
    except ValueError as exc:
        raise CLIError(f"{name}: {str(exc).splitlines()[0]}") from None
    row = {"model": name, "time_s": time.perf_counter() - start,
           "inertia": float(model.inertia_)}
    progress(args, f"{name} done in {row['time_s']:.2f} s")
    if target is not None:
        row["ari"] = float(adjusted_rand_score(target, model.labels_))
        row["nmi"] = float(normalized_mutual_info_score(target, model.labels_))
    return row


def _table(args, dataset, n_clusters, results):
    scored = "ari" in results[0]
    lines = [f"dataset: {describe(dataset)}; {n_clusters} clusters"
             f"{', features standardised' if args.scale else ''}"
             f"{'; scored against the target' if scored else ''}"]
    header = f"{'model':<16} {'inertia':>14} {'time s':>8}" + (
        f" {'ARI':>7} {'NMI':>7}" if scored else ""
    )
    lines += [header, "-" * len(header)]
    for r in results:
        lines.append(f"{r['model']:<16} {r['inertia']:>14.6g} {r['time_s']:>8.3f}"
                     + (f" {r['ari']:>7.4f} {r['nmi']:>7.4f}" if scored else ""))
    return lines


def _plot_clusters(fig, X, model, dataset, row):
    from ..plotting import EmbeddingDisplay

    if X.shape[1] == 1:
        Z, centers, axes = (
            np.c_[X, np.zeros(len(X))],
            np.c_[model.cluster_centers_, np.zeros(len(model.cluster_centers_))],
            ("feature 1", ""),
        )
    elif X.shape[1] == 2:
        Z, centers, axes = X, model.cluster_centers_, ("feature 1", "feature 2")
    else:
        from sklearn.decomposition import PCA

        pca = PCA(n_components=2).fit(X)
        Z, centers = pca.transform(X), pca.transform(model.cluster_centers_)
        axes = ("principal component 1", "principal component 2")
    score = f"; ARI {row['ari']:.3f}" if "ari" in row else ""
    display = EmbeddingDisplay(Z, model.labels_, xlabel=axes[0], ylabel=axes[1]).plot(
        ax=fig.add_subplot(),
        s=6,
        title=f"AttentionKMeans, {len(centers)} clusters{score}\n{dataset}",
    )
    display.legend_.set_title("cluster")
    display.ax_.scatter(
        centers[:, 0], centers[:, 1], marker="X", s=120, c="black", label="centroids"
    )
