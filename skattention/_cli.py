"""Command line: ``skattention compare``, ``embed`` and ``cluster`` (``python -m skattention``)."""

import argparse
import csv
import json
import sys
import time

import numpy as np

_COMPARE_EXAMPLE = """examples:
  skattention compare                              # scikit-learn's digits, 5-fold CV
  skattention compare --data wine.csv --target quality --cv 10
  skattention compare --data house.csv --target price --task regression --json
  skattention compare --cv 3 --plot scores.png     # also a bar chart of the scores
"""

_EMBED_EXAMPLE = """examples:
  skattention embed --plot digits.png              # digits in 2-D, coloured by digit
  skattention embed --data cells.csv --target type --scale --n-components 3 --json
  skattention embed --data points.csv --n-neighbors 15 --plot emb.png  # all columns are features
"""

_CLUSTER_EXAMPLE = """examples:
  skattention cluster                      # digits, 10 clusters, ARI/NMI against the digit labels
  skattention cluster --data blobs.csv --n-clusters 4 --plot clusters.png
  skattention cluster --data wine.csv --target cultivar --scale --json
"""


class CLIError(Exception):
    """A problem with the user's input: reported in one line, without a traceback."""


def main(argv=None):
    """Entry point of the ``skattention`` console script; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="skattention",
        description="Attention as classical machine learning: compare attention estimators "
        "with their scikit-learn counterparts, embed and cluster data by attention.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    compare = sub.add_parser(
        "compare",
        help="cross-validate attention estimators next to k-NN",
        description="Cross-validate the attention estimators next to KNeighborsClassifier "
        "(or KNeighborsRegressor) and print accuracy (or R^2), fit and predict times.",
        epilog=_COMPARE_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_data_arguments(
        compare, target_help="name of the target column in --data (required with --data)"
    )
    compare.add_argument(
        "--task",
        choices=["auto", "classification", "regression"],
        default="auto",
        help="default: classification unless the target is numeric with many distinct values",
    )
    compare.add_argument(
        "--cv", type=int, default=5, help="number of cross-validation folds (default: 5)"
    )
    compare.add_argument(
        "--no-scale", action="store_true", help="do not standardise the features first"
    )
    _add_output_arguments(compare, "a bar chart of the mean scores (needs matplotlib)")

    embed = sub.add_parser(
        "embed",
        help="diffusion-map embedding by attention (AttentionDiffusionEmbedding)",
        description="Embed the data with AttentionDiffusionEmbedding (the attention matrix as a "
        "diffusion operator) and print the bandwidth, the estimated intrinsic dimension and the "
        "eigenvalues; --plot draws the first two coordinates, coloured by the target if given.",
        epilog=_EMBED_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_data_arguments(
        embed, target_help="optional label column in --data: colours the plot, not used to fit"
    )
    embed.add_argument(
        "--n-components", type=int, default=2, help="number of diffusion coordinates (default: 2)"
    )
    embed.add_argument(
        "--alpha",
        type=float,
        default=1.0,
        help="density normalisation in [0, 1] (default: 1, the Laplace-Beltrami operator)",
    )
    embed.add_argument("--epsilon", default="auto", help="kernel bandwidth, or 'auto' (default)")
    embed.add_argument("--n-neighbors", type=int, default=None,
                       help="sparse k-NN operator with this many neighbours (default: dense)")
    embed.add_argument(
        "--scale",
        action="store_true",
        help="standardise the features first (off by default: "
        "on digits it turns rare pixels into outliers that the diffusion isolates)",
    )
    _add_output_arguments(embed, "a scatter plot of the first two coordinates (needs matplotlib)")

    cluster = sub.add_parser(
        "cluster",
        help="AttentionKMeans next to scikit-learn's KMeans",
        description="Cluster with AttentionKMeans (deterministic annealing) and KMeans and print "
        "inertia and time of each, with the adjusted Rand index and normalised mutual information "
        "against the target when --target (or the default digits) gives one.",
        epilog=_CLUSTER_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_data_arguments(
        cluster, target_help="optional label column in --data: scores the clusters, not used to fit"
    )
    cluster.add_argument("--n-clusters", type=int, default=None,
                         help="number of clusters (default: the number of target classes, else 8)")
    cluster.add_argument("--scale", action="store_true", help="standardise the features first")
    _add_output_arguments(
        cluster, "the AttentionKMeans clusters in 2-D (PCA beyond 2 features; needs matplotlib)"
    )

    args = parser.parse_args(argv)
    try:
        return {"compare": _compare, "embed": _embed, "cluster": _cluster}[args.command](args)
    except CLIError as exc:
        print(f"skattention: error: {exc}", file=sys.stderr)
        return 2


def _add_data_arguments(parser, target_help):
    parser.add_argument(
        "--data",
        metavar="PATH.csv",
        help="CSV file with a header row (default: scikit-learn's digits)",
    )
    parser.add_argument("--target", metavar="COLUMN", help=target_help)
    parser.add_argument("--max-samples", type=int, default=None, metavar="N",
                        help="use a random subset of N samples (seed 0) to go faster")
    parser.add_argument("--device", default="auto", help="'auto', 'cpu' or 'cuda' (default: auto)")


def _add_output_arguments(parser, plot_help):
    parser.add_argument(
        "--json", action="store_true", help="print machine-readable JSON instead of a table"
    )
    parser.add_argument("--plot", metavar="FILE.png", help=f"write {plot_help}")


def _load_data(args, target_required, tabular=False):
    """``X, y, dataset``: digits by default, else the user's CSV; ``y`` is None without --target.

    ``tabular``: a CSV with text columns or empty cells becomes a DataFrame (needs pandas) for
    estimators that encode such columns themselves, instead of an error."""
    if args.max_samples is not None and args.max_samples < 2:
        raise CLIError(f"--max-samples must be at least 2, got {args.max_samples}")
    if args.data is None:
        if args.target is not None:
            raise CLIError("--target needs --data")
        from sklearn.datasets import load_digits

        X, y = load_digits(return_X_y=True)
        name = "digits (scikit-learn"
    else:
        if target_required and args.target is None:
            raise CLIError("--data needs --target COLUMN")
        X, y = _read_csv(args.data, args.target, tabular)
        name = f"{args.data} ("
    if args.max_samples is not None and args.max_samples < X.shape[0]:
        keep = np.sort(np.random.default_rng(0).choice(X.shape[0], args.max_samples, replace=False))
        X = X.iloc[keep] if hasattr(X, "iloc") else X[keep]
        y = None if y is None else y[keep]
    sep = ", " if args.data is None else ""
    return X, y, f"{name}{sep}{X.shape[0]} x {X.shape[1]})"


def _new_figure(args, **kwargs):
    """A matplotlib Figure (no pyplot, so no display is needed), or a one-line error."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise CLIError("--plot needs matplotlib: pip install \"skattention[plot]\"") from None
    return Figure(**kwargs)


def _save_figure(fig, path):
    try:
        fig.savefig(path, dpi=100, bbox_inches="tight")
    except (OSError, ValueError) as exc:
        raise CLIError(f"cannot write {path!r}: {getattr(exc, 'strerror', None) or exc}") from None


def _emit(args, results, lines):
    if args.plot:
        results["plot"] = args.plot
        lines.append(f"figure written to {args.plot}")
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print("\n".join(lines))


# --------------------------------------------------------------------------- compare


def _compare(args):
    if args.cv < 2:
        raise CLIError(f"--cv must be at least 2, got {args.cv}")
    X, y, dataset = _load_data(args, target_required=True, tabular=True)
    task = _task(y, args.task)
    if task == "regression":
        y = y.astype(np.float64)
    fig = _new_figure(args, figsize=(8, 4)) if args.plot else None
    results = _cross_validate(X, y, task, args)
    if args.plot:
        _plot_scores(fig, dataset, results)
        _save_figure(fig, args.plot)
    if args.json:
        out = {"dataset": dataset, "task": task, "results": results}
        if args.plot:
            out["plot"] = args.plot
        print(json.dumps(out, indent=2))
    else:
        _print_table(dataset, task, args.cv, results)
        if args.plot:
            print(f"figure written to {args.plot}")
    return 0


def _plot_scores(fig, dataset, results):
    ax = fig.add_subplot()
    names = [r["model"] for r in results]
    pos = np.arange(len(names))
    ax.barh(
        pos, [r["mean"] for r in results], xerr=[r["std"] for r in results], color="C0", capsize=3
    )
    ax.set_yticks(pos, names)
    ax.invert_yaxis()
    ax.set_xlabel(f"{results[0]['metric']} (mean +- std over folds)")
    ax.set_title(dataset)


def _models(task, device):
    from sklearn.neighbors import KNeighborsClassifier, KNeighborsRegressor

    from .neighbors import MetricAttentionClassifier, MetricAttentionRegressor

    if task == "classification":
        knn, att = KNeighborsClassifier, MetricAttentionClassifier
    else:
        knn, att = KNeighborsRegressor, MetricAttentionRegressor
    return [
        (f"{knn.__name__}(k=5)", knn(n_neighbors=5)),
        (
            "attention euclidean k-NN (k=5, T=inf)",
            att("euclidean", n_neighbors=5, temperature=np.inf, device=device),
        ),
        ("attention euclidean kernel (T=auto)", att("euclidean", device=device)),
        ("attention learned linear (L2)", att("linear", random_state=0, device=device)),
        ("attention learned dot (self-attention)", att("dot", random_state=0, device=device)),
        ("attention learned mlp (default)", att(random_state=0, device=device)),
    ]


def _cross_validate(X, y, task, args):
    from sklearn.model_selection import KFold, StratifiedKFold, cross_validate
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if task == "classification":
        _, counts = np.unique(y, return_counts=True)
        if counts.size < 2:
            raise CLIError("the target has a single class; classification needs at least 2")
        if counts.min() < args.cv:
            raise CLIError(
                f"the smallest class has {counts.min()} samples, fewer than --cv {args.cv} folds"
            )
        cv = StratifiedKFold(args.cv, shuffle=True, random_state=0)
        scoring = "accuracy"
    else:
        cv = KFold(args.cv, shuffle=True, random_state=0)
        scoring = "r2"
    if X.shape[0] < args.cv:
        raise CLIError(f"{X.shape[0]} samples are fewer than --cv {args.cv} folds")
    results = []
    for name, model in _models(task, args.device):
        if hasattr(X, "columns"):  # text or missing cells: a DataFrame
            est = _tabular_pipeline(model, args.no_scale)
        else:
            est = model if args.no_scale else make_pipeline(StandardScaler(), model)
        start = time.perf_counter()
        try:
            cv_res = cross_validate(est, X, y, cv=cv, scoring=scoring, error_score="raise")
        except ValueError as exc:
            raise CLIError(f"{name}: {str(exc).splitlines()[0]}") from None
        results.append({
            "model": name,
            "metric": scoring,
            "mean": float(np.mean(cv_res["test_score"])),
            "std": float(np.std(cv_res["test_score"])),
            "fit_time_s": float(np.mean(cv_res["fit_time"])),
            "predict_time_s": float(np.mean(cv_res["score_time"])),
            "total_time_s": time.perf_counter() - start,
        })
    return results


def _tabular_pipeline(model, no_scale):
    """``model`` on a DataFrame with text columns and missing values: the attention estimators
    take it as is (numbers standardised unless ``no_scale``); k-NN needs imputation and a
    one-hot encoding first."""
    from sklearn.compose import make_column_selector, make_column_transformer
    from sklearn.impute import SimpleImputer
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    numbers, text = make_column_selector(dtype_exclude=object), make_column_selector(
        dtype_include=object)
    scale = [] if no_scale else [StandardScaler()]
    if not hasattr(model, "categorical_features"):  # the k-NN baseline
        return make_pipeline(make_column_transformer(
            (make_pipeline(SimpleImputer(strategy="median"), *scale), numbers),
            (make_pipeline(SimpleImputer(strategy="constant", fill_value="missing"),
                           OneHotEncoder(handle_unknown="ignore")), text),
        ), model)
    if no_scale:
        return model
    scaler = make_column_transformer(  # NaN passes StandardScaler; text columns pass through
        (StandardScaler(), numbers), remainder="passthrough", verbose_feature_names_out=False,
    ).set_output(transform="pandas")
    return make_pipeline(scaler, model)


def _print_table(dataset, task, n_folds, results):
    metric = results[0]["metric"]
    print(
        f"dataset: {dataset}; task: {task}; {n_folds}-fold cross-validation, "
        "features standardised unless --no-scale"
    )
    header = f"{'model':<42} {metric + ' mean':>13} {'std':>7} {'fit s':>8} {'predict s':>10}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r['model']:<42} {r['mean']:>13.4f} {r['std']:>7.4f} {r['fit_time_s']:>8.3f} "
            f"{r['predict_time_s']:>10.3f}"
        )


# --------------------------------------------------------------------------- embed


def _scaled(X, scale):
    if not scale:
        return X
    from sklearn.preprocessing import StandardScaler

    return StandardScaler().fit_transform(X)


def _labels(y):
    """The target as class labels, or None when there is none or it is continuous."""
    if y is None or _task(y, "auto") == "regression":
        return None
    return y


def _embed(args):
    from .manifold import AttentionDiffusionEmbedding

    X, y, dataset = _load_data(args, target_required=False)
    if args.n_components < 1:
        raise CLIError(f"--n-components must be at least 1, got {args.n_components}")
    if args.n_components >= X.shape[0]:
        raise CLIError(
            f"--n-components {args.n_components} must be smaller than the {X.shape[0]} samples"
        )
    if args.plot and args.n_components < 2:
        raise CLIError("--plot needs --n-components 2 or more")
    if not 0.0 <= args.alpha <= 1.0:
        raise CLIError(f"--alpha must be in [0, 1], got {args.alpha}")
    epsilon = args.epsilon
    if epsilon != "auto":
        try:
            epsilon = float(epsilon)
        except ValueError:
            raise CLIError(
                f"--epsilon must be a positive number or 'auto', got {args.epsilon!r}"
            ) from None
        if not epsilon > 0 or not np.isfinite(epsilon):
            raise CLIError(f"--epsilon must be a positive number or 'auto', got {args.epsilon!r}")
    if args.n_neighbors is not None and not 1 <= args.n_neighbors <= X.shape[0]:
        raise CLIError(
            f"--n-neighbors must be between 1 and the {X.shape[0]} samples, got {args.n_neighbors}"
        )
    fig = _new_figure(args, figsize=(6, 5)) if args.plot else None
    model = AttentionDiffusionEmbedding(
        n_components=args.n_components,
        epsilon=epsilon,
        alpha=args.alpha,
        n_neighbors=args.n_neighbors,
        device=args.device,
        random_state=0,
    )
    start = time.perf_counter()
    try:
        Z = model.fit_transform(_scaled(X, args.scale))
    except ValueError as exc:
        raise CLIError(f"AttentionDiffusionEmbedding: {str(exc).splitlines()[0]}") from None
    elapsed = time.perf_counter() - start
    results = {
        "dataset": dataset,
        "n_samples": int(X.shape[0]),
        "n_features": int(X.shape[1]),
        "n_components": args.n_components,
        "alpha": args.alpha,
        "n_neighbors": args.n_neighbors,
        "epsilon": float(model.epsilon_),
        "intrinsic_dimension": None
        if model.intrinsic_dimension_ is None
        else float(model.intrinsic_dimension_),
        "eigenvalues": [float(v) for v in model.eigenvalues_],
        "laplacian_eigenvalues": [float(v) for v in model.laplacian_eigenvalues_],
        "time_s": elapsed,
    }
    lines = [
        f"dataset: {dataset}; AttentionDiffusionEmbedding(n_components={args.n_components}, "
        f"alpha={args.alpha}"
        f"{'' if args.n_neighbors is None else f', n_neighbors={args.n_neighbors}'})"
        f"{', features standardised' if args.scale else ''}",
        f"epsilon: {model.epsilon_:.4g}"
        + (
            ""
            if model.intrinsic_dimension_ is None
            else f"; intrinsic dimension: {model.intrinsic_dimension_:.2f}"
        ),
        "eigenvalues of S: " + " ".join(f"{v:.4f}" for v in model.eigenvalues_),
        f"time: {elapsed:.3f} s",
    ]
    if args.plot:
        from .plotting import EmbeddingDisplay

        EmbeddingDisplay(
            Z[:, :2], _labels(y), xlabel="diffusion coordinate 1", ylabel="diffusion coordinate 2"
        ).plot(ax=fig.add_subplot(), s=6, title=f"attention diffusion embedding: {dataset}")
        _save_figure(fig, args.plot)
    _emit(args, results, lines)
    return 0


# --------------------------------------------------------------------------- cluster


def _cluster(args):
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    from .cluster import AttentionKMeans

    X, y, dataset = _load_data(args, target_required=False)
    labels = _labels(y)
    n_clusters = args.n_clusters
    if n_clusters is None:
        n_clusters = np.unique(labels).size if labels is not None else 8
    if not 1 <= n_clusters <= X.shape[0]:
        raise CLIError(
            f"--n-clusters must be between 1 and the {X.shape[0]} samples, got {n_clusters}"
        )
    fig = _new_figure(args, figsize=(6, 5)) if args.plot else None
    Xs = _scaled(X, args.scale)
    results = {
        "dataset": dataset,
        "n_samples": int(X.shape[0]),
        "n_features": int(X.shape[1]),
        "n_clusters": int(n_clusters),
        "scored_against_target": labels is not None,
        "results": [],
    }
    fitted = {}
    for name, model in [
        ("AttentionKMeans", AttentionKMeans(n_clusters, device=args.device, random_state=0)),
        ("KMeans", KMeans(n_clusters, random_state=0)),
    ]:
        start = time.perf_counter()
        try:
            model.fit(Xs)
        except ValueError as exc:
            raise CLIError(f"{name}: {str(exc).splitlines()[0]}") from None
        row = {
            "model": name,
            "inertia": float(model.inertia_),
            "time_s": time.perf_counter() - start,
        }
        if labels is not None:
            row["ari"] = float(adjusted_rand_score(labels, model.labels_))
            row["nmi"] = float(normalized_mutual_info_score(labels, model.labels_))
        results["results"].append(row)
        fitted[name] = model
    scored = labels is not None
    lines = [f"dataset: {dataset}; {n_clusters} clusters"
             f"{', features standardised' if args.scale else ''}"
             f"{'; scored against the target' if scored else ''}"]
    header = f"{'model':<16} {'inertia':>14} {'time s':>8}" + (
        f" {'ARI':>7} {'NMI':>7}" if scored else ""
    )
    lines += [header, "-" * len(header)]
    for r in results["results"]:
        lines.append(f"{r['model']:<16} {r['inertia']:>14.6g} {r['time_s']:>8.3f}"
                     + (f" {r['ari']:>7.4f} {r['nmi']:>7.4f}" if scored else ""))
    if args.plot:
        _plot_clusters(fig, Xs, fitted["AttentionKMeans"], dataset, results["results"][0])
        _save_figure(fig, args.plot)
    _emit(args, results, lines)
    return 0


def _plot_clusters(fig, X, model, dataset, row):
    from .plotting import EmbeddingDisplay

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


# --------------------------------------------------------------------------- CSV input


def _read_csv(path, target, tabular=False):
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
    except OSError as exc:
        raise CLIError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise CLIError(f"{path!r} is not a UTF-8 text CSV file") from None
    except csv.Error as exc:
        raise CLIError(f"{path!r} is not valid CSV: {exc}") from None
    rows = [r for r in rows if r and any(cell.strip() for cell in r)]
    if len(rows) < 2:
        raise CLIError(f"{path!r} needs a header row and at least one data row")
    header = [h.strip() for h in rows[0]]
    if target is None:
        features = list(range(len(header)))
    elif target not in header:
        raise CLIError(
            f"target column {target!r} not found in {path!r}; columns are: {', '.join(header)}"
        )
    elif len(header) < 2:
        raise CLIError(f"{path!r} has no feature columns besides the target")
    body = rows[1:]
    for line, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise CLIError(
                f"{path!r} line {line} has {len(row)} fields, the header has {len(header)}"
            )
    if target is not None:
        t = header.index(target)
        features = [c for c in range(len(header)) if c != t]
    if tabular and _needs_table(body, features):
        X = _read_table(header, body, features)
        return (X, None) if target is None else (X, _read_target(body, header, target))
    X = np.empty((len(body), len(features)))
    for j, c in enumerate(features):
        for i, row in enumerate(body):
            cell = row[c].strip()
            if cell.lower() in _MISSING_CELLS:
                raise CLIError(
                    f"column {header[c]!r} has a missing value on line {i + 2}; "
                    "impute or drop it first"
                )
            try:
                X[i, j] = float(cell)
            except ValueError:
                raise CLIError(
                    f"column {header[c]!r} is not numeric (line {i + 2}: {cell!r}); encode it first"
                ) from None
    if not np.all(np.isfinite(X)):
        raise CLIError("features contain infinite values")
    if target is None:
        return X, None
    return X, _read_target(body, header, target)


def _read_target(body, header, target):
    t = header.index(target)
    y = np.array([row[t].strip() for row in body])
    if np.any(y == ""):
        raise CLIError(f"target column {target!r} has missing values")
    return y


_MISSING_CELLS = ("", "na", "nan", "null")


def _as_number(cell):
    """A cell as a float, NaN when missing, None when it is text."""
    cell = cell.strip()
    if cell.lower() in _MISSING_CELLS:
        return np.nan
    try:
        return float(cell)
    except ValueError:
        return None


def _needs_table(body, features):
    """Whether any feature cell is text or missing."""
    values = (_as_number(row[c]) for c in features for row in body)
    return any(v is None or np.isnan(v) for v in values)


def _read_table(header, body, features):
    """The feature columns as a DataFrame: numbers (NaN when missing) or text (None)."""
    try:
        import pandas as pd
    except ImportError:
        raise CLIError("a CSV with text columns or missing values needs pandas: "
                       "pip install pandas") from None
    columns = {}
    for c in features:
        numbers = [_as_number(row[c]) for row in body]
        if all(v is not None for v in numbers):
            columns[header[c]] = np.asarray(numbers, dtype=np.float64)
            if np.isinf(columns[header[c]]).any():
                raise CLIError("features contain infinite values")
        else:
            cells = [row[c].strip() for row in body]
            columns[header[c]] = pd.Series(
                [None if v.lower() in _MISSING_CELLS else v for v in cells], dtype=object)
    return pd.DataFrame(columns)


def _task(y, requested):
    try:
        numeric = y.astype(np.float64)
    except ValueError:
        numeric = None
    if requested == "regression":
        if numeric is None:
            raise CLIError("--task regression needs a numeric target")
        return "regression"
    if requested == "classification":
        return "classification"
    if numeric is None:
        return "classification"
    # numeric targets: integer-valued with few distinct values are labels
    distinct = np.unique(numeric).size
    integer = np.all(np.mod(numeric, 1) == 0)
    return "classification" if integer and distinct <= max(20, int(0.05 * y.size)) else "regression"
