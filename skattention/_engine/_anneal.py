"""Deterministic annealing for k-means (Rose 1998): splits at critical temperatures (torch only).

Annealing starts with one centroid at the weighted mean and lowers the temperature of the soft
k-means steps of ``_cluster.py``; a centroid splits along its soft cluster's principal axis when
the temperature falls below its critical value. It runs in float32 on a subsample of the points
(a dense tensor, or row blocks of a CSR matrix: a sparse subsample is read in dense blocks
unless it fits the budget whole); ``skattention.cluster.AttentionKMeans`` follows it with exact
Lloyd iterations.
"""

import numpy as np
import torch

from ._budget import budget_bytes
from ._cluster import inner_bar, kmeans_step, weighted_means
from ._parallel import small_work_single_threaded
from ._progress import write
from ._rows import RowBlocks, as_row_blocks

# Deterministic annealing runs on a subsample of at most this many points; the exact Lloyd
# iterations that follow use every point.
_ANNEAL_MAX_SAMPLES = 20000
_ANNEAL_COOLING = 0.8  # T <- 0.8 T between temperature levels
_ANNEAL_MAX_INNER = 10  # EM iterations per temperature level at most
_ANNEAL_INNER_TOL = 1e-3  # level converged when max_j ||c_j - c_j_old||^2 < 1e-3 T
_ANNEAL_HARDNESS = 0.99  # stop once the weighted mean of max_j r_ij reaches this ...
_ANNEAL_MIN_RATIO = 1e-4  # ... or T falls below 1e-4 of the critical temperature
_ANNEAL_POWER_ITER = 10  # power iterations for the clusters' principal axes
_ANNEAL_MERGE = 1e-2  # centroids closer than ||c_i - c_j||^2 < 1e-2 T are merged
_ANNEAL_SPLIT = 0.05  # a split centroid's children start at c +- 0.05 sqrt(lambda_max) v


def principal_axes(X, sample_weight, centers, temperature, log_prior, directions, n_iter=10):
    """Largest eigenvalue and axis of each soft cluster's covariance, by power iteration.

    Cluster j's covariance is ``sum_i w_i r_ij (x_i - c_j)(x_i - c_j)^T / sum_i w_i r_ij`` with
    ``r`` the responsibilities at ``temperature`` (a single centroid: the weighted covariance).
    In deterministic annealing (Rose, 1998), centroid j becomes unstable and splits along that
    axis when the temperature falls below its critical value ``2 lambda_max``. All clusters are
    iterated together, O(n k d) per iteration, warm-started from ``directions``. The (n, k)
    weighted responsibilities are held in memory: meant for the annealing subsample. ``X``: a
    dense tensor (one block) or :class:`RowBlocks` (read in budget-sized blocks).

    Returns ``(lam, axes)``: (k,) eigenvalues and (k, d) unit axes.
    """
    points = as_row_blocks(X)
    k = centers.shape[0]
    tiny = torch.finfo(points.dtype).tiny
    row_bytes = points.element_size() * 3 * k  # the k-wide products and weights of a row
    V = directions / directions.norm(dim=1, keepdim=True).clamp(min=tiny)
    # (k, n) layout: reductions over the centroids are elementwise over contiguous rows
    if k == 1:
        A = sample_weight[None, :]
    else:
        bias = -(centers * centers).sum(1) / temperature + log_prior
        blocks = []
        for start, stop, x in points.blocks(row_bytes):
            z = torch.addmm(bias[:, None], centers, x.T, alpha=2.0 / temperature)
            r = z.sub_(z.amax(0)).exp_()
            blocks.append(r.mul_(sample_weight[start:stop] / r.sum(0)))
        A = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=1)
    mass = A.sum(1).clamp(min=tiny)
    lam = torch.zeros(k, dtype=points.dtype, device=points.device)
    for _ in range(n_iter):
        offset = (centers * V).sum(1)[:, None]
        acc = weights = None
        for start, stop, x in points.blocks(row_bytes):
            proj = (V @ x.T).sub_(offset)  # (x_i - c_j) . v_j
            ap = proj.mul_(A[:, start:stop])
            acc = ap @ x if acc is None else acc.add_(ap @ x)
            weights = ap.sum(1) if weights is None else weights.add_(ap.sum(1))
        acc = acc.sub_(weights[:, None] * centers).div_(mass[:, None])
        lam = acc.norm(dim=1)
        V = torch.where(lam[:, None] > 0, acc / lam.clamp(min=tiny)[:, None], V)
    return lam, V


def anneal(Xt, wt, k, init_centers, rng, verbose=0, shift=None):
    """Deterministic annealing to ``k`` centroids with splits at critical temperatures.

    Starts with one centroid at the weighted mean and the temperature at its critical value
    ``2 lambda_max``. At each level: EM to equilibrium (soft assignments with the centroids'
    masses as log-prior, weighted means), then every centroid whose critical temperature
    ``2 lambda_max`` (of its soft cluster) lies above the next temperature splits in two along
    its principal axis, most unstable first, until there are ``k``. ``rng`` (a NumPy
    ``RandomState``) draws the subsample and the starting axis; ``init_centers()`` gives the
    centroids used when annealing cannot run (one cluster, identical points). Returns the
    centroids (in ``Xt``'s dtype) and the number of EM steps. ``Xt`` and ``shift`` as in
    ``_cluster.kmeans_step``.
    """
    points = as_row_blocks(Xt, shift)
    n_sample = min(points.shape[0], _ANNEAL_MAX_SAMPLES)
    # a small sample's passes on one thread: too short for a parallel region to pay, and on a
    # busy machine each of their kernels waited for a descheduled thread
    with small_work_single_threaded(n_sample * k * points.shape[1], points.device):
        return _anneal(points, wt, k, init_centers, rng, verbose)


def _anneal(points, wt, k, init_centers, rng, verbose):
    """:func:`anneal` of the points as row blocks."""
    n = points.shape[0]
    if n > _ANNEAL_MAX_SAMPLES:
        idx = torch.from_numpy(np.sort(rng.choice(n, _ANNEAL_MAX_SAMPLES, replace=False))).to(
            points.device
        )
        sample, ws = points.take(idx), wt[idx]
    else:
        sample, ws = points, wt
    if k == 1 or not bool((ws > 0).any()):
        return init_centers(), 0
    # Annealing only has to reach the right basin: float32 is enough (Lloyd follows in the
    # data's precision).
    dtype, device = torch.float32, points.device
    Xs, ws = _float32_sample(sample), ws.to(dtype)
    ws = ws / ws.sum()
    gen = torch.Generator().manual_seed(int(rng.randint(np.iinfo(np.int32).max)))
    C = _weighted_sum(Xs, ws)[None, :]
    log_p = torch.zeros(1, dtype=dtype, device=device)
    V = torch.randn((1, Xs.shape[1]), generator=gen, dtype=torch.float64).to(device, dtype)
    lam, V = principal_axes(Xs, ws, C, 1.0, log_p, V, n_iter=_ANNEAL_POWER_ITER)
    t_crit = 2.0 * float(lam[0])
    if not t_crit > 0:
        return init_centers(), 0
    T, t_min, n_iter = t_crit, _ANNEAL_MIN_RATIO * t_crit, 0
    levels = inner_bar(verbose, desc="annealing", unit="level")
    while True:
        if C.shape[0] > 1:
            for _ in range(_ANNEAL_MAX_INNER):
                step = kmeans_step(Xs, C, ws, temperature=T, log_prior=log_p)
                n_iter += 1
                C_new = weighted_means(step["sums"], step["mass"], C)
                log_p = torch.log(step["mass"].clamp(min=torch.finfo(dtype).tiny))
                shift = float(((C_new - C) ** 2).sum(1).max())
                C = C_new
                if shift < _ANNEAL_INNER_TOL * T:
                    break
            hardness = step["hardness"]
            # children of a premature split fall back together: merge coincident centroids
            # so that the copy can split where it is needed
            C, log_p, V = _merge(C, log_p, V, _ANNEAL_MERGE * T)
        else:
            hardness = 0.0
        m = C.shape[0]
        levels.set_postfix(T=f"{T:.4g}", centroids=m, hardness=f"{hardness:.4f}", refresh=False)
        levels.update()
        if verbose >= 2:
            write(f"  annealing T={T:.4g}: {m} centroids, hardness {hardness:.4f}")
        if (m == k and hardness >= _ANNEAL_HARDNESS) or T < t_min:
            break
        T_next = T * _ANNEAL_COOLING
        if m < k:
            if m > 1:
                lam, V = principal_axes(Xs, ws, C, T, log_p, V, n_iter=_ANNEAL_POWER_ITER)
            C, log_p, V = _split(C, log_p, V, lam, k, threshold=T_next / 2.0)
        T = T_next
    levels.close()
    if C.shape[0] < k:  # still too few (near-duplicate data): split the widest clusters anyway
        lam, V = principal_axes(Xs, ws, C, max(T, 1e-300), log_p, V, n_iter=_ANNEAL_POWER_ITER)
        C, log_p, V = _split(C, log_p, V, lam, k, threshold=0.0)
    C = C.to(points.dtype)
    if C.shape[0] < k:  # identical points: pad with initial centres (Lloyd relocates empties)
        C = torch.cat([C, init_centers()[: k - C.shape[0]]])
    return C, n_iter


def _float32_sample(sample):
    """The annealing subsample in float32: a dense tensor when the points are dense (held whole,
    as they are) or when its dense form fits the budget, else row blocks densified as read."""
    sample = sample.astype(torch.float32)
    dense_bytes = sample.shape[0] * (sample.copy_bytes() + sample.shape[1] * 4)
    if not sample.sparse or dense_bytes <= budget_bytes():
        return sample.dense()
    return sample


def _weighted_sum(X, weights):
    """``weights @ X`` for a dense tensor, or summed over the blocks of :class:`RowBlocks`."""
    if not isinstance(X, RowBlocks):
        return weights @ X
    total = None
    for start, stop, x in X.blocks(row_bytes=0):
        part = weights[start:stop] @ x
        total = part if total is None else total.add_(part)
    return total


def _split(C, log_p, V, lam, k, threshold):
    """Split centroids with ``lambda_max > threshold`` (largest first) until there are ``k``."""
    order = torch.argsort(lam, descending=True)
    chosen = [int(j) for j in order if float(lam[j]) > threshold][: k - C.shape[0]]
    if not chosen:
        return C, log_p, V
    idx = torch.tensor(chosen, device=C.device)
    step = _ANNEAL_SPLIT * lam[idx].sqrt()[:, None] * V[idx]
    C = C.clone()
    C[idx] = C[idx] + step
    log_p = log_p.clone()
    log_p[idx] = log_p[idx] - np.log(2.0)
    return torch.cat([C, C[idx] - 2 * step]), torch.cat([log_p, log_p[idx]]), torch.cat([V, V[idx]])


def _merge(C, log_p, V, threshold):
    """Merge centroids closer than ``sqrt(threshold)`` (mass-weighted mean, masses added)."""
    m = C.shape[0]
    if m < 2:
        return C, log_p, V
    d2 = ((C[:, None, :] - C[None, :, :]) ** 2).sum(2)
    close = torch.triu(d2 < threshold, diagonal=1)
    if not bool(close.any()):
        return C, log_p, V
    p = log_p.exp()
    alive = torch.ones(m, dtype=torch.bool)
    C, p = C.clone(), p.clone()
    for i in range(m):
        if not alive[i]:
            continue
        for j in close[i].nonzero().squeeze(1).tolist():
            if alive[j]:
                C[i] = (p[i] * C[i] + p[j] * C[j]) / (p[i] + p[j])
                p[i] = p[i] + p[j]
                alive[j] = False
    alive = alive.to(C.device)
    return C[alive], torch.log(p[alive]), V[alive]
