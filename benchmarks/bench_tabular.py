"""Tabular benchmark: mixed-type real datasets, three families, DEV and HELD-OUT splits.

    python benchmarks/bench_tabular.py                       # every model, every dataset
    python benchmarks/bench_tabular.py --models hgb,knn --family business --split dev
    python benchmarks/bench_tabular.py --models attention --recipe dropout=0.1 --tag drop01
    python benchmarks/bench_tabular.py --report               # summary from the cached JSON
    python benchmarks/bench_tabular.py --quick               # smoke test: 2 small sets, 1 seed
    python benchmarks/bench_tabular.py --split dev --models skattention:b512 \
        --set skattention.neighbors._base:_TABULAR_BATCH=512 --out /tmp/b512.json

Datasets and their DEV / HELD-OUT assignment are in ``tabular_datasets.py``. Every model sees the
same 75/25 splits (stratified for classification), one per seed (3 seeds by default), on the raw
feature DataFrame. Metrics: accuracy, ROC-AUC (binary; macro one-vs-rest for multiclass) and
log-loss for classes, R^2 for regression, and fit / predict wall time. Results are cached per
(dataset, model, seed) in ``results/tabular.json``: a run computes only what is missing (or all
with ``--force``), so re-running one model is cheap. The summary (per family and split means,
win counts of ``--ours`` against each baseline, per-dataset table) is printed and written to
``results/tabular.md``.

Baselines (defaults everywhere, one process, ``--threads`` threads for BLAS, torch, CatBoost and
LightGBM):

* ``hgb``: HistGradientBoosting with ``categorical_features="from_dtype"`` on the frame with
  string columns cast to ``category`` (what that estimator asks of a user);
* ``linear``: LogisticRegression / Ridge, and ``knn``: KNeighbors(5), each behind a standard
  ColumnTransformer (median / most-frequent imputation with missing indicators, one-hot, scaling);
* ``catboost`` and ``lightgbm`` defaults (optional imports: ``pip install catboost lightgbm``);
* ``attention``: the recipe of ``tabular_lab`` (the candidate default of issue 15); with
  ``--recipe k=v ...`` and ``--tag NAME`` a variant, stored as ``attention:NAME``;
* ``skattention``: the library's ``MetricAttentionClassifier()`` / ``MetricAttentionRegressor()``
  with their defaults on the raw frame (the tabular recipe, phase 2b); ``skattention:NAME``
  with ``--recipe k=v ...`` as estimator parameters (``--tag`` names ``attention`` only);
* ``skattention_v0``: today's ``MetricAttention*()`` defaults behind the same ColumnTransformer.
"""

import argparse
import ast
import fcntl
import importlib
import json
import os
import pathlib
import sys
import time

import numpy as np
import pandas as pd

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import tabular_datasets as tds  # noqa: E402 (after the sys.path insert)

RESULTS = HERE / "results" / "tabular.json"
BASELINES = ("hgb", "linear", "knn", "catboost", "lightgbm")
DEFAULT_MODELS = BASELINES + ("attention",)
QUICK = ("pima", "swisslabor", "diabetes")
MAX_CATEGORIES = 255  # HGB's limit on categories of a from_dtype column


# ---------------------------------------------------------------- input handling per baseline

def string_columns(X):
    """Columns a user would call categorical: strings, objects, categories and booleans."""
    return [c for c in X.columns if not pd.api.types.is_numeric_dtype(X[c].dtype)
            or pd.api.types.is_bool_dtype(X[c].dtype)]


class _AsCategory:
    """String columns as ``category`` with the training levels (unseen levels become NaN)."""

    def fit(self, X):
        self.levels = {}
        for c in string_columns(X):
            levels = pd.Index(X[c].dropna().astype(str).unique()).sort_values()
            if len(levels) <= MAX_CATEGORIES:
                self.levels[c] = levels
        self.codes = [c for c in string_columns(X) if c not in self.levels]  # too many levels
        return self

    def transform(self, X):
        X = X.copy()
        for c, levels in self.levels.items():
            X[c] = pd.Categorical(X[c].astype("string").astype(object).where(X[c].notna()),
                                  categories=levels)
        for c in self.codes:  # beyond HGB's limit: frequency-free ordinal codes, unseen -> NaN
            X[c] = pd.Categorical(X[c].astype("string").astype(object)).codes.astype(float)
            X.loc[X[c] < 0, c] = np.nan
        return X


class FrameModel:
    """A model behind a per-baseline frame preparation (fit-time state, applied at predict)."""

    def __init__(self, model, prepare=None):
        self.model, self.prepare = model, prepare

    def fit(self, X, y):
        if self.prepare is not None:
            X = self.prepare.fit(X).transform(X)
        self.model.fit(X, y)
        return self

    def _x(self, X):
        return X if self.prepare is None else self.prepare.transform(X)

    def predict(self, X):
        return np.asarray(self.model.predict(self._x(X))).ravel()

    def predict_proba(self, X):
        return self.model.predict_proba(self._x(X))

    @property
    def classes_(self):
        return self.model.classes_


class _CatBoostFrame:
    """CatBoost takes string columns natively; NaN in them becomes its own level."""

    def fit(self, X):
        self.cats = string_columns(X)
        return self

    def transform(self, X):
        X = X.copy()
        for c in self.cats:
            X[c] = X[c].astype("string").fillna("__NA__").astype(object)
        return X


def column_transformer(X):
    from sklearn.compose import ColumnTransformer
    from sklearn.impute import SimpleImputer
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    cats = string_columns(X)
    nums = [c for c in X.columns if c not in cats]
    to_str = _ToStr()
    return ColumnTransformer([
        ("num", make_pipeline(SimpleImputer(strategy="median", add_indicator=True),
                              StandardScaler()), nums),
        ("cat", make_pipeline(to_str, SimpleImputer(strategy="most_frequent"),
                              OneHotEncoder(handle_unknown="ignore")), cats),
    ], sparse_threshold=0.0)


class _ToStr:
    """Object array of strings with NaN kept (SimpleImputer imputes it)."""

    def fit(self, X, y=None):
        return self

    def transform(self, X):
        X = pd.DataFrame(X).astype("string").astype(object)
        return X.where(X.notna(), np.nan).to_numpy()

    def fit_transform(self, X, y=None):
        return self.transform(X)

    def get_params(self, deep=True):
        return {}

    def set_params(self, **params):
        return self


def make_model(name, task, seed, X_train, threads, recipe):
    """The model ``name`` for ``task`` in {"classification", "regression"}."""
    from sklearn.pipeline import make_pipeline

    clf = task == "classification"
    if name == "hgb":
        from sklearn.ensemble import (
            HistGradientBoostingClassifier,
            HistGradientBoostingRegressor,
        )

        est = (HistGradientBoostingClassifier if clf else HistGradientBoostingRegressor)(
            categorical_features="from_dtype", random_state=seed)
        return FrameModel(est, _AsCategory())
    if name == "linear":
        from sklearn.linear_model import LogisticRegression, Ridge

        est = LogisticRegression(max_iter=2000) if clf else Ridge()
        return make_pipeline(column_transformer(X_train), est)
    if name == "knn":
        from sklearn.neighbors import KNeighborsClassifier, KNeighborsRegressor

        est = (KNeighborsClassifier if clf else KNeighborsRegressor)(5)
        return make_pipeline(column_transformer(X_train), est)
    if name == "catboost":
        import catboost

        est = (catboost.CatBoostClassifier if clf else catboost.CatBoostRegressor)(
            random_seed=seed, thread_count=threads, verbose=0, allow_writing_files=False,
            cat_features=string_columns(X_train))
        return FrameModel(est, _CatBoostFrame())
    if name == "lightgbm":
        import lightgbm

        est = (lightgbm.LGBMClassifier if clf else lightgbm.LGBMRegressor)(
            random_state=seed, n_jobs=threads, verbose=-1)
        return FrameModel(est, _AsCategory())
    if name == "skattention_v0":
        from skattention import MetricAttentionClassifier, MetricAttentionRegressor

        est = (MetricAttentionClassifier if clf else MetricAttentionRegressor)(random_state=seed)
        return make_pipeline(column_transformer(X_train), est)
    if name == "skattention" or name.startswith("skattention:"):
        from skattention import MetricAttentionClassifier, MetricAttentionRegressor

        cls = MetricAttentionClassifier if clf else MetricAttentionRegressor
        # a recipe's random_state (another seed of the same recipe) replaces the run's
        return cls(**{"random_state": seed, **(recipe if ":" in name else {})})
    if name.startswith("attention"):
        from tabular_lab import TabularAttentionClassifier, TabularAttentionRegressor

        cls = TabularAttentionClassifier if clf else TabularAttentionRegressor
        return cls(random_state=seed, **recipe)
    raise ValueError(f"unknown model {name!r}")


# ---------------------------------------------------------------- one run

def evaluate(name, dataset, seed, threads, recipe):
    from sklearn.metrics import accuracy_score, log_loss, r2_score, roc_auc_score
    from sklearn.model_selection import train_test_split

    X, y, spec = tds.load(dataset)
    clf = spec.family != "regression"
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=seed,
                                          stratify=y if clf else None)
    model = make_model(name, "classification" if clf else "regression", seed, Xtr, threads, recipe)
    start = time.perf_counter()
    model.fit(Xtr, ytr)
    fit_s = time.perf_counter() - start
    start = time.perf_counter()
    if clf:
        proba = np.asarray(model.predict_proba(Xte), dtype=np.float64)
        pred = np.asarray(model.classes_)[proba.argmax(1)]
    else:
        pred = np.asarray(model.predict(Xte), dtype=np.float64)
    predict_s = time.perf_counter() - start
    out = {"fit_s": fit_s, "predict_s": predict_s, "n_train": len(Xtr)}
    if clf:
        classes = np.asarray(model.classes_)
        order = np.argsort(classes)  # CatBoost keeps classes in order of appearance
        classes, proba = classes[order], proba[:, order]
        proba = np.clip(proba, 1e-15, 1.0)
        proba /= proba.sum(1, keepdims=True)
        out["accuracy"] = float(accuracy_score(yte, pred))
        out["log_loss"] = float(log_loss(yte, proba, labels=classes))
        if classes.size == 2:
            out["roc_auc"] = float(roc_auc_score(yte == classes[1], proba[:, 1]))
        else:
            out["roc_auc"] = float(roc_auc_score(yte, proba, multi_class="ovr", average="macro",
                                                 labels=classes))
    else:
        out["r2"] = float(r2_score(yte, pred))
    info = getattr(model, "fit_info_", None)
    if hasattr(model, "map_") and model.map_ is not None:  # the library's estimators
        info = {"epochs": model.n_iter_, "temperature": model.temperature_,
                "numeric_embedding": getattr(model.map_, "numeric_embedding", None)}
    if info:
        out["info"] = info
    return out


# ---------------------------------------------------------------- summary

METRICS = {"continuous": ("accuracy", "roc_auc", "log_loss"), "business": ("accuracy", "roc_auc",
           "log_loss"), "regression": ("r2",)}
HIGHER_IS_BETTER = {"accuracy": True, "roc_auc": True, "log_loss": False, "r2": True}


def per_dataset_means(results, dataset, model, seeds):
    runs = results.get(dataset, {}).get(model, {})
    if not all(str(s) in runs for s in seeds):
        return None
    rows = [runs[str(s)] for s in seeds]
    keys = [k for k in rows[0] if isinstance(rows[0][k], (int, float))]
    return {k: float(np.mean([r[k] for r in rows])) for k in keys}


def summary(results, models, ours, seeds, datasets):
    lines = []
    for family in tds.FAMILIES:
        for split in ("dev", "heldout"):
            names = [d for d in datasets if tds.DATASETS[d].family == family
                     and tds.DATASETS[d].split == split]
            present = [m for m in models
                       if any(per_dataset_means(results, d, m, seeds) for d in names)]
            names = [d for d in names
                     if all(per_dataset_means(results, d, m, seeds) for m in present)]
            if not names or not present:
                continue
            means = {m: {d: per_dataset_means(results, d, m, seeds) for d in names}
                     for m in present}
            metrics = METRICS[family]
            lines.append(f"\n### {family} / {split}: {len(names)} datasets, seeds {seeds}\n")
            head = "| model | " + " | ".join(metrics) + " | fit s (median) | predict s (median) |"
            lines += [head, "|" + " --- |" * (len(metrics) + 3)]
            for m in present:
                vals = [np.mean([means[m][d][k] for d in names]) for k in metrics]
                fit = np.median([means[m][d]["fit_s"] for d in names])
                pred = np.median([means[m][d]["predict_s"] for d in names])
                lines.append(f"| {m} | " + " | ".join(f"{v:.4f}" for v in vals)
                             + f" | {fit:.2f} | {pred:.3f} |")
            if ours in present:
                lines.append("")
                for m in present:
                    if m == ours:
                        continue
                    parts = []
                    for k in metrics:
                        sign = 1 if HIGHER_IS_BETTER[k] else -1
                        d = [sign * (means[ours][n][k] - means[m][n][k]) for n in names]
                        parts.append(f"{k} {sum(x > 0 for x in d)}W/{sum(x == 0 for x in d)}T/"
                                     f"{sum(x < 0 for x in d)}L (mean {np.mean(d):+.4f})")
                    lines.append(f"- {ours} vs {m}: " + "; ".join(parts))
            if ours in present and {"hgb", "knn", "linear"} <= set(present):
                lines += ["", _targets(means, names, ours, family, present)]
            lines.append("")
            main = metrics[1] if family != "regression" else "r2"
            head = "| dataset | " + " | ".join(present) + f" |  ({metrics[0]}" + (
                f" / {main})" if main != metrics[0] else ")")
            lines += [head, "|" + " --- |" * (len(present) + 1)]
            for d in names:
                cells = []
                for m in present:
                    v = means[m][d]
                    cells.append(f"{v[metrics[0]]:.3f}" + (f" / {v[main]:.3f}"
                                                          if main != metrics[0] else ""))
                lines.append(f"| {d} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _targets(means, names, ours, family, present):
    """Issue 15's targets for ``ours`` on one family: met or not, with the numbers."""
    def mean(m, k):
        return float(np.mean([means[m][d][k] for d in names]))

    first = "accuracy" if family != "regression" else "r2"
    checks = [(f"mean {first} >= hgb", mean(ours, first), mean("hgb", first),
               mean(ours, first) >= mean("hgb", first))]
    if family != "regression":
        checks += [
            ("mean roc_auc >= hgb", mean(ours, "roc_auc"), mean("hgb", "roc_auc"),
             mean(ours, "roc_auc") >= mean("hgb", "roc_auc")),
            ("mean log_loss <= hgb", mean(ours, "log_loss"), mean("hgb", "log_loss"),
             mean(ours, "log_loss") <= mean("hgb", "log_loss")),
            ("mean accuracy >= linear - 0.01", mean(ours, "accuracy"), mean("linear", "accuracy"),
             mean(ours, "accuracy") >= mean("linear", "accuracy") - 0.01),
        ]
        if "catboost" in present:
            checks += [(f"moonshot: mean {k} >= catboost", mean(ours, k), mean("catboost", k),
                        mean(ours, k) >= mean("catboost", k)) for k in ("accuracy", "roc_auc")]
    elif "catboost" in present:
        checks.append(("moonshot: mean r2 >= catboost", mean(ours, "r2"), mean("catboost", "r2"),
                       mean(ours, "r2") >= mean("catboost", "r2")))
    share = np.mean([means[ours][d][first] >= means["knn"][d][first] for d in names])
    checks.append((f"{first} >= knn on >= 90% of datasets", share, 0.9, share >= 0.9))
    out = ["| target | ours | reference | met |", "| --- | --- | --- | --- |"]
    out += [f"| {name} | {a:.4f} | {b:.4f} | {'yes' if ok else 'NO'} |"
            for name, a, b, ok in checks]
    return "\n".join(out)


def blas_kernel():
    try:
        from threadpoolctl import threadpool_info

        return [(i.get("internal_api"), i.get("architecture"), i.get("num_threads"))
                for i in threadpool_info()]
    except ImportError:  # threadpoolctl missing: say so rather than fail the benchmark
        return "unknown"


def timing(datasets, models, recipe, threads, repeats, variants=None):
    """Median fit time of each model on each whole dataset, runs interleaved across models so
    that load on the machine hits them alike; ratios against the first model. Wall and process
    CPU time: at one thread the CPU time hardly depends on what else the machine runs.
    ``variants`` maps a tag to recipe overrides for a model ``attention:TAG``."""
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(threads)
    with threadpool_limits(threads):
        print(f"BLAS: {blas_kernel()}; torch threads {torch.get_num_threads()}", flush=True)
        for dataset in datasets:
            X, y, spec = tds.load(dataset)
            task = "regression" if spec.family == "regression" else "classification"
            times = {m: [] for m in models}
            cpu = {m: [] for m in models}
            for r in range(repeats):
                for m in models:
                    tag = m.partition(":")[2]
                    model = make_model(m, task, r, X, threads,
                                       {**recipe, **(variants or {}).get(tag, {})})
                    start, start_cpu = time.perf_counter(), time.process_time()
                    model.fit(X, y)
                    times[m].append(time.perf_counter() - start)
                    cpu[m].append(time.process_time() - start_cpu)
            base, base_cpu = np.median(times[models[0]]), np.median(cpu[models[0]])
            print(f"{dataset} ({X.shape[0]} x {X.shape[1]}): " + ", ".join(
                f"{m} {np.median(t):.2f}s (x{np.median(t) / base:.2f}, runs "
                f"{' '.join(f'{v:.1f}' for v in t)}; CPU {np.median(cpu[m]):.2f}s, "
                f"x{np.median(cpu[m]) / base_cpu:.2f})" for m, t in times.items()), flush=True)


def _store(out_path, dataset, model, seed, row):
    """Add one result to the JSON under an exclusive lock (runs may share the file)."""
    with open(out_path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        results = json.loads(out_path.read_text()) if out_path.exists() else {}
        results.setdefault(dataset, {}).setdefault(model, {})[str(seed)] = row
        tmp = out_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(results, indent=1, sort_keys=True))
        tmp.replace(out_path)
    return results


def _overrides(items):
    """``k=v`` strings as a recipe dict (values parsed as JSON, else kept as strings)."""
    recipe = {}
    for item in items:
        key, _, value = item.partition("=")
        try:
            recipe[key] = json.loads(value)
        except ValueError:  # a bare word: a string option
            recipe[key] = value
    return recipe


def _set_constants(items):
    """Apply ``module:NAME=value`` overrides (``value`` a Python literal) to module constants
    before any model is built: defaults that are not estimator parameters, e.g.
    ``skattention.neighbors._base:_TABULAR_BATCH=512`` (store such runs under a tag)."""
    for item in items:
        target, _, value = item.partition("=")
        module, _, name = target.partition(":")
        mod = importlib.import_module(module)
        if not hasattr(mod, name):
            raise SystemExit(f"--set: {module} has no {name}")
        setattr(mod, name, ast.literal_eval(value))
        print(f"set {module}.{name} = {getattr(mod, name)!r}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--datasets", default=None, help="comma-separated names")
    parser.add_argument("--family", default=None, choices=tds.FAMILIES)
    parser.add_argument("--split", default=None, choices=("dev", "heldout"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--recipe", nargs="*", default=[], help="k=v overrides of the lab recipe")
    parser.add_argument("--tag", default=None, help="store attention results as attention:TAG")
    parser.add_argument("--ours", default="attention", help="model whose wins are counted")
    parser.add_argument("--baselines", default=",".join(BASELINES),
                        help="baselines shown in the summary")
    parser.add_argument("--quick", action="store_true", help="3 small datasets, 1 seed")
    parser.add_argument("--force", action="store_true", help="recompute cached results")
    parser.add_argument("--report", action="store_true", help="only print the summary")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--timing", action="store_true",
                        help="fit each model on whole datasets (<= 10,000 rows), --repeats "
                             "times interleaved, and print median fit times (nothing cached)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variant", nargs="+", action="append", default=[],
                        metavar=("TAG", "K=V"),
                        help="with --timing: recipe overrides of a model attention:TAG")
    parser.add_argument("--set", nargs="*", default=[], metavar="MODULE:NAME=VALUE",
                        help="override module constants (defaults that are not estimator "
                             "parameters), e.g. skattention.neighbors._base:_TABULAR_BATCH=512")
    parser.add_argument("--also", nargs="*", default=[],
                        help="other result files merged into the summary (read only)")
    args = parser.parse_args()

    datasets = (args.datasets.split(",") if args.datasets else
                tds.names(args.family, args.split))
    seeds = args.seeds
    if args.quick:
        datasets, seeds = [d for d in datasets if d in QUICK] or list(QUICK), [0]
    models = args.models.split(",")
    recipe = _overrides(args.recipe)
    variants = {tag: _overrides(items) for tag, *items in args.variant}
    if args.tag:
        models = [f"attention:{args.tag}" if m == "attention" else m for m in models]
    _set_constants(args.set)
    out_path = pathlib.Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(out_path.read_text()) if out_path.exists() else {}

    if args.timing:
        return timing(datasets, models, recipe, args.threads, args.repeats, variants)
    if not args.report:
        import torch
        from threadpoolctl import threadpool_limits

        torch.set_num_threads(args.threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
        print(f"BLAS: {blas_kernel()}; torch threads {torch.get_num_threads()}", flush=True)
        with threadpool_limits(args.threads):
            for dataset in datasets:
                for model in models:
                    for seed in seeds:
                        done = results.get(dataset, {}).get(model, {}).get(str(seed))
                        if done is not None and not args.force:
                            continue
                        try:
                            row = evaluate(model, dataset, seed, args.threads, recipe)
                        except ImportError as exc:
                            print(f"skip {model}: {exc}", flush=True)
                            break
                        if recipe and (model.startswith("attention") or ":" in model):
                            row["recipe"] = recipe
                        results = _store(out_path, dataset, model, seed, row)
                        main_metric = next(k for k in ("accuracy", "r2") if k in row)
                        auc = f" auc {row['roc_auc']:.4f}" if "roc_auc" in row else ""
                        print(f"{dataset} {model} seed {seed}: {main_metric} "
                              f"{row[main_metric]:.4f}{auc} fit {row['fit_s']:.2f}s", flush=True)
    shown = [m for m in dict.fromkeys(
        args.baselines.split(",") + ["skattention_v0"] + models + [args.ours])]
    merged = {}
    for path in [*args.also, args.out]:
        path = pathlib.Path(path)
        for dataset, runs in (json.loads(path.read_text()) if path.exists() else {}).items():
            for model, per_seed in runs.items():
                merged.setdefault(dataset, {}).setdefault(model, {}).update(per_seed)
    if args.also:
        shown += [m for d in merged.values() for m in d if m not in shown and m in models]
    text = summary(merged, shown, args.ours, seeds, datasets)
    print(text)
    if not args.quick and not args.datasets:
        (out_path.with_suffix(".md")).write_text(
            "# Tabular benchmark (generated by benchmarks/bench_tabular.py)\n" + text + "\n")


if __name__ == "__main__":
    main()
