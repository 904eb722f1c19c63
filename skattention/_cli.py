"""Command line: ``skattention compare`` (also ``python -m skattention compare``)."""

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
"""


class CLIError(Exception):
    """A problem with the user's input: reported in one line, without a traceback."""


def main(argv=None):
    """Entry point of the ``skattention`` console script; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="skattention",
        description="Attention as classical machine learning: compare attention estimators "
        "with their scikit-learn counterparts.",
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
    compare.add_argument("--data", metavar="PATH.csv", help="CSV file with a header row (default: scikit-learn's digits)")
    compare.add_argument("--target", metavar="COLUMN", help="name of the target column in --data")
    compare.add_argument("--task", choices=["auto", "classification", "regression"], default="auto",
                         help="default: classification unless the target is numeric with many distinct values")
    compare.add_argument("--cv", type=int, default=5, help="number of cross-validation folds (default: 5)")
    compare.add_argument("--no-scale", action="store_true", help="do not standardise the features first")
    compare.add_argument("--device", default="auto", help="'auto', 'cpu' or 'cuda' (default: auto)")
    compare.add_argument("--json", action="store_true", help="print machine-readable JSON instead of a table")
    args = parser.parse_args(argv)
    try:
        return _compare(args)
    except CLIError as exc:
        print(f"skattention: error: {exc}", file=sys.stderr)
        return 2


# --------------------------------------------------------------------------- compare


def _compare(args):
    if args.cv < 2:
        raise CLIError(f"--cv must be at least 2, got {args.cv}")
    if args.data is None:
        if args.target is not None:
            raise CLIError("--target needs --data")
        from sklearn.datasets import load_digits

        X, y = load_digits(return_X_y=True)
        dataset = "digits (scikit-learn, 1797 x 64)"
    else:
        if args.target is None:
            raise CLIError("--data needs --target COLUMN")
        X, y = _read_csv(args.data, args.target)
        dataset = f"{args.data} ({X.shape[0]} x {X.shape[1]})"
    task = _task(y, args.task)
    if task == "regression":
        y = y.astype(np.float64)
    results = _cross_validate(X, y, task, args)
    if args.json:
        print(json.dumps({"dataset": dataset, "task": task, "results": results}, indent=2))
    else:
        _print_table(dataset, task, args.cv, results)
    return 0


def _models(task, device):
    from sklearn.neighbors import KNeighborsClassifier, KNeighborsRegressor

    from .neighbors import MetricAttentionClassifier, MetricAttentionRegressor

    if task == "classification":
        knn, att = KNeighborsClassifier, MetricAttentionClassifier
    else:
        knn, att = KNeighborsRegressor, MetricAttentionRegressor
    return [
        (f"{knn.__name__}(k=5)", knn(n_neighbors=5)),
        ("attention euclidean k-NN (k=5, T=inf)", att("euclidean", n_neighbors=5, temperature=np.inf, device=device)),
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


def _print_table(dataset, task, n_folds, results):
    metric = results[0]["metric"]
    print(f"dataset: {dataset}; task: {task}; {n_folds}-fold cross-validation, features standardised unless --no-scale")
    header = f"{'model':<42} {metric + ' mean':>13} {'std':>7} {'fit s':>8} {'predict s':>10}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r['model']:<42} {r['mean']:>13.4f} {r['std']:>7.4f} {r['fit_time_s']:>8.3f} {r['predict_time_s']:>10.3f}")


# --------------------------------------------------------------------------- CSV input


def _read_csv(path, target):
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
    if target not in header:
        raise CLIError(f"target column {target!r} not found in {path!r}; columns are: {', '.join(header)}")
    if len(header) < 2:
        raise CLIError(f"{path!r} has no feature columns besides the target")
    body = rows[1:]
    for line, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise CLIError(f"{path!r} line {line} has {len(row)} fields, the header has {len(header)}")
    t = header.index(target)
    features = [c for c in range(len(header)) if c != t]
    X = np.empty((len(body), len(features)))
    for j, c in enumerate(features):
        for i, row in enumerate(body):
            cell = row[c].strip()
            if cell == "" or cell.lower() in ("na", "nan", "null"):
                raise CLIError(f"column {header[c]!r} has a missing value on line {i + 2}; impute or drop it first")
            try:
                X[i, j] = float(cell)
            except ValueError:
                raise CLIError(
                    f"column {header[c]!r} is not numeric (line {i + 2}: {cell!r}); encode it first"
                ) from None
    if not np.all(np.isfinite(X)):
        raise CLIError("features contain infinite values")
    y = np.array([row[t].strip() for row in body])
    if np.any(y == ""):
        raise CLIError(f"target column {target!r} has missing values")
    return X, y


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
