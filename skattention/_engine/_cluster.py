"""Chunked, memory-bounded k-means steps: attention of points over a few centroids (torch only).

THEORY.md section 1: soft k-means is cross-attention. With keys = centroids c_j, the E-step is the
attention weight of point x_i on centroid j,

    r_ij = p_j exp(-||x_i - c_j||^2 / T) / sum_l p_l exp(-||x_i - c_l||^2 / T),

and the M-step is the attention of each centroid over the points with values = points,
c_j = sum_i w_i r_ij x_i / sum_i w_i r_ij. ``T = 0`` is the arg-min (Lloyd's hard assignment).

For the handful of centroids of k-means, the generic :func:`attention` (blocks over keys, online
softmax) costs more than it saves: here a block of points meets *all* centroids in one matmul,
the softmax is taken over the k columns directly, and the M-step sums are accumulated block by
block. Blocks are sized from ``working_memory`` (MiB, ``skattention.get_config()``), so the
scratch memory is bounded whatever the number of points.
"""

import math

import torch

from ._attention import _budget_bytes

# On the CPU, blocks of about 2**18 distance entries stay in cache and amortise the Python overhead.
_CPU_BLOCK_ENTRIES = 1 << 18
_ACCEL_BLOCK_ROWS = 1 << 20


def _block_rows(n, k, d, itemsize, device, working_memory):
    budget = _budget_bytes(working_memory)
    # per row: distances, logits/responsibilities and their temporaries (4 x k), the weighted
    # copy of the row (d), norms, labels and weights.
    per_row = itemsize * (4 * k + d + 4) + 8
    rows = max(1, budget // per_row)
    if device.type == "cpu":
        rows = min(rows, max(1, _CPU_BLOCK_ENTRIES // max(k, 1)), max(1024, _CPU_BLOCK_ENTRIES // max(d, 1)))
    else:
        rows = min(rows, _ACCEL_BLOCK_ROWS)
    return max(1, min(n, rows))


def kmeans_step(X, centers, sample_weight, *, temperature=0.0, log_prior=None, update=True,
                working_memory=None, shift=None):
    """One E-step (and M-step sums) of hard or soft k-means, streamed over blocks of points.

    Parameters
    ----------
    X : Tensor of shape (n, d)
        Points (ideally centred: squared distances use ``||x||^2 - 2 x.c + ||c||^2``).
    centers : Tensor of shape (k, d)
        Centroids, same device and dtype as ``X``.
    sample_weight : Tensor of shape (n,)
        Non-negative point weights (unused when ``update=False``).
    temperature : float >= 0, default=0.0
        ``0``: hard assignment to the nearest centroid (Lloyd's E-step; ties go to the lowest
        index). ``> 0``: responsibilities ``softmax_j(-||x - c_j||^2 / T + log_prior_j)``.
    log_prior : Tensor of shape (k,), default=None
        Log mixing weights of the centroids (soft steps only).
    update : bool, default=True
        Accumulate the M-step sums; ``False`` only assigns (hard).
    working_memory : float, default=None
        Scratch budget in MiB; ``None`` reads ``skattention.get_config()``.
    shift : Tensor of shape (d,), default=None
        Hard steps: subtract it from each block of ``X`` (centring without a copy of ``X``).

    Returns
    -------
    out : dict
        Hard steps: ``labels`` (n,) int64 nearest centroid and ``min_sqdist`` (n,) squared
        distance to it. With ``update``: ``sums`` (k, d) = sum_i w_i r_ij x_i and ``mass`` (k,) =
        sum_i w_i r_ij (r one-hot when ``temperature == 0``); soft steps also give ``hardness``,
        the weighted mean of max_j r_ij (soft steps return no labels).
    """
    n, d = X.shape
    k = centers.shape[0]
    T = float(temperature)
    c_norm = (centers * centers).sum(1)
    rows = _block_rows(n, k, d + (d if shift is not None else 0), X.element_size(), X.device, working_memory)
    sums = torch.zeros((k, d), dtype=X.dtype, device=X.device) if update else None
    mass = torch.zeros(k, dtype=X.dtype, device=X.device) if update else None
    if T > 0 and update:
        # Soft step, in the (k, rows) layout: reductions over the k centroids are then
        # elementwise over contiguous rows (fast on the CPU).
        hardness = torch.zeros((), dtype=X.dtype, device=X.device)
        # -(||c||^2 - 2 x.c) / T + log p = (2 x.c - ||c||^2) / T + log p
        if log_prior is not None:
            bias = log_prior - c_norm / T
        else:
            bias = -c_norm / T
        for s in range(0, n, rows):
            x = X[s : s + rows]
            z = torch.addmm(bias[:, None], centers, x.T, alpha=2.0 / T)
            r = z.sub_(z.amax(0)).exp_()
            rw = r.mul_(sample_weight[s : s + rows] / r.sum(0))
            sums.addmm_(rw, x)
            mass.add_(rw.sum(1))
            hardness = hardness + rw.amax(0).sum()
        total = float(sample_weight.sum())
        return {"sums": sums, "mass": mass, "hardness": float(hardness) / total if total > 0 else 1.0}
    labels = torch.empty(n, dtype=torch.long, device=X.device)
    min_sq = torch.empty(n, dtype=X.dtype, device=X.device)
    ct = centers.T.contiguous()
    for s in range(0, n, rows):
        e = min(n, s + rows)
        x = X[s:e] if shift is None else X[s:e] - shift
        # ||c||^2 - 2 x.c: the distance up to the per-row constant ||x||^2 (scikit-learn's form)
        partial = torch.addmm(c_norm, x, ct, alpha=-2.0)
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
    ``shift`` (d,) is subtracted from each block of ``X`` (centring without a copy of ``X``).
    """
    n, d = X.shape
    k = centers.shape[0]
    out = torch.empty((n, k), dtype=X.dtype, device=X.device)
    budget = _budget_bytes(working_memory)
    per_row = X.element_size() * (2 * k * d + (d if shift is not None else 0))
    rows = max(1, min(n, budget // (per_row + 1), max(1, _CPU_BLOCK_ENTRIES // (k * d))))
    for s in range(0, n, rows):
        block = X[s : s + rows] if shift is None else X[s : s + rows] - shift
        diff = block[:, None, :] - centers[None, :, :]
        out[s : s + rows] = (diff * diff).sum(2)
    return out


def principal_axes(X, sample_weight, centers, temperature, log_prior, directions, n_iter=10):
    """Largest eigenvalue and axis of each soft cluster's covariance, by power iteration.

    Cluster j's covariance is ``sum_i w_i r_ij (x_i - c_j)(x_i - c_j)^T / sum_i w_i r_ij`` with
    ``r`` the responsibilities at ``temperature`` (a single centroid: the weighted covariance).
    In deterministic annealing (Rose, 1998), centroid j becomes unstable and splits along that
    axis when the temperature falls below its critical value ``2 lambda_max``. All clusters are
    iterated together, O(n k d) per iteration, warm-started from ``directions``. The (n, k)
    weighted responsibilities are held in memory: meant for the annealing subsample.

    Returns ``(lam, axes)``: (k,) eigenvalues and (k, d) unit axes.
    """
    k = centers.shape[0]
    tiny = torch.finfo(X.dtype).tiny
    V = directions / directions.norm(dim=1, keepdim=True).clamp(min=tiny)
    # (k, n) layout: reductions over the centroids are elementwise over contiguous rows
    if k == 1:
        A = sample_weight[None, :]
    else:
        bias = -(centers * centers).sum(1) / temperature + log_prior
        z = torch.addmm(bias[:, None], centers, X.T, alpha=2.0 / temperature)
        A = z.sub_(z.amax(0)).exp_()
        A = A.mul_(sample_weight / A.sum(0))
    mass = A.sum(1).clamp(min=tiny)
    lam = torch.zeros(k, dtype=X.dtype, device=X.device)
    for _ in range(n_iter):
        proj = (V @ X.T).sub_((centers * V).sum(1)[:, None])  # (x_i - c_j) . v_j
        ap = proj.mul_(A)
        acc = (ap @ X).sub_(ap.sum(1)[:, None] * centers).div_(mass[:, None])
        lam = acc.norm(dim=1)
        V = torch.where(lam[:, None] > 0, acc / lam.clamp(min=tiny)[:, None], V)
    return lam, V
