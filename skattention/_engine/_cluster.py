"""Chunked, memory-bounded k-means steps: attention of points over a few centroids (torch only).

docs/theory.md (the drift-diffusion section): soft k-means is cross-attention. With keys =
centroids c_j, the E-step is the
attention weight of point x_i on centroid j,

    r_ij = p_j exp(-||x_i - c_j||^2 / T) / sum_l p_l exp(-||x_i - c_l||^2 / T),

and the M-step is the attention of each centroid over the points with values = points,
c_j = sum_i w_i r_ij x_i / sum_i w_i r_ij. ``T = 0`` is the arg-min (Lloyd's hard assignment).

For the handful of centroids of k-means, the generic :func:`attention` (blocks over keys, online
softmax) costs more than it saves: here a block of points meets *all* centroids in one matmul,
the softmax is taken over the k columns directly, and the M-step sums are accumulated block by
block. Blocks are sized from ``working_memory`` (MiB, ``skattention.get_config()``), so the
scratch memory is bounded whatever the number of points.

The iterations built on these steps are here too: one loop to a fixed point of the centroids
(:func:`iterate_centers`), whose step is Lloyd's exactly as scikit-learn's (:func:`lloyd`) or soft
k-means at a fixed temperature (:func:`soft_kmeans`); deterministic annealing is in
``_anneal.py``. ``skattention.cluster.AttentionKMeans`` is their scikit-learn shell.

The points are a dense tensor or :class:`RowBlocks` (a CSR matrix read in dense blocks, see
``_rows.py``), optionally with a ``shift`` subtracted from every block (centring without a
centred copy).
"""

import numpy as np
import torch

from ._budget import budget_bytes, cpu_block_rows, plan_rows
from ._parallel import small_work_single_threaded
from ._progress import progress_bar, write
from ._rows import as_row_blocks
from ._scores import padded_rows

# Accelerators: at most this many points per block.
_ACCEL_BLOCK_ROWS = 1 << 20


def _block_rows(n, k, points, working_memory, hard):
    # per row: distances, logits/responsibilities and their temporaries (4 x k), norms, labels
    # and weights, the row read when it is a copy (shifted or densified), and, in the soft
    # step, the weighted row; in the hard step, the weighted row, the squared row and the
    # row padded for the product (3 d: a hard step's result is per row, whatever its blocks,
    # while the soft step's sums are summed block by block, whose rows are kept as they were).
    # The cache-sized cap depends on the data's width alone, so that a matrix read in copies
    # is cut in the blocks of the same matrix held dense.
    d, itemsize = points.shape[1], points.element_size()
    if points.device.type == "cpu":  # cache-sized: the 4 k-wide temporaries, about 4 copies of x
        cap = min(cpu_block_rows(4 * k), max(1024, cpu_block_rows(4 * d)))
    else:
        cap = _ACCEL_BLOCK_ROWS
    return plan_rows(
        n, row_bytes=itemsize * (4 * k + (3 if hard else 1) * d + 4) + 8 + points.copy_bytes(),
        budget=budget_bytes(working_memory), max_rows=cap,
    )


def kmeans_step(X, centers, sample_weight, *, temperature=0.0, log_prior=None, update=True,
                working_memory=None, shift=None):
    """One E-step (and M-step sums) of hard or soft k-means, streamed over blocks of points.

    Parameters
    ----------
    X : Tensor of shape (n, d) or RowBlocks
        Points (ideally centred: squared distances use ``||x||^2 - 2 x.c + ||c||^2``): a dense
        tensor, or :class:`RowBlocks` (e.g. of a CSR matrix, densified one block at a time).
    centers : Tensor of shape (k, d)
        Centroids, same device and dtype as ``X``.
    sample_weight : Tensor of shape (n,)
        Non-negative point weights (unused when ``update=False``).
    temperature : float >= 0, default=0.0
        ``0``: hard assignment to the nearest centroid (Lloyd's E-step; ties in the computed
        ``||c||^2 - 2 x.c`` go to the lowest index, exact ties in ``X`` as its rounding falls).
        ``> 0``: responsibilities ``softmax_j(-||x - c_j||^2 / T + log_prior_j)``.
    log_prior : Tensor of shape (k,), default=None
        Log mixing weights of the centroids (soft steps only).
    update : bool, default=True
        Accumulate the M-step sums; ``False`` only assigns (hard).
    working_memory : float, default=None
        Scratch budget in MiB; ``None`` reads ``skattention.get_config()``.
    shift : Tensor of shape (d,), default=None
        Subtracted from each block of ``X`` (centring without a copy of ``X``).

    Returns
    -------
    out : dict
        Hard steps: ``labels`` (n,) int64 nearest centroid and ``min_sqdist`` (n,) squared
        distance to it. With ``update``: ``sums`` (k, d) = sum_i w_i r_ij x_i and ``mass`` (k,) =
        sum_i w_i r_ij (r one-hot when ``temperature == 0``); soft steps also give ``hardness``,
        the weighted mean of max_j r_ij (soft steps return no labels).
    """
    points = as_row_blocks(X, shift)
    n, d = points.shape
    dtype, device = points.dtype, points.device
    k = centers.shape[0]
    T = float(temperature)
    c_norm = (centers * centers).sum(1)
    rows = _block_rows(n, k, points, working_memory, hard=not (T > 0 and update))
    sums = torch.zeros((k, d), dtype=dtype, device=device) if update else None
    mass = torch.zeros(k, dtype=dtype, device=device) if update else None
    if T > 0 and update:
        # Soft step, in the (k, rows) layout: reductions over the k centroids are then
        # elementwise over contiguous rows (fast on the CPU).
        hardness = torch.zeros((), dtype=dtype, device=device)
        # -(||c||^2 - 2 x.c) / T + log p = (2 x.c - ||c||^2) / T + log p
        if log_prior is not None:
            bias = log_prior - c_norm / T
        else:
            bias = -c_norm / T
        for s in range(0, n, rows):
            x = points.block(s, min(n, s + rows))
            z = torch.addmm(bias[:, None], centers, x.T, alpha=2.0 / T)
            r = z.sub_(z.amax(0)).exp_()
            rw = r.mul_(sample_weight[s : s + rows] / r.sum(0))
            sums.addmm_(rw, x)
            mass.add_(rw.sum(1))
            hardness = hardness + rw.amax(0).sum()
        total = float(sample_weight.sum())
        return {
            "sums": sums,
            "mass": mass,
            "hardness": float(hardness) / total if total > 0 else 1.0,
        }
    labels = torch.empty(n, dtype=torch.long, device=device)
    min_sq = torch.empty(n, dtype=dtype, device=device)
    ct = centers.T.contiguous()
    for s in range(0, n, rows):
        e = min(n, s + rows)
        x = points.block(s, e)
        # ||c||^2 - 2 x.c: the distance up to the per-row constant ||x||^2 (scikit-learn's
        # form); rows padded as the attention products pad them, so that a point's label does
        # not depend on its batch (MKL rounded one or two rows otherwise than a block of them:
        # single-row predictions of float32 points near a boundary differed from the batch's)
        partial = torch.addmm(c_norm, padded_rows(x), ct, alpha=-2.0)[: e - s]
        best, lab = partial.min(1)
        labels[s:e] = lab
        min_sq[s:e] = (best + (x * x).sum(1)).clamp_(min=0)
        if update:
            w = sample_weight[s:e]
            sums.index_add_(0, lab, x * w[:, None])
            mass.index_add_(0, lab, w)
    out = {"labels": labels, "min_sqdist": min_sq}
    if update:
        out["sums"] = sums
        out["mass"] = mass
    return out


def sqdist_to_centers(X, centers, working_memory=None, shift=None):
    """Squared Euclidean distances (n, k) from points to centroids, from explicit differences.

    Differences (not the expanded ``||x||^2 - 2 x.c + ||c||^2``) keep the distance of a point to
    a centroid equal to it exactly 0. Blocks of rows bound the (rows, k, d) scratch memory.
    ``X`` is a dense tensor or :class:`RowBlocks`; ``shift`` (d,) is subtracted
    from each block of ``X`` (centring without a copy of ``X``).
    """
    points = as_row_blocks(X, shift)
    n, d = points.shape
    k = centers.shape[0]
    out = torch.empty((n, k), dtype=points.dtype, device=points.device)
    rows = plan_rows(  # per row: the differences and their squares (k x d each)
        n, row_bytes=points.element_size() * 2 * k * d + points.copy_bytes(),
        budget=budget_bytes(working_memory),
        max_rows=cpu_block_rows(2 * k * d) if points.device.type == "cpu" else None,
    )
    for s in range(0, n, rows):
        diff = points.block(s, min(n, s + rows))[:, None, :] - centers[None, :, :]
        out[s : s + rows] = (diff * diff).sum(2)
    return out


def iterate_centers(em_step, centers, max_iter, tol, on_iteration=None, verbose=0, desc=None):
    """The k-means iteration loop: ``centers <- em_step(centers)`` to a fixed point.

    ``em_step(centers)`` returns the new centres and whether the step converged strictly (hard
    labels unchanged). The loop stops after ``max_iter`` steps, at strict convergence, or once
    the summed squared centre shift is ``<= tol``. ``on_iteration(centers)``, when given, is
    called after each step with the new centres (which the loop does not modify afterwards); it
    returning ``True`` stops the loop there, as convergence would (the estimators' callbacks,
    which the engine does not import). Centres are tensors or NumPy arrays (a step merging
    sums from elsewhere). Returns the centres and the number of steps.
    """
    n_iter = 0
    bar = inner_bar(verbose, total=max_iter, desc=desc)
    for i in range(max_iter):
        new, converged = em_step(centers)
        shift = float(((new - centers) ** 2).sum())
        centers, n_iter = new, i + 1
        bar.set_postfix(shift=f"{shift:.3g}", refresh=False)
        bar.update()
        if on_iteration is not None and on_iteration(centers):
            break
        if converged or shift <= tol:
            break
    bar.close()
    return centers, n_iter


def lloyd(X, w, centers, max_iter, tol, verbose, on_iteration=None, shift=None):
    """Lloyd's iterations exactly as scikit-learn's ``_kmeans_single_lloyd``.

    Each iteration assigns every point to its nearest centre (ties to the lowest index), then
    moves each centre to the weighted mean of its points, relocating empty clusters to the
    points farthest from their centres (or, when every point sits on its centre, to the
    heaviest cluster's centre). Stops when the labels stop changing (strict
    convergence) or the summed squared centre shift is ``<= tol``; without strict convergence a
    last assignment makes labels and centres consistent. ``X`` and ``shift`` as in
    :func:`kmeans_step`; ``on_iteration`` as in :func:`iterate_centers`.

    Returns the centres, the labels, the inertia and the number of iterations.
    """
    return _run(as_row_blocks(X, shift), w, centers, 0.0, max_iter, tol, verbose, on_iteration)


def soft_kmeans(X, w, centers, T, max_iter, tol, verbose, on_iteration=None, shift=None):
    """Soft k-means at a fixed temperature ``T > 0`` (equal priors) to a fixed point; the
    arguments and the result as in :func:`lloyd`."""
    return _run(as_row_blocks(X, shift), w, centers, T, max_iter, tol, verbose, on_iteration)


def _run(points, w, centers, T, max_iter, tol, verbose, on_iteration):
    """One run of :func:`iterate_centers` with the hard (``T == 0``) or soft E/M step, then the
    labels and inertia of the final centres."""
    previous = None

    def em_step(centers):
        nonlocal previous
        if T > 0:
            step = kmeans_step(points, centers, w, temperature=T)
            return weighted_means(step["sums"], step["mass"], centers), False
        step = kmeans_step(points, centers, w)
        labels = step["labels"]
        converged = previous is not None and torch.equal(labels, previous)
        previous = labels
        return _centers_from_sums(points, w, centers, step, labels), converged

    desc = "soft k-means" if T > 0 else "Lloyd"
    n, d = points.shape
    # small steps on one thread: too short for a parallel region to pay, and on a busy machine
    # each of their kernels waited for a descheduled thread
    with small_work_single_threaded(n * centers.shape[0] * d, points.device):
        centers, n_iter = iterate_centers(em_step, centers, max_iter, tol, on_iteration,
                                          verbose, desc)
        # Labels and inertia of the final centres (after strict convergence the labels
        # cannot change).
        step = kmeans_step(points, centers, w, update=False)
        inertia = kmeans_inertia(points, w, centers, step["labels"])
    if verbose >= 2 and T == 0:
        # (the inertia in the user's weight units is the estimator's line: these may be scaled)
        write(f"  Lloyd: {n_iter} iterations")
    return centers, step["labels"], inertia, n_iter


def _centers_from_sums(points, w, centers_old, step, labels):
    sums, mass = step["sums"].clone(), step["mass"].clone()
    empty = (mass == 0).nonzero().squeeze(1)
    if empty.numel():
        # scikit-learn's _relocate_empty_clusters_dense: move each empty centre to one of the
        # points farthest from their (old) centre, taking it out of its cluster.
        d2 = _sqdist_to_own_centers(points, centers_old, labels)
        if float(d2.max()) > 0:
            far = torch.from_numpy(
                np.argpartition(d2.cpu().numpy(), -empty.numel())[: -empty.numel() - 1 : -1].copy()
            )
            far_rows = points.rows(far.to(points.device))
            for j, i, idx in zip(empty.tolist(), range(far.numel()), far.tolist()):
                old = int(labels[idx])
                sums[old] -= far_rows[i] * w[idx]
                sums[j] = far_rows[i] * w[idx]
                mass[j] = w[idx]
                mass[old] -= w[idx]
    centers = weighted_means(sums, mass, centers_old)
    return torch.where((mass > 0)[:, None], centers, heaviest_fill(sums, mass, centers))


def heaviest_fill(sums, mass, centers):
    """Where a cluster still empty after the relocation (more clusters than distinct points,
    or relocated points of zero weight) goes, as scikit-learn's ``_average_centers`` puts it:
    at the heaviest cluster, which it divides in place in cluster order, so that an empty
    cluster before the heaviest copies its weighted sum and one after it its centre (tensors
    or NumPy arrays alike)."""
    heaviest = int(mass.argmax())
    fill = centers[[heaviest] * mass.shape[0]]  # (a copy)
    fill[:heaviest] = sums[heaviest]
    return fill


def kmeans_inertia(X, w, centers, labels, shift=None):
    """``sum_i w_i ||x_i - c_(labels_i)||^2`` (float), from the explicit differences, as
    scikit-learn's inertia (the expanded ``||x||^2 - 2 x.c + ||c||^2`` of the assignment loses
    float32 inertias' fourth digit to cancellation), summed in float64; ``w`` ``None``: unit
    weights; ``X`` and ``shift`` as in :func:`kmeans_step`."""
    points = as_row_blocks(X, shift)
    if not points.shape[0]:  # (an empty Dask partition)
        return 0.0
    d2 = _sqdist_to_own_centers(points, centers, labels).double()
    return float(d2.sum() if w is None else (d2 * w.double()).sum())


def _sqdist_to_own_centers(points, centers, labels):
    """Squared distance of each point to its centre: a dense matrix in one pass (a few rows
    alone can sum otherwise than in a large block), rows read as copies in budget-sized
    blocks."""
    row_bytes = 2 * points.shape[1] * points.element_size()  # the difference and its square
    return torch.cat([
        ((x - centers[labels[start:stop]]) ** 2).sum(1)
        for start, stop, x in points.blocks(row_bytes)
    ])


def weighted_means(sums, mass, centers_old):
    """The M-step: ``sums / mass`` per centroid; a centroid without mass stays where it was."""
    keep = mass > 0
    return torch.where(keep[:, None], sums / torch.where(keep, mass, 1.0)[:, None], centers_old)


def inner_bar(verbose, total=None, desc=None, unit="it"):
    """Bar of an inner loop (annealing levels, iterations of a run): shown at ``verbose=1``
    once it lasts a couple of seconds; ``verbose >= 2`` writes lines instead."""
    return progress_bar(verbose == 1, total=total, desc=desc, unit=unit, inner=True)
