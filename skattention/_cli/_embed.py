"""``skattention embed``: a diffusion-map embedding by attention (AttentionDiffusionEmbedding)."""

import time

import numpy as np

from ._common import CLIError, check_device, describe, progress
from ._data import labels, load_data, scaled
from ._output import emit, save_figure


def embed(args, fig):
    """Run ``skattention embed``; returns the exit status."""
    epsilon = _check_options(args)
    X, y, dataset = load_data(args)
    if args.n_components >= X.shape[0]:
        raise CLIError(
            f"--n-components {args.n_components} must be smaller than the {X.shape[0]} samples"
        )
    if args.n_neighbors is not None and not 1 <= args.n_neighbors <= X.shape[0]:
        raise CLIError(
            f"--n-neighbors must be between 1 and the {X.shape[0]} samples, got {args.n_neighbors}"
        )
    check_device(args)
    from ..manifold import AttentionDiffusionEmbedding

    model = AttentionDiffusionEmbedding(
        n_components=args.n_components,
        epsilon=epsilon,
        alpha=args.alpha,
        n_neighbors=args.n_neighbors,
        device=args.device,
        random_state=0,
    )
    progress(args, "fitting AttentionDiffusionEmbedding")
    start = time.perf_counter()
    try:
        Z = model.fit_transform(scaled(X, args.scale))
    except ValueError as exc:
        raise CLIError(f"AttentionDiffusionEmbedding: {str(exc).splitlines()[0]}") from None
    elapsed = time.perf_counter() - start
    progress(args, f"AttentionDiffusionEmbedding done in {elapsed:.2f} s")
    settings = {"n_components": args.n_components, "alpha": args.alpha,
                "n_neighbors": args.n_neighbors, "epsilon": args.epsilon, "scaled": args.scale}
    results = [{
        "model": "AttentionDiffusionEmbedding",
        "time_s": elapsed,
        "epsilon": float(model.epsilon_),
        "intrinsic_dimension": None
        if model.intrinsic_dimension_ is None
        else float(model.intrinsic_dimension_),
        "eigenvalues": [float(v) for v in model.eigenvalues_],
        "laplacian_eigenvalues": [float(v) for v in model.laplacian_eigenvalues_],
    }]
    if fig is not None:
        _plot_embedding(fig, Z, y, dataset)
        save_figure(fig, args.plot)
    return emit(args, dataset, settings, results, _table(args, dataset, model, elapsed))


def _check_options(args):
    """The options that need no data checked; returns ``--epsilon`` as a number or 'auto'."""
    if args.n_components < 1:
        raise CLIError(f"--n-components must be at least 1, got {args.n_components}")
    if args.plot and args.n_components < 2:
        raise CLIError("--plot needs --n-components 2 or more")
    if not 0.0 <= args.alpha <= 1.0:
        raise CLIError(f"--alpha must be in [0, 1], got {args.alpha}")
    if args.epsilon == "auto":
        return "auto"
    try:
        epsilon = float(args.epsilon)
    except ValueError:
        epsilon = None
    if epsilon is None or not epsilon > 0 or not np.isfinite(epsilon):
        raise CLIError(f"--epsilon must be a positive number or 'auto', got {args.epsilon!r}")
    return epsilon


def _table(args, dataset, model, elapsed):
    neighbors = "" if args.n_neighbors is None else f", n_neighbors={args.n_neighbors}"
    dimension = (
        ""
        if model.intrinsic_dimension_ is None
        else f"; intrinsic dimension: {model.intrinsic_dimension_:.2f}"
    )
    return [
        f"dataset: {describe(dataset)}; AttentionDiffusionEmbedding(n_components="
        f"{args.n_components}, alpha={args.alpha}{neighbors})"
        f"{', features standardised' if args.scale else ''}",
        f"epsilon: {model.epsilon_:.4g}{dimension}",
        "eigenvalues of S: " + " ".join(f"{v:.4f}" for v in model.eigenvalues_),
        f"time: {elapsed:.3f} s",
    ]


def _plot_embedding(fig, Z, y, dataset):
    from ..plotting import EmbeddingDisplay

    EmbeddingDisplay(
        Z[:, :2], labels(y), xlabel="diffusion coordinate 1", ylabel="diffusion coordinate 2"
    ).plot(ax=fig.add_subplot(), s=6, title=f"attention diffusion embedding: {describe(dataset)}")
