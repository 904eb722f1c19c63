"""Positional priors as learnable log-biases: a task where relative position is everything.

docs/theory.md ("Attention solves a convex problem"): a positional bias is the ``log p0`` term of
the attention problem, like a
mask. Task: read a sequence of random tokens and output, at every position ``i >= k``, the token
``k`` places back (``y_i = x_{i-k}``; k = 3 by default). The content of a token says nothing
about where to look, so the attention has to find the key at relative position ``-k``. Trained
on sequences of length L (16), tested on lengths up to 4L: the length-generalisation curve.

The same causal 2-layer pre-norm Transformer for every method (token embedding, 2 blocks of
``h += MetricAttention(LN h)`` and ``h += FFN(LN h)``, a linear read-out); every attention has a
:class:`~skattention.nn.CausalMask` prior, and the methods differ only in the positional
information:

none       no positional information at all (only what the causal mask implies)
absolute   learned absolute position embeddings added to the tokens (4L rows: the rows past L
           are never trained, as in any model tested beyond its training length)
t5         T5's learned relative position bias, ``RelativePositionBias(heads, 32, 128,
           bidirectional=False)`` (T5's decoder settings), one table per layer, as a ``prior``
           of the layer
t5-short   the same with 16 buckets and ``max_distance=16`` (= L): every distance from L on
           shares the last bucket, which training reaches, instead of buckets it never sees
alibi      ALiBi's fixed slopes, ``ALiBi(heads) + CausalMask()`` (the paper's causal form)

10 seeds per method (a seed sets the initialisation and the training sequences); the test
sequences are fixed. Fresh training sequences at every step (no overfitting to a finite set).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_relative_position.py            # ~6 min
    python benchmarks/bench_relative_position.py --plot   # table, docs/images/relative_position.png
    OMP_NUM_THREADS=1 python benchmarks/bench_relative_position.py --metric mlp --suffix _mlp

Results go to benchmarks/results/relative_position<suffix>.json.
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

from skattention.nn import ALiBi, CausalMask, MetricAttention, RelativePositionBias

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
IMAGES = ROOT / "docs" / "images"
METHODS = {
    "none": "no positions",
    "absolute": "learned absolute positions",
    "t5": "T5 relative bias (learned)",
    "t5-short": "T5 bias, buckets up to L",
    "alibi": "ALiBi (fixed slopes)",
}
CONFIG = dict(vocab=16, offset=3, train_length=16, test_lengths=[16, 24, 32, 48, 64],
              d_model=32, n_heads=4, n_layers=2, dim_ff=64, metric="dot", lr=3e-3, steps=600,
              batch_size=32, n_test=256)


def make_batch(generator, n, length, vocab, offset):
    """Random tokens and their targets: the token ``offset`` places back (-100: no target)."""
    x = torch.randint(vocab, (n, length), generator=generator)
    y = torch.full_like(x, -100)
    y[:, offset:] = x[:, :-offset]
    return x, y


def _prior(method, n_heads):
    if method == "t5":
        return RelativePositionBias(n_heads, 32, 128, bidirectional=False) + CausalMask()
    if method == "t5-short":
        return RelativePositionBias(n_heads, 16, 16, bidirectional=False) + CausalMask()
    if method == "alibi":
        return ALiBi(n_heads) + CausalMask()
    return CausalMask()


class Block(nn.Module):
    def __init__(self, method, d_model, n_heads, dim_ff, metric):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = MetricAttention(d_model, n_heads, metric, batch_first=True,
                                    prior=_prior(method, n_heads))
        self.ff = nn.Sequential(nn.Linear(d_model, dim_ff), nn.GELU(), nn.Linear(dim_ff, d_model))

    def forward(self, h):
        x = self.norm1(h)
        h = h + self.attn(x, x, x, need_weights=False)[0]
        return h + self.ff(self.norm2(h))


class Net(nn.Module):
    def __init__(self, method, cfg):
        super().__init__()
        d = cfg["d_model"]
        self.tokens = nn.Embedding(cfg["vocab"], d)
        max_length = max(cfg["test_lengths"])
        self.positions = nn.Embedding(max_length, d) if method == "absolute" else None
        self.blocks = nn.ModuleList(
            Block(method, d, cfg["n_heads"], cfg["dim_ff"], cfg["metric"])
            for _ in range(cfg["n_layers"])
        )
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, cfg["vocab"])

    def forward(self, x):
        h = self.tokens(x)
        if self.positions is not None:
            h = h + self.positions(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def accuracy(net, x, y):
    with torch.no_grad():
        pred = net(x).argmax(-1)
    keep = y >= 0
    return float((pred[keep] == y[keep]).float().mean())


def run_one(method, seed, cfg, test_sets):
    torch.manual_seed(seed)
    net = Net(method, cfg)
    optimiser = torch.optim.Adam(net.parameters(), lr=cfg["lr"])
    g = torch.Generator().manual_seed(10_000 + seed)
    start = time.perf_counter()
    losses = []
    for _ in range(cfg["steps"]):
        x, y = make_batch(g, cfg["batch_size"], cfg["train_length"], cfg["vocab"], cfg["offset"])
        loss = F.cross_entropy(net(x).reshape(-1, cfg["vocab"]), y.reshape(-1))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    net.eval()
    acc = {str(length): accuracy(net, *test_sets[length]) for length in cfg["test_lengths"]}
    return {"seed": seed, "final_loss": float(np.mean(losses[-50:])), "accuracy": acc,
            "seconds": time.perf_counter() - start}


def _paths(suffix):
    name = f"relative_position{suffix}"
    return RESULTS / f"{name}.json", IMAGES / f"{name}.png"


def run(seeds, methods, cfg, suffix=""):
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    test_sets = {
        length: make_batch(g, cfg["n_test"], length, cfg["vocab"], cfg["offset"])
        for length in cfg["test_lengths"]
    }
    start = time.perf_counter()
    runs = {}
    for method in methods:
        runs[method] = []
        for seed in range(seeds):
            r = run_one(method, seed, cfg, test_sets)
            runs[method].append(r)
            print(f"{method:9s} seed {seed}: loss {r['final_loss']:.3f}  acc "
                  + " ".join(f"{a:.3f}" for a in r["accuracy"].values())
                  + f"  ({r['seconds']:.1f} s)", flush=True)
    out = {
        "config": cfg, "seeds": seeds, "runs": runs,
        "seconds": {m: sum(r["seconds"] for r in runs[m]) for m in methods},
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "torch": torch.__version__, "torch_threads": torch.get_num_threads()},
    }
    path = _paths(suffix)[0]
    if path.exists():  # add these methods to an earlier run of the same experiment
        earlier = json.loads(path.read_text())
        if earlier["config"] == json.loads(json.dumps(cfg)) and earlier["seeds"] == seeds:
            out["runs"] = {**earlier["runs"], **runs}
            out["seconds"] = {**earlier["seconds"], **out["seconds"]}
    out["total_seconds"] = sum(out["seconds"].values())
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{time.perf_counter() - start:.0f} s -> {path.relative_to(ROOT)}")
    return out


def summary(res):
    """Per method and test length: mean and std (ddof 1) of the accuracy over seeds."""
    table = {}
    for method in [m for m in METHODS if m in res["runs"]]:
        runs = res["runs"][method]
        lengths = list(runs[0]["accuracy"])
        acc = np.array([[r["accuracy"][n] for n in lengths] for r in runs])
        table[method] = {
            "lengths": [int(n) for n in lengths], "mean": acc.mean(0), "std": acc.std(0, ddof=1),
            "loss": np.mean([r["final_loss"] for r in runs]),
            "seconds": np.median([r["seconds"] for r in runs]),
        }
    return table


def report(res):
    cfg = res["config"]
    table = summary(res)
    lengths = next(iter(table.values()))["lengths"]
    print(f"{res['seeds']} seeds, trained on length {cfg['train_length']}, offset {cfg['offset']},"
          f" total {res['total_seconds']:.0f} s\n")
    print("| method | final train loss | " + " | ".join(f"acc @ {n}" for n in lengths)
          + " | s / run (median) |")
    print("|---|---|" + "---|" * len(lengths) + "---|")
    for method, row in table.items():
        cells = " | ".join(f"{m:.3f} ± {s:.3f}" for m, s in zip(row["mean"], row["std"]))
        print(f"| {METHODS[method]} | {row['loss']:.3f} | {cells} | {row['seconds']:.1f} |")


def plot(res, suffix=""):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = res["config"]
    fig, ax = plt.subplots(figsize=(8.0, 4.0))
    for method, row in summary(res).items():
        ax.errorbar(row["lengths"], row["mean"], yerr=row["std"], marker="o", capsize=3,
                    label=METHODS[method])
    ax.axvline(cfg["train_length"], color="grey", linestyle=":", label="training length")
    ax.axhline(1 / cfg["vocab"], color="grey", linestyle="--", linewidth=0.8, label="chance")
    ax.set_xlabel("test sequence length")
    ax.set_ylabel(f"accuracy (token {cfg['offset']} places back)")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"Length generalisation, metric={cfg['metric']!r}, "
                 f"mean ± std over {res['seeds']} seeds", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    image = _paths(suffix)[1]
    image.parent.mkdir(exist_ok=True)
    fig.savefig(image, dpi=110)
    print(f"-> {image.relative_to(ROOT)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS),
                        help="methods to run; added to an earlier run of the same configuration")
    parser.add_argument("--steps", type=int, default=CONFIG["steps"])
    parser.add_argument("--metric", choices=["dot", "linear", "mlp"], default=CONFIG["metric"])
    parser.add_argument("--suffix", default="", help="files relative_position<suffix>.json/png")
    parser.add_argument("--plot", action="store_true", help="table and figure from the JSON")
    args = parser.parse_args()
    if args.plot:
        results = json.loads(_paths(args.suffix)[0].read_text())
        report(results)
        plot(results, args.suffix)
    else:
        config = dict(CONFIG, steps=args.steps, metric=args.metric)
        report(run(args.seeds, args.methods, config, args.suffix))
