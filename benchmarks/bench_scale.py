"""Scale benchmark (issue 34): fit, predict, single-row latency, peak memory and scores of the
default estimators against gradient boosting on real tables of 40,000-1.4M rows and on a
synthetic 1,000,000 x 20 case.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_scale.py \\
        --models hgb,lightgbm,catboost --split all              # baselines, every table
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_scale.py \\
        --models hgb,skattention --split dev --max-rows 50000 --timeout 900
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_scale.py \\
        --datasets synthetic-1m --models hgb,skattention
    python benchmarks/bench_scale.py --report                   # tables from the stored JSON

Datasets, their DEV / HELD-OUT split and the synthetic generator are in ``scale_datasets.py``;
``--split all`` adds ``synthetic-1m`` to the real tables. Each table is split 75/25 once
(``random_state=0``, stratified for classes) after an optional ``--max-rows`` subsample (stored
under ``NAME@ROWS``); the synthetic case trains on ``--synthetic-rows`` rows and predicts
``--synthetic-test-rows`` more (stored as ``synthetic-1m@ROWS`` unless 1,000,000).

Every (dataset, model, repeat) runs in a fresh subprocess, so that the memory figure is the
process's own: after loading and splitting the data and building the model (its library
imported), the process resets its resident-set high-water mark (``/proc/self/clear_refs``) and
records the resident set; it then fits, predicts the whole test split (``predict_proba`` for
classes, the labels being its argmax; ``predict`` for regression) and predicts single rows
(``--latency-calls`` one-row DataFrames from the test split, after one warm-up call, stopped
after ``--latency-budget`` seconds; the median is reported). ``peak_mb`` is the high-water mark
over all of that (interpreter, libraries and data included: what the user's process needs) and
``extra_mb`` the part above the resident set before ``fit``. Each phase is written to a file as
it ends, so a run that passes ``--timeout`` seconds (the whole subprocess) is killed and stored
as a timeout with the phases it finished.

Models (``bench_tabular.make_model``, one input handling per baseline): ``skattention`` (the
library's default ``MetricAttentionClassifier`` / ``MetricAttentionRegressor``,
``random_state=0``, on the raw frame; ``skattention:TAG`` with ``--recipe k=v ...``), ``hgb``
(HistGradientBoosting defaults, ``categorical_features="from_dtype"`` with string columns cast
to ``category``), ``lightgbm`` and ``catboost`` defaults (``pip install lightgbm catboost``;
benchmark-only), and ``knn`` (k=5 behind a one-hot ColumnTransformer: dense, so it needs
rows x levels floats; not in the default list). ``--threads`` (default: the CPUs this process
may use) goes to OpenMP, BLAS, torch, LightGBM and CatBoost alike.

Scores: accuracy, ROC-AUC (macro one-vs-rest for multiclass) and log-loss for classes; R^2 and
RMSE for regression (on the log target where ``log_target``). Timings are medians over
``--repeats`` runs; scores come from the first run (every run uses the same seed). Results go
to ``results/scale.json`` (a run skips what is stored unless ``--force``) and the tables with
ratios to HistGradientBoosting to ``results/scale.md``; every row records the machine, the load
average before and after it, the library versions and the thread pools (threadpoolctl).

numpy/scikit-learn timings need OpenBLAS's own kernel choice: the script refuses to time with
``OPENBLAS_CORETYPE`` or ``OPENBLAS_L2_SIZE`` set (they pin an older kernel on some machines,
docs/performance.md) unless ``--allow-pinned-openblas``.
"""

import argparse
import json
import os
import pathlib
import platform
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import scale_datasets as sds  # noqa: E402 (after the sys.path insert)

RESULTS = HERE / "results" / "scale.json"
DEFAULT_MODELS = ("hgb", "lightgbm", "catboost", "skattention")
PINNED_OPENBLAS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
SYNTHETIC_ROWS = 1_000_000
ISSUE_MAX_ROWS = 350_000  # issue 34's targets are for tables of 40k-330k rows


def dataset_key(dataset, max_rows, synthetic_rows):
    """Where a run is stored: the name, with ``@ROWS`` when the rows differ from the table's."""
    if dataset == sds.SYNTHETIC:
        return dataset if synthetic_rows == SYNTHETIC_ROWS else f"{dataset}@{synthetic_rows}"
    return dataset if max_rows is None else f"{dataset}@{max_rows}"


def thread_pools():
    """threadpoolctl's view of the loaded thread pools, one short line each."""
    from threadpoolctl import threadpool_info

    return [f"{p.get('user_api')}:{p.get('internal_api')} {p.get('version')} "
            f"arch={p.get('architecture')} threads={p.get('num_threads')}"
            for p in threadpool_info()]


def machine():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):  # not Linux: keep platform's name
        pass
    return {"cpu": cpu, "cpus": os.cpu_count(), "host": platform.node()}


# ---------------------------------------------------------------- one run, in a subprocess

def _status_kb(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _reset_peak():
    """Reset the resident-set high-water mark to the current resident set (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:  # not allowed here: the peak then includes loading the data
        return False


def _data(job):
    """``(X_train, X_test, y_train, y_test, spec, facts)`` of a job."""
    from sklearn.model_selection import train_test_split

    if job["dataset"] == sds.SYNTHETIC:
        n_train = job["synthetic_rows"]
        X, y = sds.synthetic(n_train + job["synthetic_test_rows"])
        facts = sds.describe(sds.SYNTHETIC, X, y)
        return (X.iloc[:n_train], X.iloc[n_train:], y[:n_train], y[n_train:],
                sds.SYNTHETIC_SPEC, facts)
    X, y, spec = sds.load(job["dataset"], job["max_rows"])
    clf = spec.family != "regression"
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=0,
                                          stratify=y if clf else None)
    return Xtr, Xte, ytr, yte, spec, sds.describe(job["dataset"], X, y)


def scores(y_true, clf, classes=None, proba=None, pred=None):
    """Accuracy, ROC-AUC (macro OvR for multiclass) and log-loss; or R^2 and RMSE."""
    from sklearn.metrics import accuracy_score, log_loss, r2_score, roc_auc_score

    if not clf:
        rmse = float(np.sqrt(np.mean((np.asarray(y_true, float) - pred) ** 2)))
        return {"r2": float(r2_score(y_true, pred)), "rmse": rmse}
    order = np.argsort(classes)  # CatBoost keeps classes in order of appearance
    classes, proba = np.asarray(classes)[order], proba[:, order]
    proba = np.clip(proba, 1e-15, 1.0)
    proba /= proba.sum(1, keepdims=True)
    out = {"accuracy": float(accuracy_score(y_true, classes[proba.argmax(1)])),
           "log_loss": float(log_loss(y_true, proba, labels=classes))}
    if classes.size == 2:
        out["roc_auc"] = float(roc_auc_score(y_true == classes[1], proba[:, 1]))
    else:
        out["roc_auc"] = float(roc_auc_score(y_true, proba, multi_class="ovr",
                                             average="macro", labels=classes))
    return out


def _latency(predict, X_test, calls, budget_s):
    """Median seconds of one-row predictions (after a warm-up call) and the number of calls."""
    rows = [X_test.iloc[[i % len(X_test)]] for i in range(calls)]
    predict(rows[0])
    times, stop = [], time.perf_counter() + budget_s
    for row in rows:
        start = time.perf_counter()
        predict(row)
        times.append(time.perf_counter() - start)
        if len(times) >= 10 and time.perf_counter() > stop:
            break
    return float(np.median(times)), len(times)


def worker(job, progress_path):
    """Run one job and write its row to ``progress_path`` after each phase."""
    import bench_tabular
    from threadpoolctl import threadpool_limits

    threads = job["threads"]
    bench_tabular._set_constants(job["set"])
    row = {"status": "running", "phase": "load", "machine": machine(), "threads": threads,
           "loadavg_start": os.getloadavg()}

    def write(**fields):
        row.update(fields)
        tmp = pathlib.Path(progress_path + ".tmp")
        tmp.write_text(json.dumps(row))
        tmp.replace(progress_path)

    with threadpool_limits(threads):
        Xtr, Xte, ytr, yte, spec, facts = _data(job)
        clf = spec.family != "regression"
        task = "classification" if clf else "regression"
        model = bench_tabular.make_model(job["model"], task, 0, Xtr, threads, job["recipe"])
        if "torch" in sys.modules:  # imported by the model only: the others' memory stays theirs
            sys.modules["torch"].set_num_threads(threads)
        write(dataset=facts, n_train=len(Xtr), n_test=len(Xte), phase="fit",
              rss_after_load_mb=_status_kb("VmRSS") / 1024,
              peak_load_mb=_status_kb("VmHWM") / 1024)
        reset = _reset_peak()
        rss_before = _status_kb("VmRSS") / 1024
        start, cpu = time.perf_counter(), time.process_time()
        model.fit(Xtr, ytr)
        write(fit_s=time.perf_counter() - start, fit_cpu_s=time.process_time() - cpu,
              phase="predict", peak_reset=reset, rss_before_fit_mb=rss_before,
              peak_fit_mb=_status_kb("VmHWM") / 1024)
        predict = model.predict_proba if clf else model.predict
        start = time.perf_counter()
        out = np.asarray(predict(Xte), dtype=np.float64)
        write(predict_s=time.perf_counter() - start, phase="latency")
        latency_s, calls = _latency(predict, Xte, job["latency_calls"], job["latency_budget"])
        peak = _status_kb("VmHWM") / 1024
        found = (scores(yte, True, model.classes_, proba=out) if clf
                 else scores(yte, False, pred=out.ravel()))
        info = {}
        if hasattr(model, "n_iter_"):  # the library's estimators: epochs and temperature
            info = {"n_iter": int(model.n_iter_), "temperature": float(model.temperature_)}
        write(latency_ms=latency_s * 1e3, latency_calls=calls, peak_mb=peak,
              extra_mb=peak - rss_before, **found, info=info, status="ok", phase="done",
              loadavg_end=os.getloadavg(), thread_pools=thread_pools(),
              versions=_versions(), recipe=job["recipe"], set=job["set"])


def _versions():
    import importlib.metadata as md

    out = {}
    for package in ("skattention", "scikit-learn", "numpy", "torch", "lightgbm", "catboost"):
        try:
            out[package] = md.version(package)
        except md.PackageNotFoundError:
            out[package] = None
    return out


def run_job(job, timeout_s):
    """Run ``job`` in a fresh process; its row, marked "timeout" or "error" when it failed."""
    with tempfile.TemporaryDirectory() as tmp:
        progress = os.path.join(tmp, "row.json")
        env = dict(os.environ, OMP_NUM_THREADS=str(job["threads"]),
                   PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
        cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", json.dumps(job),
               "--progress", progress]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=timeout_s)
            failure = None if proc.returncode == 0 else f"exit {proc.returncode}: {err[-2000:]}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the worker's session: its own children too
            proc.communicate()
            failure = "timeout"
        row = json.loads(pathlib.Path(progress).read_text()) if os.path.exists(progress) else {}
    if failure == "timeout":
        row.update(status="timeout", timeout_s=timeout_s)
    elif failure is not None:
        row.update(status="error", error=failure)
    row["job"] = job
    return row


# ---------------------------------------------------------------- tables

CLASS_SCORES = ("accuracy", "roc_auc", "log_loss")
REGRESSION_SCORES = ("r2", "rmse")
TIMINGS = ("fit_s", "fit_cpu_s", "predict_s", "latency_ms", "peak_mb", "extra_mb")


def aggregate(runs):
    """One model's runs on one table: median timings and memory over the runs that finished,
    scores of the first; or the first failure with the phases it finished."""
    ordered = [runs[k] for k in sorted(runs, key=int)]
    done = [r for r in ordered if r.get("status") == "ok"]
    if not done:
        return ordered[0]
    out = {k: float(np.median([r[k] for r in done])) for k in TIMINGS}
    out.update({k: v for k, v in done[0].items() if k not in out})
    out["runs"] = len(done)
    return out


def _fmt(value, digits=2):
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _count(value):
    return f"{value:,}" if isinstance(value, int) else "-"


def _ratio(row, base, key):
    if row.get(key) is None or base is None or not base.get(key):
        return "-"
    return f"{row[key] / base[key]:.1f}x"


def _failure(row):
    done = [k for k in ("fit_s", "predict_s") if k in row]
    finished = ", ".join(f"{k[:-2]} {row[k]:.1f}s" for k in done)
    phase = row.get("phase", "start-up")
    return f"{row.get('status')} in {phase}" + (f" ({finished})" if finished else "")


def _table(results, keys, models, clf):
    metrics = CLASS_SCORES if clf else REGRESSION_SCORES
    head = ("| dataset | n_train | model | fit s | fit / hgb | predict s | predict / hgb | "
            "1-row ms | peak MB | extra MB | peak / hgb | " + " | ".join(metrics) + " |")
    lines = [head, "|" + " --- |" * (11 + len(metrics))]
    for key in keys:
        rows = {m: aggregate(results[key][m]) for m in models if m in results[key]}
        base = rows.get("hgb") if rows.get("hgb", {}).get("status") == "ok" else None
        for m, row in rows.items():
            n_train = _count(row.get("n_train"))
            if row.get("status") != "ok":
                lines.append(f"| {key} | {n_train} | {m} | {_failure(row)} |"
                             + " |" * (7 + len(metrics)))
                continue
            cells = [_fmt(row["fit_s"]), _ratio(row, base, "fit_s"), _fmt(row["predict_s"], 3),
                     _ratio(row, base, "predict_s"), _fmt(row["latency_ms"]),
                     _fmt(row["peak_mb"]), _fmt(row["extra_mb"]), _ratio(row, base, "peak_mb")]
            cells += [_fmt(row.get(k), 4) for k in metrics]
            lines.append(f"| {key} | {n_train} | {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _summary(results, keys, models):
    """Per model, over the tables where it and hgb both finished: ratios and mean scores."""
    lines = ["| model | tables | failed | fit / hgb (geo. mean, max) | predict / hgb (geo. mean, "
             "max) | 1-row ms (median) | peak MB (max) | accuracy (hgb) | ROC-AUC (hgb) | "
             "log-loss (hgb) | R^2 (hgb) |", "|" + " --- |" * 11]
    for m in models:
        pairs, failed = [], 0
        for key in keys:
            if m not in results[key] or "hgb" not in results[key]:
                continue
            row, base = aggregate(results[key][m]), aggregate(results[key]["hgb"])
            if row.get("status") != "ok":
                failed += 1
            elif base.get("status") == "ok":
                pairs.append((row, base))
        if not pairs:
            continue
        cells = [str(len(pairs)), str(failed)]
        for k in ("fit_s", "predict_s"):
            r = np.array([row[k] / base[k] for row, base in pairs])
            cells.append(f"{np.exp(np.log(r).mean()):.1f}x, {r.max():.1f}x")
        cells.append(_fmt(float(np.median([row["latency_ms"] for row, _ in pairs]))))
        cells.append(_fmt(max(row["peak_mb"] for row, _ in pairs)))
        for k in ("accuracy", "roc_auc", "log_loss", "r2"):
            both = [(row[k], base[k]) for row, base in pairs if k in row]
            if both:
                ours_mean, hgb_mean = (np.mean([p[i] for p in both]) for i in (0, 1))
                cells.append(f"{ours_mean:.4f} ({hgb_mean:.4f})")
            else:
                cells.append("-")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _facts(results, key):
    """The dataset facts stored with any run on ``key`` (None if no run got past loading)."""
    return next((r["dataset"] for runs in results[key].values() for r in runs.values()
                 if "dataset" in r), None)


def _targets(results, keys, ours):
    """Issue 34's targets for ``ours`` on the real tables of its range (at most
    ``ISSUE_MAX_ROWS`` rows) where it and hgb both ran."""
    keys = [k for k in keys if (_facts(results, k) or {}).get("rows", 0) <= ISSUE_MAX_ROWS]
    pairs = [(aggregate(results[k][ours]), aggregate(results[k]["hgb"])) for k in keys
             if ours in results[k] and "hgb" in results[k]]
    if not pairs:
        return ""
    ok = all(r.get("status") == "ok" for r, _ in pairs)
    pairs = [(r, b) for r, b in pairs if r.get("status") == "ok" and b.get("status") == "ok"]

    def worst(k):
        return max(r[k] / b[k] for r, b in pairs) if pairs else float("nan")

    def mean(k, which):
        vals = [p[which][k] for p in pairs if k in p[which]]
        return float(np.mean(vals)) if vals else None

    checks = [("every run finished within the timeout", ok, "")]
    for k, name in (("fit_s", "fit"), ("predict_s", "predict (test split)")):
        checks.append((f"{name} <= 20x hgb on every table", worst(k) <= 20,
                       f"worst {worst(k):.1f}x"))
    peak = max((r["peak_mb"] for r, _ in pairs), default=float("nan"))
    checks.append(("peak memory <= 1.5 GB (1,536 MB)", peak <= 1536, f"max {peak:,.0f} MB"))
    for k in ("accuracy", "roc_auc", "r2"):
        a, b = mean(k, 0), mean(k, 1)
        if a is not None:
            checks.append((f"mean {k} >= hgb", a >= b, f"{a:.4f} vs {b:.4f}"))
    lines = [f"Issue 34's targets for `{ours}` on the {len(pairs)} of these tables with at most "
             f"{ISSUE_MAX_ROWS:,} rows:", "",
             "| target | met | figures |", "| --- | --- | --- |"]
    lines += [f"| {name} | {'yes' if met else 'NO'} | {fig} |" for name, met, fig in checks]
    return "\n".join(lines)


def _synthetic(results, keys, models):
    lines = ["| case | n_train | n_test | model | fit s | predict s | 1-row ms | peak MB | "
             "accuracy | ROC-AUC | targets (fit <= 600 s, predict <= 30 s, 1-row <= 2 ms) |",
             "|" + " --- |" * 11]
    for key in keys:
        for m in models:
            if m not in results[key]:
                continue
            row = aggregate(results[key][m])
            if row.get("status") != "ok":
                lines.append(f"| {key} | {_count(row.get('n_train'))} | | {m} | {_failure(row)} |"
                             + " |" * 6)
                continue
            met = [row["fit_s"] <= 600, row["predict_s"] <= 30, row["latency_ms"] <= 2]
            lines.append(
                f"| {key} | {row['n_train']:,} | {row['n_test']:,} | {m} | {_fmt(row['fit_s'])} | "
                f"{_fmt(row['predict_s'], 3)} | {_fmt(row['latency_ms'])} | "
                f"{_fmt(row['peak_mb'])} | {row['accuracy']:.4f} | {row['roc_auc']:.4f} | "
                + " ".join("yes" if x else "NO" for x in met) + " |")
    return "\n".join(lines)


def _conditions(results):
    rows = [r for per_model in results.values() for runs in per_model.values()
            for r in runs.values() if "machine" in r]
    if not rows:
        return ""
    loads = [x for r in rows for x in (r.get("loadavg_start", [None])[0],
                                        (r.get("loadavg_end") or [None])[0]) if x is not None]
    cpus = {f"{r['machine']['cpu']} ({r['machine']['cpus']} CPUs)" for r in rows}
    threads = sorted({r["threads"] for r in rows})
    pools = sorted({p for r in rows for p in r.get("thread_pools", [])})
    versions = next((r["versions"] for r in reversed(rows) if "versions" in r), {})
    return (f"Machine: {'; '.join(sorted(cpus))}; threads {threads}. 1-minute load average at "
            f"the start and end of the runs: {min(loads):.1f} to {max(loads):.1f} (timings "
            f"taken under a load above the CPU count are noisy: compare ratios measured "
            f"together). Versions: {versions}. Thread pools: {pools}.")


def report(results, models, ours="skattention"):
    real = [k for k in results if k.split("@")[0] in sds.DATASETS]
    synth = [k for k in results if k.split("@")[0] == sds.SYNTHETIC]
    models = list(dict.fromkeys([*models, *(m for k in results for m in results[k])]))
    out = ["# Scale benchmark (generated by benchmarks/bench_scale.py)", "", _conditions(results),
           "", "## Datasets", "", _dataset_table(results, real + synth)]
    for title, clf in (("Classification", True), ("Regression", False)):
        keys = [k for k in real if (sds.DATASETS[k.split("@")[0]].family != "regression") == clf]
        if keys:
            out += ["", f"## {title}", "", _table(results, keys, models, clf)]
    for group in sorted({"@" in k for k in real}):
        keys = [k for k in real if ("@" in k) == group]
        label = "subsampled tables (NAME@ROWS)" if group else "whole tables"
        out += ["", f"## Summary: {label}", "", _summary(results, keys, models)]
        if ours in models:
            out += ["", _targets(results, keys, ours)]
    if synth:
        out += ["", "## Synthetic", "", _synthetic(results, synth, models)]
    return "\n".join(out) + "\n"


def _dataset_table(results, keys):
    lines = ["| dataset | family | split | rows | columns | string columns | missing | classes "
             "| target | note |", "|" + " --- |" * 10]
    for key in keys:
        facts = _facts(results, key)
        if facts is None:
            continue
        target = (facts.get("target") or "-") + (" (log)" if facts.get("log_target") else "")
        lines.append(f"| {key} | {facts['family']} | {facts['split']} | {facts['rows']:,} | "
                     f"{facts['columns']} | {facts['string_columns']} | "
                     f"{facts['missing_share']:.1%} | {facts.get('classes', '-')} | {target} | "
                     f"{facts['note']} |")
    return "\n".join(lines)


# ---------------------------------------------------------------- main

def _parser():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--datasets", default=None,
                        help=f"comma-separated names (of scale_datasets.py, or {sds.SYNTHETIC})")
    parser.add_argument("--split", default="all", choices=("dev", "heldout", "all"),
                        help=f"real tables of one split; 'all' adds {sds.SYNTHETIC}")
    parser.add_argument("--max-rows", type=int, default=None,
                        help="subsample each real table to at most this many rows (stratified)")
    parser.add_argument("--synthetic-rows", type=int, default=SYNTHETIC_ROWS)
    parser.add_argument("--synthetic-test-rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds per run (one fresh process: load, fit, predict, latency)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--latency-calls", type=int, default=200)
    parser.add_argument("--latency-budget", type=float, default=30.0,
                        help="seconds after which the single-row calls stop (at least 10)")
    parser.add_argument("--recipe", nargs="*", default=[],
                        help="k=v estimator parameters of the models skattention:TAG")
    parser.add_argument("--set", nargs="*", default=[], metavar="MODULE:NAME=VALUE",
                        help="module constants to override in each run (bench_tabular's --set)")
    parser.add_argument("--ours", default="skattention",
                        help="the model whose issue-34 targets the report checks")
    parser.add_argument("--force", action="store_true", help="rerun stored runs")
    parser.add_argument("--report", action="store_true", help="only write the tables")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--allow-pinned-openblas", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--progress", help=argparse.SUPPRESS)
    return parser


def _datasets(args):
    if args.datasets:
        chosen = args.datasets.split(",")
        unknown = [d for d in chosen if d not in sds.DATASETS and d != sds.SYNTHETIC]
        if unknown:
            raise SystemExit(f"unknown datasets {unknown}; known: {[*sds.DATASETS, sds.SYNTHETIC]}")
        return chosen
    if args.split == "all":
        return [*sds.names(), sds.SYNTHETIC]
    return sds.names(split=args.split)


def main(argv=None):
    args = _parser().parse_args(argv)
    if args.worker:
        return worker(json.loads(args.worker), args.progress)
    import bench_tabular

    out_path = pathlib.Path(args.out)
    models = args.models.split(",")
    if not args.report:
        pinned = {k: os.environ[k] for k in PINNED_OPENBLAS if k in os.environ}
        if pinned and not args.allow_pinned_openblas:
            raise SystemExit(
                f"{pinned} pins OpenBLAS's kernel, which distorts numpy/scikit-learn timings: "
                "run under `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE` (or pass "
                "--allow-pinned-openblas and say so with the figures)")
        import sklearn.ensemble  # noqa: F401 (loads the OpenMP runtime threadpoolctl reports)
        import torch  # noqa: F401

        print(f"machine {machine()}; threads {args.threads}; pinned OpenBLAS: {pinned or 'no'}")
        print("thread pools of this process (threadpoolctl; each run limits them to "
              f"{args.threads}):\n  " + "\n  ".join(thread_pools()), flush=True)
        recipe = bench_tabular._overrides(args.recipe)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        for dataset in _datasets(args):
            key = dataset_key(dataset, args.max_rows, args.synthetic_rows)
            for model in models:
                for repeat in range(args.repeats):
                    stored = json.loads(out_path.read_text()) if out_path.exists() else {}
                    if str(repeat) in stored.get(key, {}).get(model, {}) and not args.force:
                        continue
                    job = {"dataset": dataset, "model": model, "max_rows": args.max_rows,
                           "synthetic_rows": args.synthetic_rows, "threads": args.threads,
                           "synthetic_test_rows": args.synthetic_test_rows,
                           "latency_calls": args.latency_calls, "set": args.set,
                           "latency_budget": args.latency_budget,
                           "recipe": recipe if ":" in model else {}}
                    row = run_job(job, args.timeout)
                    row["argv"] = sys.argv[1:]
                    bench_tabular._store(out_path, key, model, repeat, row)
                    print(_progress_line(key, model, repeat, row), flush=True)
    results = json.loads(out_path.read_text()) if out_path.exists() else {}
    text = report(results, models, args.ours)
    out_path.with_suffix(".md").write_text(text)
    print(text)


def _progress_line(key, model, repeat, row):
    if row.get("status") != "ok":
        return f"{key} {model} #{repeat}: {_failure(row)} {row.get('error', '')[-300:]}"
    score = next(f"{k} {row[k]:.4f}" for k in ("roc_auc", "r2") if k in row)
    return (f"{key} {model} #{repeat}: fit {row['fit_s']:.2f}s predict {row['predict_s']:.3f}s "
            f"1-row {row['latency_ms']:.2f}ms peak {row['peak_mb']:.0f}MB {score} "
            f"(load {row['loadavg_start'][0]:.1f})")


if __name__ == "__main__":
    main()
