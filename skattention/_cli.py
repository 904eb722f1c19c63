"""Command line: ``skattention compare``, ``embed`` and ``cluster`` (``python -m skattention``).

The three subcommands read the same data (scikit-learn's digits, or a CSV read by pandas) and
print a table, or with ``--json`` one JSON object of the same shape for all three::

    {"command": ..., "version": ..., "dataset": {"name", "n_samples", "n_features"},
     "settings": {...}, "results": [{"model": ..., "time_s": ..., ...}, ...], "plot": ...}
"""

import argparse
import csv
import json
import os
import sys
import time
import warnings

import numpy as np

_COMPARE_EXAMPLE = """examples:
  skattention compare                              # scikit-learn's digits, 3-fold CV
  skattention compare --data wine.csv --target quality --cv 10
  skattention compare --data house.csv --target price --drop id --task regression --json
  skattention compare --data excel.csv --sep ';' --encoding latin-1 --target y
  skattention compare --cv 3 --plot scores.png --verbose   # scores chart, progress per fold

models (--models, comma-separated; default: knn,knn-attention,kernel,tabular; with them and the
default 3 folds the run on digits takes about 11 s on 2 CPU cores):
  knn            KNeighborsClassifier/Regressor(n_neighbors=5), the baseline
  knn-attention  attention with the euclidean metric, n_neighbors=5, temperature=inf: exactly k-NN
  kernel         attention with the euclidean metric, temperature="auto" (Gaussian kernel)
  tabular        attention with the learned tabular metric (the default estimator)
  mlp            attention with a learned residual-MLP metric
  linear         attention with a learned linear metric (L2 self-attention)
  dot            attention with a learned dot-product metric (self-attention)
  all            every one of them (linear and dot train slowest: minutes on digits)
"""

_EMBED_EXAMPLE = """examples:
  skattention embed --plot digits.png              # digits in 2-D, coloured by digit
  skattention embed --data cells.csv --target type --scale --n-components 3 --json
  skattention embed --data points.csv --n-neighbors 15 --plot emb.png  # all columns are features
"""

_CLUSTER_EXAMPLE = """examples:
  skattention cluster                      # digits, 10 clusters, ARI/NMI against the digit labels
  skattention cluster --data blobs.csv --n-clusters 4 --plot clusters.png
  skattention cluster --data wine.csv --target cultivar --drop id --scale --json
"""

# --models: name -> (label, builder(task, device)); "default" is DEFAULT_MODELS
DEFAULT_MODELS = ("knn", "knn-attention", "kernel", "tabular")
_MODEL_ORDER = ("knn", "knn-attention", "kernel", "linear", "dot", "mlp", "tabular")
# the missing-value markers of pandas.read_csv, plus the spellings people type
_MISSING = ["null", "NULL", "none", "None", "?"]


class CLIError(Exception):
    """A problem with the user's input: reported in one line, without a traceback."""


def main(argv=None):
    """Entry point of the ``skattention`` console script; returns the exit status."""
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="skattention",
        description="Attention as classical machine learning: compare attention estimators "
        "with their scikit-learn counterparts, embed and cluster data by attention.",
    )
    parser.add_argument("--version", action="version", version=f"skattention {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    compare = sub.add_parser(
        "compare",
        help="cross-validate attention estimators next to k-NN",
        description="Cross-validate attention estimators next to KNeighborsClassifier "
        "(or KNeighborsRegressor) and print accuracy (or R^2), fit and predict times. Text "
        "columns and missing values go to the attention estimators as they are (they encode "
        "them); k-NN gets them imputed and one-hot encoded.",
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
        "--cv", type=int, default=3, help="number of cross-validation folds (default: 3)"
    )
    compare.add_argument(
        "--models", default="default", metavar="NAMES",
        help="comma-separated models to compare (see below; default: "
        f"{','.join(DEFAULT_MODELS)}; 'all' for every one)",
    )
    compare.add_argument(
        "--no-scale", action="store_true", help="do not standardise the features first"
    )
    _add_output_arguments(
        compare, "a chart of the mean scores with their spread over the folds (needs matplotlib)"
    )

    embed = sub.add_parser(
        "embed",
        help="diffusion-map embedding by attention (AttentionDiffusionEmbedding)",
        description="Embed the data with AttentionDiffusionEmbedding (the attention matrix as a "
        "diffusion operator) and print the bandwidth, the estimated intrinsic dimension and the "
        "eigenvalues; --plot draws the first two coordinates, coloured by the target if given. "
        "The features must be numbers without missing values (--drop the others).",
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
        "against the target when --target (or the default digits) gives one. The features must "
        "be numbers without missing values (--drop the others).",
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
        fig = _new_figure(args) if args.plot else None  # a bad --plot fails before any work
        return {"compare": _compare, "embed": _embed, "cluster": _cluster}[args.command](args, fig)
    except CLIError as exc:
        print(f"skattention: error: {exc}", file=sys.stderr)
        return 2


def _add_data_arguments(parser, target_help):
    parser.add_argument(
        "--data",
        metavar="PATH.csv",
        help="CSV file with a header row (default: scikit-learn's digits); the separator "
        "(',', ';', tab or '|') is detected, a UTF-8 byte-order mark (Excel) ignored",
    )
    parser.add_argument("--target", metavar="COLUMN", help=target_help)
    parser.add_argument("--drop", metavar="COLUMN", action="append", default=[],
                        help="a column not to use, such as an ID (repeat for several)")
    parser.add_argument("--sep", metavar="CHAR",
                        help="the CSV separator, e.g. ';' or '\\t' (default: detected)")
    parser.add_argument("--encoding", default="utf-8-sig",
                        help="text encoding of the CSV, e.g. latin-1 (default: UTF-8)")
    parser.add_argument("--max-samples", type=int, default=None, metavar="N",
                        help="use a random subset of N samples (seed 0) to go faster")
    parser.add_argument("--device", default="auto", help="'auto', 'cpu' or 'cuda' (default: auto)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="report progress on standard error (each model and fold)")


def _add_output_arguments(parser, plot_help):
    parser.add_argument(
        "--json", action="store_true", help="print machine-readable JSON instead of a table"
    )
    parser.add_argument("--plot", metavar="FILE.png",
                        help=f"write {plot_help}; the format follows the extension")


def _progress(args, message):
    if args.verbose:
        print(f"skattention {args.command}: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- data


def _load_data(args, tabular=False):
    """``X, y, dataset``: digits by default, else the user's CSV; ``y`` is None without a
    target. ``dataset`` is ``{"name", "n_samples", "n_features"}``.

    ``tabular``: text columns and missing values stay in a DataFrame, for estimators that encode
    them; otherwise the features must be numbers without missing values."""
    if args.max_samples is not None and args.max_samples < 2:
        raise CLIError(f"--max-samples must be at least 2, got {args.max_samples}")
    if args.data is None:
        for option, given in (("--target", args.target), ("--drop", args.drop),
                              ("--sep", args.sep)):
            if given:
                raise CLIError(f"{option} needs --data")
        from sklearn.datasets import load_digits

        X, y = load_digits(return_X_y=True)
        name = "digits (scikit-learn)"
    else:
        if args.command == "compare" and args.target is None:
            raise CLIError("--data needs --target COLUMN")
        X, y = _read_csv(args, tabular)
        name = args.data
    if args.max_samples is not None and args.max_samples < X.shape[0]:
        keep = np.sort(np.random.default_rng(0).choice(X.shape[0], args.max_samples, replace=False))
        X = X.iloc[keep] if hasattr(X, "iloc") else X[keep]
        y = None if y is None else y[keep]
    _progress(args, f"data: {name}, {X.shape[0]} samples x {X.shape[1]} features")
    return X, y, {"name": name, "n_samples": int(X.shape[0]), "n_features": int(X.shape[1])}


def _describe(dataset):
    return f"{dataset['name']}, {dataset['n_samples']} x {dataset['n_features']}"


def _read_csv(args, tabular):
    """``(X, y)`` from ``args.data`` read by pandas: the features (an array of numbers, or a
    DataFrame when ``tabular`` and a column holds text or missing values) and the target."""
    try:
        import pandas as pd
    except ImportError:
        raise CLIError("reading a CSV needs pandas: pip install \"skattention[csv]\"") from None
    path, encoding = args.data, args.encoding
    sep = _separator(args.sep) if args.sep else _sniff_separator(path, encoding)
    try:
        with warnings.catch_warnings():
            # index_col=False: a first data row longer than the header is an error (pandas
            # would otherwise take its first column as the index, or drop its extra fields)
            warnings.simplefilter("error", pd.errors.ParserWarning)
            frame = pd.read_csv(path, sep=sep, encoding=encoding, na_values=_MISSING,
                                skipinitialspace=True, index_col=False)
    except pd.errors.ParserWarning:
        raise CLIError(f"{path!r} has rows with more fields than its header (separator "
                       f"{sep!r}; give another with --sep)") from None
    except FileNotFoundError:
        raise CLIError(f"cannot read {path!r}: no such file") from None
    except OSError as exc:
        raise CLIError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    except LookupError:
        raise CLIError(f"unknown --encoding {encoding!r}") from None
    except UnicodeDecodeError:
        raise CLIError(f"{path!r} is not {encoding} text; give its encoding with --encoding "
                       "(e.g. latin-1 or cp1252)") from None
    except pd.errors.EmptyDataError:
        raise CLIError(f"{path!r} needs a header row and at least one data row") from None
    except pd.errors.ParserError as exc:
        reason = str(exc).strip().splitlines()[-1]
        raise CLIError(f"{path!r} is not valid CSV with separator {sep!r}: {reason}") from None
    frame.columns = [str(c).strip() for c in frame.columns]
    if frame.shape[0] < 1:
        raise CLIError(f"{path!r} needs a header row and at least one data row")
    columns = ", ".join(frame.columns)
    for name in [*args.drop, *([args.target] if args.target is not None else [])]:
        if name not in frame.columns:
            kind = "target column" if name == args.target else "--drop column"
            raise CLIError(f"{kind} {name!r} not found in {path!r}; columns are: {columns}")
    if args.target is not None and args.target in args.drop:
        raise CLIError(f"the target column {args.target!r} cannot be dropped")
    y = None
    if args.target is not None:
        target = frame[args.target]
        missing = np.flatnonzero(target.isna().to_numpy())
        if missing.size:
            raise CLIError(f"target column {args.target!r} has {missing.size} missing values "
                           f"(data rows {', '.join(str(i + 1) for i in missing[:5])}); "
                           "drop those rows first")
        y = target.to_numpy(dtype=np.float64 if pd.api.types.is_numeric_dtype(target) else str)
    X = frame.drop(columns=[*args.drop, *([args.target] if args.target else [])])
    if X.shape[1] == 0:
        raise CLIError(f"{path!r} has no feature columns left (columns: {columns})")
    return _features(X, tabular), y


def _separator(sep):
    """``--sep`` as typed: ``\\t`` or ``tab`` mean a tab."""
    return "\t" if sep in ("\\t", "tab", "TAB") else sep


def _sniff_separator(path, encoding):
    """The separator among , ; tab | that makes the first lines consistent (else a comma)."""
    try:
        with open(path, encoding=encoding, newline="") as handle:
            sample = handle.read(65536)
    except (OSError, LookupError, UnicodeDecodeError):
        return ","  # pandas reports the problem
    lines = sample.splitlines()
    sample = "\n".join(lines[:-1] if len(lines) > 2 else lines)  # the last line may be cut
    try:
        return csv.Sniffer().sniff(sample, delimiters=",;\t|").delimiter
    except csv.Error:
        return ","


def _features(X, tabular):
    """The feature columns as a float array when they are numbers without missing values; else
    the DataFrame (``tabular``) or a one-line error naming the first column at fault."""
    import pandas as pd

    numeric = all(pd.api.types.is_numeric_dtype(X[c]) or pd.api.types.is_bool_dtype(X[c])
                  for c in X.columns)
    if numeric:
        values = X.to_numpy(dtype=np.float64, na_value=np.nan)
        if np.isinf(values).any():
            raise CLIError("features contain infinite values")
        if not np.isnan(values).any():
            return values
    if tabular:
        return X
    for column in X.columns:
        if not pd.api.types.is_numeric_dtype(X[column]):
            cells = X[column].dropna()
            bad = pd.to_numeric(cells, errors="coerce").isna()
            row = cells.index[bad.to_numpy()][0] if bad.any() else cells.index[0]
            raise CLIError(
                f"column {column!r} is not numeric (data row {row + 1}: {X[column][row]!r}); "
                f"encode it first or leave it out with --drop {column}"
            )
        missing = np.flatnonzero(X[column].isna().to_numpy())
        if missing.size:
            raise CLIError(
                f"column {column!r} has a missing value (data row {missing[0] + 1}); impute it "
                f"or leave the column out with --drop {column}"
            )
    raise CLIError("the features are not numbers")  # not reached: a column is at fault


# --------------------------------------------------------------------------- output


def _new_figure(args):
    """A matplotlib Figure (no pyplot, so no display is needed), after checking that ``--plot``
    can be written: its folder exists and is writable, its extension is a format matplotlib
    writes. Fails in one line before any work."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise CLIError("--plot needs matplotlib: pip install \"skattention[plot]\"") from None
    fig = Figure(figsize={"compare": (8, 4)}.get(args.command, (6, 5)))
    folder = os.path.dirname(os.path.abspath(args.plot))
    if not os.path.isdir(folder):
        raise CLIError(f"cannot write --plot {args.plot!r}: folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise CLIError(f"cannot write --plot {args.plot!r}: folder {folder!r} is not writable")
    if os.path.isdir(args.plot):
        raise CLIError(f"cannot write --plot {args.plot!r}: it is a folder")
    formats = fig.canvas.get_supported_filetypes()
    extension = os.path.splitext(args.plot)[1].lstrip(".").lower()
    if extension not in formats:
        raise CLIError(f"cannot write --plot {args.plot!r}: the extension must be one of "
                       f"{', '.join(sorted(formats))}")
    return fig


def _save_figure(fig, path):
    try:
        fig.savefig(path, dpi=100, bbox_inches="tight")
    except (OSError, ValueError) as exc:
        raise CLIError(f"cannot write {path!r}: {getattr(exc, 'strerror', None) or exc}") from None


def _emit(args, dataset, settings, results, lines):
    """Print the table (``lines``) or the JSON object shared by the three subcommands."""
    from . import __version__

    if args.plot:
        lines.append(f"figure written to {args.plot}")
    if args.json:
        print(json.dumps({
            "command": args.command, "version": __version__, "dataset": dataset,
            "settings": settings, "results": results, "plot": args.plot,
        }, indent=2))
    else:
        print("\n".join(lines))
    return 0


# --------------------------------------------------------------------------- compare


def _compare(args, fig):
    if args.cv < 2:
        raise CLIError(f"--cv must be at least 2, got {args.cv}")
    names = _model_names(args.models)
    X, y, dataset = _load_data(args, tabular=True)
    task = _task(y, args.task)
    if task == "regression":
        y = y.astype(np.float64)
    results = _cross_validate(X, y, task, names, args)
    if fig is not None:
        _plot_scores(fig, _describe(dataset), results)
        _save_figure(fig, args.plot)
    settings = {"task": task, "cv": args.cv, "metric": results[0]["metric"],
                "scaled": not args.no_scale, "models": list(names)}
    return _emit(args, dataset, settings, results, _table(dataset, task, args.cv, results))


def _model_names(spec):
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if names in (["default"], []):
        return DEFAULT_MODELS
    if names == ["all"]:
        return _MODEL_ORDER
    unknown = [n for n in names if n not in _MODEL_ORDER]
    if unknown:
        raise CLIError(f"unknown --models {', '.join(unknown)}; choose among "
                       f"{', '.join(_MODEL_ORDER)}, or 'all'")
    return tuple(dict.fromkeys(names))


def _plot_scores(fig, dataset, results):
    """Mean score and its spread (one standard deviation over the folds) per model, with the
    fold scores as small grey dots, on an axis fitted to the scores (not from 0, so that
    differences show), each mean printed."""
    ax = fig.add_subplot()
    means = np.array([r["mean"] for r in results])
    stds = np.array([r["std"] for r in results])
    pos = np.arange(len(results))
    for p, r in zip(pos, results, strict=True):
        ax.scatter(r["scores"], np.full(len(r["scores"]), p), s=12, color="0.6", zorder=1)
    ax.errorbar(means, pos, xerr=stds, fmt="o", color="C0", ecolor="C0", capsize=4, zorder=2)
    folds = np.concatenate([r["scores"] for r in results])
    lo = float(min(np.min(means - stds), folds.min()))
    hi = float(max(np.max(means + stds), folds.max()))
    pad = max(0.15 * (hi - lo), 1e-3 * max(1.0, abs(hi)))
    ax.set_xlim(lo - pad, hi + 2.5 * pad)  # room for the printed values on the right
    for p, m, s in zip(pos, means, stds, strict=True):
        ax.annotate(f"{m:.4f}", (m + s, p), xytext=(6, 0), textcoords="offset points",
                    va="center", fontsize=9)
    ax.set_yticks(pos, [r["model"] for r in results])
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)
    ax.set_xlabel(f"{results[0]['metric']}: mean +- std over the folds (grey: each fold); "
                  "the axis does not start at 0")
    ax.set_title(dataset)


def _models(task, device, names=_MODEL_ORDER):
    """``[(label, estimator)]`` of the ``names`` (see ``--models``), in the table's order."""
    from sklearn.neighbors import KNeighborsClassifier, KNeighborsRegressor

    from .neighbors import MetricAttentionClassifier, MetricAttentionRegressor

    if task == "classification":
        knn, att = KNeighborsClassifier, MetricAttentionClassifier
    else:
        knn, att = KNeighborsRegressor, MetricAttentionRegressor
    builders = {
        "knn": (f"{knn.__name__}(k=5)", lambda: knn(n_neighbors=5)),
        "knn-attention": ("attention euclidean k-NN (k=5, T=inf)",
                          lambda: att("euclidean", n_neighbors=5, temperature=np.inf,
                                      device=device)),
        "kernel": ("attention euclidean kernel (T=auto)", lambda: att("euclidean", device=device)),
        "linear": ("attention learned linear (L2)",
                   lambda: att("linear", random_state=0, device=device)),
        "dot": ("attention learned dot (self-attention)",
                lambda: att("dot", random_state=0, device=device)),
        "mlp": ("attention learned mlp", lambda: att("mlp", random_state=0, device=device)),
        "tabular": ("attention learned tabular (default)",
                    lambda: att(random_state=0, device=device)),
    }
    return [(builders[n][0], builders[n][1]()) for n in _MODEL_ORDER if n in names]


def _cross_validate(X, y, task, names, args):
    """Each model on the same folds: per-fold scores, fit and predict times."""
    from sklearn.base import clone
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.metrics import get_scorer
    from sklearn.model_selection import KFold, StratifiedKFold
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
    scorer = get_scorer(scoring)
    folds = list(cv.split(np.zeros((X.shape[0], 1)), y))
    models = _models(task, args.device, names)
    results = []
    for m, (name, model) in enumerate(models, start=1):
        if hasattr(X, "columns"):  # text or missing cells: a DataFrame
            est = _tabular_pipeline(model, args.no_scale)
        else:
            est = model if args.no_scale else make_pipeline(StandardScaler(), model)
        scores, fit_times, predict_times = [], [], []
        start = time.perf_counter()
        for f, (train, test) in enumerate(folds, start=1):
            fitted = clone(est)
            t0 = time.perf_counter()
            try:
                with warnings.catch_warnings():
                    # the table reports the scores; a learned metric stopped by max_iter is
                    # still compared as configured
                    warnings.simplefilter("ignore", ConvergenceWarning)
                    fitted.fit(_rows(X, train), y[train])
                t1 = time.perf_counter()
                scores.append(float(scorer(fitted, _rows(X, test), y[test])))
            except ValueError as exc:
                raise CLIError(f"{name}: {str(exc).splitlines()[0]}") from None
            fit_times.append(t1 - t0)
            predict_times.append(time.perf_counter() - t1)
            _progress(args, f"model {m}/{len(models)} {name}: fold {f}/{len(folds)} "
                      f"{scoring} {scores[-1]:.4f} (fit {fit_times[-1]:.2f} s, "
                      f"predict {predict_times[-1]:.2f} s)")
        results.append({
            "model": name,
            "metric": scoring,
            "mean": float(np.mean(scores)),
            "std": float(np.std(scores)),
            "scores": scores,
            "fit_time_s": float(np.mean(fit_times)),
            "predict_time_s": float(np.mean(predict_times)),
            "time_s": time.perf_counter() - start,
        })
    return results


def _rows(X, index):
    return X.iloc[index] if hasattr(X, "iloc") else X[index]


def _tabular_pipeline(model, no_scale):
    """``model`` on a DataFrame with text columns and missing values: the attention estimators
    take it as is (numbers standardised unless ``no_scale``); k-NN needs imputation and a
    one-hot encoding first."""
    from sklearn.compose import make_column_selector, make_column_transformer
    from sklearn.impute import SimpleImputer
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    numbers = make_column_selector(dtype_include="number")
    text = make_column_selector(dtype_exclude="number")
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


def _table(dataset, task, n_folds, results):
    metric = results[0]["metric"]
    header = f"{'model':<42} {metric + ' mean':>13} {'std':>7} {'fit s':>8} {'predict s':>10}"
    lines = [
        f"dataset: {_describe(dataset)}; task: {task}; {n_folds}-fold cross-validation, "
        "features standardised unless --no-scale",
        header,
        "-" * len(header),
    ]
    lines += [
        f"{r['model']:<42} {r['mean']:>13.4f} {r['std']:>7.4f} {r['fit_time_s']:>8.3f} "
        f"{r['predict_time_s']:>10.3f}"
        for r in results
    ]
    return lines


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


def _embed(args, fig):
    from .manifold import AttentionDiffusionEmbedding

    if args.n_components < 1:
        raise CLIError(f"--n-components must be at least 1, got {args.n_components}")
    if args.plot and args.n_components < 2:
        raise CLIError("--plot needs --n-components 2 or more")
    if not 0.0 <= args.alpha <= 1.0:
        raise CLIError(f"--alpha must be in [0, 1], got {args.alpha}")
    epsilon = args.epsilon
    if epsilon != "auto":
        try:
            epsilon = float(epsilon)
        except ValueError:
            epsilon = None
        if epsilon is None or not epsilon > 0 or not np.isfinite(epsilon):
            raise CLIError(f"--epsilon must be a positive number or 'auto', got {args.epsilon!r}")
    X, y, dataset = _load_data(args)
    if args.n_components >= X.shape[0]:
        raise CLIError(
            f"--n-components {args.n_components} must be smaller than the {X.shape[0]} samples"
        )
    if args.n_neighbors is not None and not 1 <= args.n_neighbors <= X.shape[0]:
        raise CLIError(
            f"--n-neighbors must be between 1 and the {X.shape[0]} samples, got {args.n_neighbors}"
        )
    model = AttentionDiffusionEmbedding(
        n_components=args.n_components,
        epsilon=epsilon,
        alpha=args.alpha,
        n_neighbors=args.n_neighbors,
        device=args.device,
        random_state=0,
    )
    _progress(args, "fitting AttentionDiffusionEmbedding")
    start = time.perf_counter()
    try:
        Z = model.fit_transform(_scaled(X, args.scale))
    except ValueError as exc:
        raise CLIError(f"AttentionDiffusionEmbedding: {str(exc).splitlines()[0]}") from None
    elapsed = time.perf_counter() - start
    _progress(args, f"AttentionDiffusionEmbedding done in {elapsed:.2f} s")
    settings = {"n_components": args.n_components, "alpha": args.alpha,
                "n_neighbors": args.n_neighbors, "epsilon": args.epsilon, "scaled": args.scale}
    results = [{
        "model": "AttentionDiffusionEmbedding",
        "time_s": elapsed,
        "epsilon": float(model.epsilon_),
        "intrinsic_dimension": None
        if model.intrinsic_dimension_ is None
        else float(model.intrinsic_dimension_),
        "eigenvalues": [float(v) for v in model.eigenvalues_],
        "laplacian_eigenvalues": [float(v) for v in model.laplacian_eigenvalues_],
    }]
    lines = [
        f"dataset: {_describe(dataset)}; AttentionDiffusionEmbedding(n_components="
        f"{args.n_components}, alpha={args.alpha}"
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
    if fig is not None:
        from .plotting import EmbeddingDisplay

        EmbeddingDisplay(
            Z[:, :2], _labels(y), xlabel="diffusion coordinate 1", ylabel="diffusion coordinate 2"
        ).plot(ax=fig.add_subplot(), s=6,
               title=f"attention diffusion embedding: {_describe(dataset)}")
        _save_figure(fig, args.plot)
    return _emit(args, dataset, settings, results, lines)


# --------------------------------------------------------------------------- cluster


def _cluster(args, fig):
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    from .cluster import AttentionKMeans

    X, y, dataset = _load_data(args)
    labels = _labels(y)
    n_clusters = args.n_clusters
    if n_clusters is None:
        n_clusters = np.unique(labels).size if labels is not None else 8
    if not 1 <= n_clusters <= X.shape[0]:
        raise CLIError(
            f"--n-clusters must be between 1 and the {X.shape[0]} samples, got {n_clusters}"
        )
    Xs = _scaled(X, args.scale)
    scored = labels is not None
    settings = {"n_clusters": int(n_clusters), "scaled": args.scale,
                "scored_against_target": scored}
    results, fitted = [], {}
    for name, model in [
        ("AttentionKMeans", AttentionKMeans(n_clusters, device=args.device, random_state=0)),
        ("KMeans", KMeans(n_clusters, random_state=0)),
    ]:
        _progress(args, f"fitting {name}")
        start = time.perf_counter()
        try:
            model.fit(Xs)
        except ValueError as exc:
            raise CLIError(f"{name}: {str(exc).splitlines()[0]}") from None
        row = {"model": name, "time_s": time.perf_counter() - start,
               "inertia": float(model.inertia_)}
        _progress(args, f"{name} done in {row['time_s']:.2f} s")
        if scored:
            row["ari"] = float(adjusted_rand_score(labels, model.labels_))
            row["nmi"] = float(normalized_mutual_info_score(labels, model.labels_))
        results.append(row)
        fitted[name] = model
    lines = [f"dataset: {_describe(dataset)}; {n_clusters} clusters"
             f"{', features standardised' if args.scale else ''}"
             f"{'; scored against the target' if scored else ''}"]
    header = f"{'model':<16} {'inertia':>14} {'time s':>8}" + (
        f" {'ARI':>7} {'NMI':>7}" if scored else ""
    )
    lines += [header, "-" * len(header)]
    for r in results:
        lines.append(f"{r['model']:<16} {r['inertia']:>14.6g} {r['time_s']:>8.3f}"
                     + (f" {r['ari']:>7.4f} {r['nmi']:>7.4f}" if scored else ""))
    if fig is not None:
        _plot_clusters(fig, Xs, fitted["AttentionKMeans"], _describe(dataset), results[0])
        _save_figure(fig, args.plot)
    return _emit(args, dataset, settings, results, lines)


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
