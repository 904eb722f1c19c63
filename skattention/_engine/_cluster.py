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

The iterations built on these steps (Lloyd's algorithm exactly as scikit-learn's, soft k-means at
a fixed temperature, deterministic annealing with splits at critical temperatures) are here too;
``skattention.cluster.AttentionKMeans`` is their scikit-learn shell.
"""

import numpy as np
import torch

from ._budget import budget_bytes, cpu_block_rows, plan_rows
from ._progress import progress_bar, write
from ._scores import padded_rows

# Accelerators: at most this many points per block.
_ACCEL_BLOCK_ROWS = 1 << 20
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


def _block_rows(n, k, d, itemsize, device, working_memory):
    # per row: distances, logits/responsibilities and their temporaries (4 x k), the weighted
    # copy of the row (d), norms, labels and weights.
    if device.type == "cpu":  # cache-sized: the 4 k-wide temporaries, and about 4 copies of x
        cap = min(cpu_block_rows(4 * k), max(1024, cpu_block_rows(4 * d)))
    else:
        cap = _ACCEL_BLOCK_ROWS
    return plan_rows(
        n, row_bytes=itemsize * (4 * k + d + 4) + 8, budget=budget_bytes(working_memory),
        max_rows=cap,
    )


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
    rows = _block_rows(
        n, k, d + (d if shift is not None else 0), X.element_size(), X.device, working_memory
    )
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
        return {
            "sums": sums,
            "mass": mass,
            "hardness": float(hardness) / total if total > 0 else 1.0,
        }
    labels = torch.empty(n, dtype=torch.long, device=X.device)
    min_sq = torch.empty(n, dtype=X.dtype, device=X.device)
    ct = centers.T.contiguous()
    for s in range(0, n, rows):
        e = min(n, s + rows)
        x = X[s:e] if shift is None else X[s:e] - shift
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
    ``shift`` (d,) is subtracted from each block of ``X`` (centring without a copy of ``X``).
    """
    n, d = X.shape
    k = centers.shape[0]
    out = torch.empty((n, k), dtype=X.dtype, device=X.device)
    rows = plan_rows(
        n, row_bytes=X.element_size() * (2 * k * d + (d if shift is not None else 0)),
        budget=budget_bytes(working_memory),
        max_rows=cpu_block_rows(2 * k * d) if X.device.type == "cpu" else None,  # diff, diff**2
    )
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


def anneal(Xt, wt, k, init_centers, rng, verbose=0):
    """Deterministic annealing to ``k`` centroids with splits at critical temperatures.

    Starts with one centroid at the weighted mean and the temperature at its critical value
    ``2 lambda_max``. At each level: EM to equilibrium (soft assignments with the centroids'
    masses as log-prior, weighted means), then every centroid whose critical temperature
    ``2 lambda_max`` (of its soft cluster) lies above the next temperature splits in two along
    its principal axis, most unstable first, until there are ``k``. ``rng`` (a NumPy
    ``RandomState``) draws the subsample and the starting axis; ``init_centers()`` gives the
    centroids used when annealing cannot run (one cluster, identical points). Returns the
    centroids (in ``Xt``'s dtype) and the number of EM steps.
    """
    n = Xt.shape[0]
    if n > _ANNEAL_MAX_SAMPLES:
        idx = torch.from_numpy(np.sort(rng.choice(n, _ANNEAL_MAX_SAMPLES, replace=False))).to(
            Xt.device
        )
        Xs, ws = Xt[idx], wt[idx]
    else:
        Xs, ws = Xt, wt
    if k == 1 or not bool((ws > 0).any()):
        return init_centers(), 0
    # Annealing only has to reach the right basin: float32 is enough (Lloyd follows in the
    # data's precision).
    dtype, device = torch.float32, Xt.device
    Xs, ws = Xs.to(dtype), ws.to(dtype)
    ws = ws / ws.sum()
    gen = torch.Generator().manual_seed(int(rng.randint(np.iinfo(np.int32).max)))
    C = (ws @ Xs)[None, :]
    log_p = torch.zeros(1, dtype=dtype, device=device)
    V = torch.randn((1, Xs.shape[1]), generator=gen, dtype=torch.float64).to(device, dtype)
    lam, V = principal_axes(Xs, ws, C, 1.0, log_p, V, n_iter=_ANNEAL_POWER_ITER)
    t_crit = 2.0 * float(lam[0])
    if not t_crit > 0:
        return init_centers(), 0
    T, t_min, n_iter = t_crit, _ANNEAL_MIN_RATIO * t_crit, 0
    levels = _inner_bar(verbose, desc="annealing", unit="level")
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
    C = C.to(Xt.dtype)
    if C.shape[0] < k:  # identical points: pad with initial centres (Lloyd relocates empties)
        C = torch.cat([C, init_centers()[: k - C.shape[0]]])
    return C, n_iter


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


def lloyd(X, w, centers, max_iter, tol, verbose, on_iteration=None):
    """Lloyd's iterations exactly as scikit-learn's ``_kmeans_single_lloyd``.

    Each iteration assigns every point to its nearest centre (ties to the lowest index), then
    moves each centre to the weighted mean of its points, relocating empty clusters to the
    points farthest from their centres (or, when every point sits on its centre, to the
    heaviest cluster's centre). Stops when the labels stop changing (strict
    convergence) or the summed squared centre shift is ``<= tol``; without strict convergence a
    last assignment makes labels and centres consistent.

    ``on_iteration(centers)``, when given, is called after each iteration with the new centres
    (a tensor the loop does not modify afterwards); it returning ``True`` stops the iterations
    there, as convergence would (the estimators' callbacks, which the engine does not import).
    """
    labels_old = None
    n_iter = 0
    bar = _inner_bar(verbose, total=max_iter, desc="Lloyd")
    for i in range(max_iter):
        step = kmeans_step(X, centers, w)
        labels = step["labels"]
        new = _centers_from_sums(X, w, centers, step, labels)
        shift = float(((new - centers) ** 2).sum())
        centers = new
        n_iter = i + 1
        bar.set_postfix(shift=f"{shift:.3g}", refresh=False)
        bar.update()
        if on_iteration is not None and on_iteration(centers):
            break
        if labels_old is not None and torch.equal(labels, labels_old):
            break  # strict convergence
        if shift <= tol:
            break
        labels_old = labels
    bar.close()
    # Labels and inertia of the final centres (after strict convergence the labels cannot change).
    step = kmeans_step(X, centers, w, update=False)
    labels = step["labels"]
    inertia = float((step["min_sqdist"].double() * w.double()).sum())
    if verbose >= 2:
        write(f"  Lloyd: {n_iter} iterations, inertia {inertia:.6g}")
    return centers, labels, inertia, n_iter


def _centers_from_sums(X, w, centers_old, step, labels):
    sums, mass = step["sums"].clone(), step["mass"].clone()
    empty = (mass == 0).nonzero().squeeze(1)
    if empty.numel():
        # scikit-learn's _relocate_empty_clusters_dense: move each empty centre to one of the
        # points farthest from their (old) centre, taking it out of its cluster.
        d2 = ((X - centers_old[labels]) ** 2).sum(1)
        if float(d2.max()) > 0:
            far = torch.from_numpy(
                np.argpartition(d2.cpu().numpy(), -empty.numel())[: -empty.numel() - 1 : -1].copy()
            )
            for j, idx in zip(empty.tolist(), far.tolist()):
                old = int(labels[idx])
                sums[old] -= X[idx] * w[idx]
                sums[j] = X[idx] * w[idx]
                mass[j] = w[idx]
                mass[old] -= w[idx]
    # A cluster still empty (more clusters than distinct points) goes where the heaviest one
    # is, as in scikit-learn's _average_centers. (scikit-learn copies that cluster's weighted sum
    # instead of its centre when it comes later in the order; the centre is what it intends.)
    centers = weighted_means(sums, mass, centers_old)
    return torch.where((mass > 0)[:, None], centers, centers[int(torch.argmax(mass))])


def weighted_means(sums, mass, centers_old):
    """The M-step: ``sums / mass`` per centroid; a centroid without mass stays where it was."""
    keep = mass > 0
    return torch.where(keep[:, None], sums / torch.where(keep, mass, 1.0)[:, None], centers_old)


def soft_kmeans(X, w, centers, T, max_iter, tol, verbose, on_iteration=None):
    """Soft k-means at a fixed temperature (equal priors) to a fixed point; ``on_iteration`` as
    in :func:`lloyd`."""
    n_iter = 0
    bar = _inner_bar(verbose, total=max_iter, desc="soft k-means")
    for i in range(max_iter):
        step = kmeans_step(X, centers, w, temperature=T)
        new = weighted_means(step["sums"], step["mass"], centers)
        shift = float(((new - centers) ** 2).sum())
        centers = new
        n_iter = i + 1
        bar.set_postfix(shift=f"{shift:.3g}", refresh=False)
        bar.update()
        if on_iteration is not None and on_iteration(centers):
            break
        if shift <= tol:
            break
    bar.close()
    step = kmeans_step(X, centers, w, update=False)
    inertia = float((step["min_sqdist"].double() * w.double()).sum())
    return centers, step["labels"], inertia, n_iter


def _inner_bar(verbose, total=None, desc=None, unit="it"):
    """Bar of an inner loop (annealing levels, iterations of a run): shown at ``verbose=1``
    once it lasts a couple of seconds; ``verbose >= 2`` writes lines instead."""
    return progress_bar(verbose == 1, total=total, desc=desc, unit=unit, inner=True)
