"""The argument parser of ``skattention`` and its three subcommands, with their examples."""

import argparse
import re

from ._compare import DEFAULT_MODELS

_COMPARE_EXAMPLE = """examples:
  skattention compare                              # scikit-learn's digits, 3-fold CV
  skattention compare --data wine.csv --target quality --cv 10
  skattention compare --data house.csv --target price --drop id --task regression --json
  skattention compare --data excel.csv --sep ';' --decimal , --encoding latin-1 --target y
  skattention compare --cv 3 --plot scores.png --verbose   # scores chart, progress per fold

models (--models, comma-separated; default: knn,knn-attention,kernel,tabular; with them and the
default 3 folds the run on digits takes about 11 s on 2 CPU cores with nothing else running,
longer on a busy machine; each row is printed as soon as its model is done):
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


def build_parser(version):
    """The parser of ``skattention``: ``--version`` and the three subcommands."""
    parser = argparse.ArgumentParser(
        prog="skattention",
        description="Attention as classical machine learning: compare attention estimators "
        "with their scikit-learn counterparts, embed and cluster data by attention.",
    )
    parser.add_argument("--version", action="version", version=f"skattention {version}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_compare(sub)
    _add_embed(sub)
    _add_cluster(sub)
    return parser


def _add_compare(sub):
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


def _add_embed(sub):
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


def _add_cluster(sub):
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


def _add_data_arguments(parser, target_help):
    parser.add_argument(
        "--data",
        metavar="PATH.csv",
        help="CSV file with a header row (default: scikit-learn's digits); the separator "
        "(',', ';', tab or '|') is detected, a UTF-8 byte-order mark (Excel) ignored, and "
        "numbers written with decimal commas in a ';' file are read as numbers",
    )
    parser.add_argument("--target", metavar="COLUMN", help=target_help)
    parser.add_argument("--drop", metavar="COLUMN", action="append", default=[],
                        help="a column not to use, such as an ID (repeat for several)")
    parser.add_argument("--sep", metavar="CHAR",
                        help="the CSV separator, e.g. ';' or '\\t' (default: detected)")
    parser.add_argument("--decimal", choices=[".", ","], default=None,
                        help="the decimal mark of the CSV's numbers (default: '.', or ',' when "
                        "the separator is ';' and a column is written with decimal commas)")
    parser.add_argument("--encoding", default="utf-8-sig",
                        help="text encoding of the CSV, e.g. latin-1 (default: UTF-8)")
    parser.add_argument("--max-samples", type=int, default=None, metavar="N",
                        help="use a random subset of N samples (seed 0) to go faster")
    parser.add_argument("--device", default="auto", type=_device_name,
                        help="'auto', 'cpu', 'cuda', 'cuda:N' or 'mps' (default: auto)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="report progress on standard error (compare: each model and fold)")


def _add_output_arguments(parser, plot_help):
    parser.add_argument(
        "--json", action="store_true", help="print machine-readable JSON instead of a table"
    )
    parser.add_argument("--plot", metavar="FILE.png",
                        help=f"write {plot_help}; the format follows the extension")


def _device_name(text):
    """A ``--device`` value of a valid form (checked before torch is imported, as every
    option is; whether this machine has it is the estimators' check)."""
    if not re.fullmatch(r"auto|(cpu|cuda|mps)(:\d+)?", text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a device: use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")
    return text
