"""``skattention compare``: attention estimators cross-validated next to k-NN, each model's row
printed as soon as its folds are done."""

import importlib.util
import sys
import time
import warnings

import numpy as np

from ._common import CLIError, check_device, describe, prefixed
from ._data import load_data, task_of
from ._output import emit, save_figure

# --models: the names, in the table's order; "default" is DEFAULT_MODELS
DEFAULT_MODELS = ("knn", "knn-attention", "kernel", "tabular")
MODEL_ORDER = ("knn", "knn-attention", "kernel", "linear", "dot", "mlp", "tabular")


def compare(args, fig):
    """Run ``skattention compare``; returns the exit status."""
    if args.cv < 2:
        raise CLIError(f"--cv must be at least 2, got {args.cv}")
    names = model_names(args.models)
    X, y, dataset = load_data(args, tabular=True)
    task = task_of(y, args.task)
    if task == "regression":
        y = y.astype(np.float64)
    check_folds(X, y, task, args.cv)
    check_device(args)
    metric = "accuracy" if task == "classification" else "r2"
    if not args.json:
        print("\n".join(table_head(dataset, task, args.cv, metric)), flush=True)
    results = []
    with _Console(args, total=len(names) * args.cv) as console:
        for result in cross_validate(X, y, task, names, args, console):
            results.append(result)
            if not args.json:
                console.row(table_row(result))
    if fig is not None:
        plot_scores(fig, describe(dataset), results)
        save_figure(fig, args.plot)
    settings = {"task": task, "cv": args.cv, "metric": metric,
                "scaled": not args.no_scale, "models": list(names)}
    return emit(args, dataset, settings, results, [])


def model_names(spec):
    """The ``--models`` names, in the order given, without repeats."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:  # (an empty --models ran the default models)
        raise CLIError(f"--models names no model; choose among {', '.join(MODEL_ORDER)}, "
                       "'default' or 'all'")
    if names == ["default"]:
        return DEFAULT_MODELS
    if names == ["all"]:
        return MODEL_ORDER
    unknown = [n for n in names if n not in MODEL_ORDER]
    if unknown:
        raise CLIError(f"unknown --models {', '.join(unknown)}; choose among "
                       f"{', '.join(MODEL_ORDER)}, or 'all'")
    return tuple(dict.fromkeys(names))


def check_folds(X, y, task, n_folds):
    """The target and the samples can be split into ``n_folds`` folds (stratified for
    classification)."""
    if task == "classification":
        _, counts = np.unique(y, return_counts=True)
        if counts.size < 2:
            raise CLIError("the target has a single class; classification needs at least 2")
        if counts.min() < n_folds:
            raise CLIError(
                f"the smallest class has {counts.min()} samples, fewer than --cv {n_folds} folds"
            )
    if X.shape[0] < n_folds:
        raise CLIError(f"{X.shape[0]} samples are fewer than --cv {n_folds} folds")


class _Console:
    """The rows on standard output and the progress lines on standard error, written above a
    bar over the folds when tqdm is installed and standard error is a terminal (a log gets the
    rows and lines only). The bar shows once the run has lasted a few seconds and goes when it
    ends, so that the table keeps its layout."""

    def __init__(self, args, total):
        from .._engine import progress_bar

        self.args = args
        self.shown = sys.stderr.isatty() and importlib.util.find_spec("tqdm") is not None
        self.bar = progress_bar(self.shown, total=total, unit="fold", inner=True)

    def row(self, line):
        self._write(line, sys.stdout)

    def progress(self, message):
        if self.args.verbose:
            self._write(prefixed(self.args, message), sys.stderr)

    def start_model(self, name):
        self.bar.set_description(name)

    def fold_done(self):
        self.bar.update()

    def _write(self, line, file):
        if self.shown:
            self.bar.write(line, file=file)  # tqdm clears the bar, writes, draws it again
        else:
            print(line, file=file, flush=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.bar.close()


def cross_validate(X, y, task, names, args, console):
    """Each model on the same folds, yielded as soon as its folds are done: per-fold scores,
    fit and predict times."""
    from sklearn.metrics import get_scorer
    from sklearn.model_selection import KFold, StratifiedKFold

    splitter, scoring = (
        (StratifiedKFold, "accuracy") if task == "classification" else (KFold, "r2")
    )
    scorer = get_scorer(scoring)
    folds = list(splitter(args.cv, shuffle=True, random_state=0).split(
        np.zeros((X.shape[0], 1)), y))
    models = build_models(task, args.device, names)
    for m, (name, model) in enumerate(models, start=1):
        est = _with_preprocessing(model, X, args.no_scale)
        console.start_model(name)
        scores, fit_times, predict_times = [], [], []
        start = time.perf_counter()
        for f, (train, test) in enumerate(folds, start=1):
            score, fit_time, predict_time = _fit_and_score(est, X, y, train, test, scorer, name)
            scores.append(score)
            fit_times.append(fit_time)
            predict_times.append(predict_time)
            console.fold_done()
            console.progress(f"model {m}/{len(models)} {name}: fold {f}/{len(folds)} "
                             f"{scoring} {score:.4f} (fit {fit_time:.2f} s, "
                             f"predict {predict_time:.2f} s)")
        yield {
            "model": name,
            "metric": scoring,
            "mean": float(np.mean(scores)),
            "std": float(np.std(scores)),
            "scores": scores,
            "fit_time_s": float(np.mean(fit_times)),
            "predict_time_s": float(np.mean(predict_times)),
            "time_s": time.perf_counter() - start,
        }


def _fit_and_score(est, X, y, train, test, scorer, name):
    """``(score, fit seconds, predict seconds)`` of a clone of ``est`` on one fold."""
    from sklearn.base import clone
    from sklearn.exceptions import ConvergenceWarning

    fitted = clone(est)
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            # the table reports the scores; a learned metric stopped by max_iter is still
            # compared as configured
            warnings.simplefilter("ignore", ConvergenceWarning)
            fitted.fit(_rows(X, train), y[train])
        t1 = time.perf_counter()
        score = float(scorer(fitted, _rows(X, test), y[test]))
    except ValueError as exc:
        raise CLIError(f"{name}: {str(exc).splitlines()[0]}") from None
    return score, t1 - t0, time.perf_counter() - t1


def build_models(task, device, names=MODEL_ORDER):
    """``[(label, estimator)]`` of the ``names`` (see ``--models``), in the table's order."""
    from sklearn.neighbors import KNeighborsClassifier, KNeighborsRegressor

    from ..neighbors import MetricAttentionClassifier, MetricAttentionRegressor

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
    return [(builders[n][0], builders[n][1]()) for n in MODEL_ORDER if n in names]


def _rows(X, index):
    return X.iloc[index] if hasattr(X, "iloc") else X[index]


def _with_preprocessing(model, X, no_scale):
    """``model`` behind a StandardScaler unless ``no_scale``; on a DataFrame (text or missing
    cells) the attention estimators take the columns as they are, k-NN needs imputation and a
    one-hot encoding first."""
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if hasattr(X, "columns"):
        return _tabular_pipeline(model, no_scale)
    return model if no_scale else make_pipeline(StandardScaler(), model)


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


def table_head(dataset, task, n_folds, metric):
    """The lines above the rows: the data and set-up, the column names and a rule."""
    header = f"{'model':<42} {metric + ' mean':>13} {'std':>7} {'fit s':>8} {'predict s':>10}"
    return [
        f"dataset: {describe(dataset)}; task: {task}; {n_folds}-fold cross-validation, "
        "features standardised unless --no-scale",
        header,
        "-" * len(header),
    ]


def table_row(result):
    """One model's line of the table."""
    r = result
    return (f"{r['model']:<42} {r['mean']:>13.4f} {r['std']:>7.4f} {r['fit_time_s']:>8.3f} "
            f"{r['predict_time_s']:>10.3f}")


def plot_scores(fig, dataset, results):
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
