"""float32 against float64 prediction of the same fitted default models, on the tabular sets.

    python benchmarks/bench_precision.py                  # DEV sets, seed 0
    python benchmarks/bench_precision.py --split heldout --seed 1

Learned metrics predict in float32 by default (the precision their map trains in). For each
dataset of the tabular benchmark (``tabular_datasets.py``) this fits the default estimator once
on the benchmark's 75/25 split, predicts the test rows in float32 (the default) and in float64
(``set_params(dtype="float64")``, the same fitted model), and prints the largest difference of
the outputs and both precisions' accuracy / ROC-AUC / log-loss (classification) or R²
(regression).
"""

import argparse
import json
import pathlib
import sys
import warnings

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_tabular as bt  # noqa: E402
import tabular_datasets as tds  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "precision.json"


def scores(model, Xte, yte, classification):
    from sklearn.metrics import log_loss, r2_score, roc_auc_score

    if not classification:
        pred = model.predict(Xte)
        return pred, {"r2": float(r2_score(yte, pred))}
    proba = model.predict_proba(Xte)
    clipped = np.clip(proba, 1e-15, 1)
    clipped /= clipped.sum(1, keepdims=True)
    classes = model.classes_
    if classes.size == 2:
        auc = roc_auc_score(yte == classes[1], proba[:, 1])
    else:
        auc = roc_auc_score(yte, proba, multi_class="ovr", labels=classes)
    return proba, {"accuracy": float((classes[proba.argmax(1)] == yte).mean()),
                   "roc_auc": float(auc), "log_loss": float(log_loss(yte, clipped, labels=classes))}


def main(argv=None):
    from sklearn.model_selection import train_test_split

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", default="dev", choices=("dev", "heldout"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--datasets", default=None, help="comma-separated names")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    rows = []
    names = args.datasets.split(",") if args.datasets else tds.names(split=args.split)
    for name in names:
        X, y, spec = tds.load(name)
        classification = spec.family != "regression"
        Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=args.seed,
                                              stratify=y if classification else None)
        model = bt.make_model("skattention", "classification" if classification else
                              "regression", args.seed, Xtr, None, {})
        model.fit(Xtr, ytr)
        out32, m32 = scores(model.set_params(dtype=None), Xte, yte, classification)
        out64, m64 = scores(model.set_params(dtype="float64"), Xte, yte, classification)
        row = {"dataset": name, "family": spec.family,
               "max_abs_diff": float(np.abs(out32 - out64).max()),
               "float32": m32, "float64": m64}
        rows.append(row)
        print(f"{spec.family:10s} {name:20s} max diff {row['max_abs_diff']:.2e}  " + "  ".join(
            f"{k} {m32[k]:.5f} / {m64[k]:.5f}" for k in m32), flush=True)
    pathlib.Path(args.out).write_text(json.dumps(
        {"split": args.split, "seed": args.seed, "results": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
