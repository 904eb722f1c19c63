"""Accuracy of MetricAttentionClassifier (defaults) against k-NN, NCA+k-NN, logistic regression and
histogram gradient boosting on real offline datasets, plus the four `metric` variants.

    python benchmarks/bench_accuracy.py                        # every dataset in datasets.ALL
    python benchmarks/bench_accuracy.py --datasets wine,digits --seeds 0 1 2

Every model sees the same stratified 75/25 splits (one per seed); accuracy is averaged over seeds.
Scale-sensitive baselines get a StandardScaler; the attention estimators standardise internally
(learned metrics) or get the scaler too (``euclidean``). NCA is skipped above ``--nca-max-n``
training rows (its full-batch gradient holds an n x n matrix). Torch and BLAS use ``--threads``.
"""

import argparse
import json
import pathlib
import time

import numpy as np
from datasets import ALL, load


def models(seed, nca_ok):
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.neighbors import KNeighborsClassifier, NeighborhoodComponentsAnalysis
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from skattention import MetricAttentionClassifier

    out = {
        "knn": make_pipeline(StandardScaler(), KNeighborsClassifier(5)),
        "logreg": make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)),
        "hgb": HistGradientBoostingClassifier(random_state=seed),
        "attention (defaults: mlp)": MetricAttentionClassifier(random_state=seed),
        "attention linear": MetricAttentionClassifier("linear", random_state=seed),
        "attention dot": MetricAttentionClassifier("dot", random_state=seed),
        "attention euclidean": make_pipeline(
            StandardScaler(), MetricAttentionClassifier("euclidean")
        ),
    }
    if nca_ok:
        out["nca+knn"] = make_pipeline(
            StandardScaler(),
            NeighborhoodComponentsAnalysis(random_state=seed),
            KNeighborsClassifier(5),
        )
    return out


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--datasets", default=",".join(ALL))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--nca-max-n", type=int, default=6000)
    parser.add_argument(
        "--out", default=str(pathlib.Path(__file__).parent / "results" / "bench_accuracy.json")
    )
    args = parser.parse_args()

    import torch
    from sklearn.model_selection import train_test_split
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(args.threads)
    out_path = pathlib.Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(out_path.read_text()) if out_path.exists() else {}
    with threadpool_limits(args.threads):
        for name in args.datasets.split(","):
            X, y = load(name)
            rows = {}
            for seed in args.seeds:
                Xtr, Xte, ytr, yte = train_test_split(
                    X, y, test_size=0.25, random_state=seed, stratify=y
                )
                for label, model in models(seed, len(Xtr) <= args.nca_max_n).items():
                    start = time.perf_counter()
                    model.fit(Xtr, ytr)
                    fit_s = time.perf_counter() - start
                    acc = float(np.mean(model.predict(Xte) == yte))
                    rows.setdefault(label, {"acc": [], "fit_s": []})
                    rows[label]["acc"].append(acc)
                    rows[label]["fit_s"].append(fit_s)
            summary = {
                k: {
                    "accuracy": float(np.mean(v["acc"])),
                    "fit_s": float(np.median(v["fit_s"])),
                    "per_seed": v["acc"],
                }
                for k, v in rows.items()
            }
            results[name] = {
                "n": int(X.shape[0]),
                "d": int(X.shape[1]),
                "classes": int(len(np.unique(y))),
                "seeds": args.seeds,
                "models": summary,
            }
            line = ", ".join(
                f"{k} {v['accuracy']:.4f} ({v['fit_s']:.1f}s)" for k, v in summary.items()
            )
            print(f"{name} {X.shape}: {line}", flush=True)
            out_path.write_text(json.dumps(results, indent=2))
    _report(results)


def _report(results):
    """Wins against k-NN and mean accuracy against HGB over the datasets present."""
    names = [n for n in results if "attention (defaults: mlp)" in results[n]["models"]]
    att = np.array([results[n]["models"]["attention (defaults: mlp)"]["accuracy"] for n in names])
    knn = np.array([results[n]["models"]["knn"]["accuracy"] for n in names])
    hgb = np.array([results[n]["models"]["hgb"]["accuracy"] for n in names])
    print(
        f"\n{len(names)} datasets: attention beats k-NN on {int(np.sum(att > knn))}, "
        f"ties {int(np.sum(att == knn))}; "
        f"mean accuracy attention {att.mean():.4f}, HGB {hgb.mean():.4f}, k-NN {knn.mean():.4f}"
    )
    for variant in [
        "attention linear",
        "attention dot",
        "attention euclidean",
        "logreg",
        "nca+knn",
    ]:
        vals = [
            results[n]["models"][variant]["accuracy"]
            for n in names
            if variant in results[n]["models"]
        ]
        print(f"  {variant}: mean {np.mean(vals):.4f} over {len(vals)} datasets")


if __name__ == "__main__":
    main()
