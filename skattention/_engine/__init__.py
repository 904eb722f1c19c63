"""The attention engine: torch only (but for SciPy's k-d tree in ``_tree.py``), no scikit-learn
imports.

This module is the engine's one door: the estimators (``neighbors``, ``manifold``, ``cluster``,
``nn``) import what they need from here, never from the private modules behind it (a test
enforces it). See docs/engine.md for which module owns what.
"""

from ._anneal import anneal
from ._attention import attention, kneighbors
from ._available_memory import available_memory
from ._budget import batch_rows, budget_bytes, cpu_block_rows, plan_rows
from ._calibration import calibrate_temperature
from ._cluster import (
    heaviest_fill,
    iterate_centers,
    kmeans_inertia,
    kmeans_step,
    lloyd,
    soft_kmeans,
    sqdist_to_centers,
)
from ._device import (
    device_available,
    dtype_name,
    is_auto_device,
    parse_device,
    resolve_device,
    resolve_dtype,
    seeded_torch_rng,
)
from ._inputs import averaging_dtype, check_temperature, clamp_log_temperature, prepare_keys
from ._kernels import (
    ball_counts,
    ball_sums,
    gaussian_kernel,
    gaussian_kernel_log_sums,
    mean_kth_distance,
    sqdist_log_histogram,
)
from ._kinds import LEARNED_METRICS, METRICS, exact_f_of_pairs, metric_kind
from ._maps import ResidualBlock, build_map
from ._measured_threads import MeasuredThreads
from ._metric_training import train_metric
from ._multiplicity import counts_every_key
from ._near_far import (
    GroupedKeys,
    group_keys,
    grouped_rows_single_threaded,
    near_far_attention,
)
from ._parallel import cpu_threads, rows_single_threaded, small_work_single_threaded
from ._progress import progress_bar, track, write
from ._rows import RowBlocks
from ._scores import ComputeOverflowError, overflow_message
from ._sdpa import (
    augmented_coordinates,
    centred_keys,
    centred_queries,
    key_centre,
    scaled_dot_product,
)
from ._shards import (
    Partial,
    finish_partial,
    is_selection,
    merge_partials,
    partial_neighbors,
    selection_size,
    shard_attention,
    shard_lightest_weights,
)
from ._training import EarlyStopping, ProgressReport, WindowRule, autograd_on, train_network

__all__ = [
    # attention and its selection step
    "attention",
    "kneighbors",
    "prepare_keys",
    # attention over keys grouped around prototypes (exact over the near groups)
    "GroupedKeys",
    "group_keys",
    "near_far_attention",
    "grouped_rows_single_threaded",
    # attention over shards of the keys, merged exactly
    "Partial",
    "finish_partial",
    "is_selection",
    "merge_partials",
    "partial_neighbors",
    "selection_size",
    "shard_attention",
    "shard_lightest_weights",
    # Gaussian kernels between point sets
    "ball_counts",
    "ball_sums",
    "gaussian_kernel",
    "gaussian_kernel_log_sums",
    "mean_kth_distance",
    "sqdist_log_histogram",
    # k-means steps and iterations
    "RowBlocks",
    "anneal",
    "iterate_centers",
    "kmeans_step",
    "kmeans_inertia",
    "heaviest_fill",
    "lloyd",
    "soft_kmeans",
    "sqdist_to_centers",
    # training: learned maps, the training loop and its callbacks
    "EarlyStopping",
    "WindowRule",
    "ProgressReport",
    "ResidualBlock",
    "autograd_on",
    "batch_rows",
    "build_map",
    "calibrate_temperature",
    "train_metric",
    "train_network",
    # the nn layer's SDPA on augmented coordinates
    "augmented_coordinates",
    "centred_keys",
    "centred_queries",
    "key_centre",
    "scaled_dot_product",
    # names, checks, devices, threads, memory and progress
    "LEARNED_METRICS",
    "METRICS",
    "metric_kind",
    "exact_f_of_pairs",
    "averaging_dtype",
    "counts_every_key",
    "ComputeOverflowError",
    "overflow_message",
    "available_memory",
    "budget_bytes",
    "cpu_block_rows",
    "check_temperature",
    "clamp_log_temperature",
    "cpu_threads",
    "MeasuredThreads",
    "device_available",
    "is_auto_device",
    "parse_device",
    "plan_rows",
    "progress_bar",
    "resolve_device",
    "resolve_dtype",
    "dtype_name",
    "rows_single_threaded",
    "small_work_single_threaded",
    "seeded_torch_rng",
    "track",
    "write",
]
