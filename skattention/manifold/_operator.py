"""The attention (Markov) operator of a point set and its leading eigenpairs.

S = softmax_j(-||x_i - x_j||^2 / eps - alpha log q_j), q_j = sum_l exp(-||x_j - x_l||^2 / eps), is
Coifman–Lafon's alpha-normalised diffusion operator written as attention with a log-prior
(the documentation's theory page). It is similar to the symmetric matrix
A = D^-1/2 K_alpha D^-1/2 (K_alpha = Q^-alpha K Q^-alpha, D its row sums), whose eigenvectors
are computed instead so that everything stays real.
"""

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from .._engine import available_memory, budget_bytes, gaussian_kernel, kneighbors, plan_rows
from ._eigen import resolve_eigen_solver

# Points sampled by the bandwidth rule (their 90th percentile is what it needs).
_BANDWIDTH_QUERIES = 2000
# epsilon="auto" with the k-NN operator: effective neighbours wanted, as a fraction of k.
_KNN_DEGREE_FRACTION = 0.9
# epsilon="auto" gives this fraction of the points the target number of effective neighbours.
_COVERED_QUANTILE = 0.9
# epsilon="auto": the bandwidth rule looks at each sampled point's ceil(3 sqrt(n)) + 1 nearest,
# at most _MAX_REFERENCE_NEIGHBORS of them (reached at 7,200 points: beyond, only the k-NN
# operator is chosen by default, whose own bound on eps is the smaller one, and the exact
# selection of thousands of neighbours per point would cost more than the whole graph).
_REFERENCE_NEIGHBORS = 3.0
_MAX_REFERENCE_NEIGHBORS = 256
# With the k-NN operator, whose eps is at most the k-NN rule's (a kernel nearly flat over the
# k-NN ball), the reference neighbourhoods need only reach a few k-NN radii: at most
# max(64, 4 n_neighbors) points (the engine's selection costs about k per query and key).
_KNN_REFERENCE_FACTOR = 4
_KNN_MIN_REFERENCE = 64
# n_neighbors="auto" beyond the dense operator's size: each point's k-NN ball (itself included).
AUTO_NEIGHBORS = 15


_NO_SCALE = ("every point coincides with the nearest points looked at (duplicated rows): there "
             "is no scale to choose a bandwidth from; pass epsilon, or drop the duplicates.")
_UNDERFLOW = ("the squared distances between every point and the nearest points looked at "
              "underflow to 0 in float64 (the points differ by less than about 1e-162): there is "
              "no scale to choose a bandwidth from; rescale the data.")
_SUBNORMAL = ("the bandwidth chosen from the squared distances between the points and the nearest "
              "points looked at, {:.3g}, is below float64's smallest normal number (the points "
              "differ by about 1e-154 or less): their kernel would be rounding noise; rescale the "
              "data.")


def per_point_bandwidth(neighbor_d2, target_degree, quantile=_COVERED_QUANTILE):
    """The smallest eps giving a ``quantile`` of the points ``target_degree`` effective neighbours.

    A point's effective number of neighbours is its kernel degree
    ``sum_j exp(-d_ij^2 / eps)`` (itself included) over the squared distances in its row of
    ``neighbor_d2``; each point's own eps is found by bisection on ``log eps`` (40 halvings of a
    range of a few dozen: log eps to 1e-10).
    """
    positive = neighbor_d2[neighbor_d2 > 0]
    if positive.size == 0:
        raise ValueError(_NO_SCALE)
    target = min(max(target_degree, 1.0 + 1e-3), neighbor_d2.shape[1] - 1e-3)
    lo0, hi0 = math.log(positive.min()) - 2.0, math.log(positive.max()) + 4.0
    del positive
    n, k = neighbor_d2.shape
    lo, hi = np.full(n, lo0), np.full(n, hi0)
    # np.quantile reads the order statistics at these ranks (linear interpolation).
    below = math.floor(quantile * (n - 1))
    ranks = [below, min(below + 1, n - 1)]
    # Rows are independent: blocks of rows keep the (rows, k) temporaries within working_memory.
    rows = plan_rows(n, row_bytes=3 * 8 * k, budget=budget_bytes())
    active = np.arange(n)
    for _ in range(40):
        for start in range(0, len(active), rows):
            at = active[start : start + rows]
            lo_b, hi_b = lo[at], hi[at]
            mid = (lo_b + hi_b) / 2
            kernel = np.divide(neighbor_d2[at], np.exp(mid)[:, None])
            np.exp(np.negative(kernel, out=kernel), out=kernel)
            enough = kernel.sum(1) >= target
            hi[at], lo[at] = np.where(enough, mid, hi_b), np.where(enough, lo_b, mid)
        # Every row has taken the same halvings of one range, so two rows' intervals are equal
        # or disjoint, and a row's final bound stays within its interval: only the rows in the
        # intervals of the order statistics read can still change the quantile; the others
        # keep their current bound, which ranks them as their final one would.
        wanted = np.partition(hi, ranks)[ranks]
        active = active[np.isin(hi[active], wanted)]
    return float(np.exp(np.quantile(hi, quantile)))


def bgh_bandwidth(neighbor_d2):
    """Berry–Giannakis–Harlim: ``(eps, dimension)`` where ``log sum_ij exp(-d_ij^2 / eps)`` grows
    fastest in ``log eps``, and twice that slope.

    The sum runs over the rows of ``neighbor_d2`` (each point's nearest points, itself and its
    duplicates included at distance 0): below the sample spacing only those zeros count (slope
    0), above the neighbourhoods' radius the sum saturates (slope 0 again), and in between it
    grows like ``eps^(d/2)`` on a d-dimensional manifold. The slope is evaluated exactly on a
    histogram of the log squared distances, on a grid of 16 steps per octave.
    """
    positive = neighbor_d2[neighbor_d2 > 0]
    if positive.size == 0:
        raise ValueError(_NO_SCALE)
    n_zero = neighbor_d2.size - positive.size
    counts, edges = np.histogram(np.log(positive), bins=512)
    centres = np.exp((edges[:-1] + edges[1:]) / 2)
    centres, counts = centres[counts > 0], counts[counts > 0].astype(float)
    log_eps = np.arange(edges[0] - 3.0, edges[-1] + 3.0, math.log(2.0) / 16)
    ratio = centres[None, :] / np.exp(log_eps)[:, None]  # d^2 / eps per (grid point, bin)
    weight = counts[None, :] * np.exp(-ratio)
    # d log T / d log eps = sum_j (d_j^2 / eps) exp(-d_j^2 / eps) / T, T = n_zero + sum_j exp(...)
    slope = (weight * ratio).sum(1) / (n_zero + weight.sum(1))
    best = int(np.argmax(slope))
    return float(np.exp(log_eps[best])), float(2.0 * slope[best])


def bandwidth_sample(n, random_state):
    """The points whose neighbourhoods the bandwidth rule looks at: ``_BANDWIDTH_QUERIES`` of
    the ``n`` drawn from ``random_state`` (sorted), or all of them when there are no more."""
    if n > _BANDWIDTH_QUERIES:
        return np.sort(random_state.choice(n, _BANDWIDTH_QUERIES, replace=False))
    return np.arange(n)


def reference_size(n, n_neighbors):
    """How many nearest points (each point itself included) the bandwidth rule looks at for
    ``n`` points: ``ceil(3 sqrt(n)) + 1``, at most 256, and with the k-NN operator of
    ``n_neighbors`` (``None``: the dense one) at most ``max(64, 4 n_neighbors)``."""
    k = min(n, math.ceil(_REFERENCE_NEIGHBORS * math.sqrt(n)) + 1, _MAX_REFERENCE_NEIGHBORS)
    if n_neighbors is not None:
        k = min(k, max(_KNN_MIN_REFERENCE, _KNN_REFERENCE_FACTOR * n_neighbors))
    return k


def reference_neighbors(Z, sample, k, device, keys=None):
    """``(squared distances, indices)`` of the ``k`` nearest points of ``Z[sample]`` among
    ``Z`` (``keys``: ``Z`` prepared by the engine, or ``None``), in the engine's exact
    (distance, index) order."""
    return kneighbors(Z[sample], Z if keys is None else keys, k, device=device, dtype="float64")


def auto_epsilon(Z, knn_d2, random_state, device, keys=None, *, sample=None, reference=None):
    """``(epsilon, dimension)`` for ``epsilon="auto"``.

    On up to 2,000 sampled points and their ``ceil(3 sqrt(n)) + 1`` nearest points (themselves
    included; at most 256, and with the k-NN operator at most ``max(64, 4 n_neighbors)``;
    ``keys``: ``Z`` prepared by the engine, or ``None``),
    :func:`bgh_bandwidth` gives the dimension and a bandwidth at which a typical point's
    neighbourhood looks d-dimensional; the number of effective neighbours (kernel
    degree ``sum_j exp(-d_ij^2 / eps)``) of the median point there is the target, and eps is the
    smallest bandwidth at which 90% of the points reach it, so that sparse regions get as many
    neighbours as the typical point (:func:`per_point_bandwidth`). The Gaussian then lies within
    the neighbourhoods, so the operator is the Gaussian-kernel operator whose eigenvalues
    estimate the Laplace–Beltrami spectrum (docs/manifold.md has the measurements).

    With the k-NN operator (``knn_d2``, each point's ``n_neighbors`` squared distances) eps is
    at most the bandwidth that gives 90% of the points ``0.9 n_neighbors`` effective neighbours:
    with a small ``n_neighbors`` the kernel is then nearly flat over the k-NN ball, like an
    unweighted k-NN graph, which stays connected across the random gaps of a small-k graph (a
    Gaussian inside the ball would leave too few effective neighbours; the eigenvalue estimate
    corrects for the truncation, see :func:`laplacian_eigenvalues`).

    ``sample``: the points drawn already (:func:`bandwidth_sample`; else drawn from
    ``random_state``), ``reference``: their neighbours found already
    (:func:`reference_neighbors` of :func:`reference_size` of them; else searched).
    """
    n = Z.shape[0]
    if sample is None:
        sample = bandwidth_sample(n, random_state)
    k = reference_size(n, None if knn_d2 is None else knn_d2.shape[1])
    if reference is None:
        reference = reference_neighbors(Z, sample, k, device, keys)
    idx = reference[1]
    if idx.shape != (len(sample), k):
        raise ValueError(f"reference neighbours of shape {idx.shape}, not {(len(sample), k)}.")
    # The slope is read on a log scale: rounding residues of the blockwise distances (about
    # 1e-16 of the squared norms) in place of exact zeros (each point itself, duplicates) would
    # stretch it; the distances of the chosen neighbours are recomputed exactly.
    d2 = _exact_sq_distances(Z, sample, idx)
    if not np.any(d2) and any(np.any(Z[sample] != Z[column]) for column in idx.T):
        raise ValueError(_UNDERFLOW)  # distinct points, not the duplicates of _NO_SCALE
    scale, dimension = bgh_bandwidth(d2)
    target = float(np.median(np.exp(-d2 / scale).sum(1)))
    epsilon = per_point_bandwidth(d2, target)
    if knn_d2 is not None and np.any(knn_d2[sample] > 0):
        # (where every k-NN ball holds copies of its point alone, any eps gives them all: no cap)
        flat = per_point_bandwidth(knn_d2[sample], _KNN_DEGREE_FRACTION * knn_d2.shape[1])
        epsilon = min(epsilon, flat)
    if epsilon < np.finfo(np.float64).tiny:  # subnormal: the operator came out the identity
        raise ValueError(_SUBNORMAL.format(epsilon))
    return epsilon, dimension


def _exact_sq_distances(Z, rows, idx):
    """``||Z[rows[i]] - Z[idx[i, j]]||^2`` by differences (exact zeros for coincident points),
    in chunks of rows that keep the gathered differences within the working memory."""
    out = np.empty(idx.shape)
    chunk = plan_rows(len(rows), row_bytes=2 * 8 * idx.shape[1] * Z.shape[1], budget=budget_bytes())
    for start in range(0, len(rows), chunk):
        diff = Z[rows[start : start + chunk], None, :] - Z[idx[start : start + chunk]]
        out[start : start + chunk] = np.einsum("ijk,ijk->ij", diff, diff)
    return out


def laplacian_eigenvalues(mu, op, epsilon, dimension):
    """Estimates of the limit operator's eigenvalues from the eigenvalues ``mu`` of ``S``.

    For the Gaussian kernel ``exp(-d^2 / eps)`` in flat space, ``S`` is the heat semigroup at time
    ``eps / 4``: ``mu = exp(-lambda eps / 4)``, so ``lambda = -4 log(mu) / eps`` (the first-order
    ``4 (1 - mu) / eps`` falls short by ``lambda eps / 8`` relatively). A k-NN graph that cuts the
    Gaussian off shortens the diffusion's steps: ``eps / 4`` becomes ``J / (2 d)``, with ``J`` the
    operator's mean squared step (``op.mean_sq_jump``) and ``d`` the intrinsic ``dimension``
    (the untruncated Gaussian has ``J = d eps / 2``). Non-positive ``mu`` give ``inf``; a graph
    whose steps all have length 0 (every point's neighbours its copies) gives 0 for ``mu >= 1``
    (its components) and ``inf`` for the rest.
    """
    scale = epsilon / 4.0
    if op.mean_sq_jump is not None and dimension is not None and dimension > 0:
        scale *= min(1.0, 2.0 * op.mean_sq_jump / (dimension * epsilon))
    if not scale > 0:
        return np.where(mu >= 1.0, 0.0, np.inf)
    with np.errstate(divide="ignore"):
        return np.where(mu > 0, -np.log(np.where(mu > 0, mu, 1.0)) / scale, np.inf)


@dataclass
class DiffusionOperator:
    """A = D^-1/2 K_alpha D^-1/2 with what the out-of-sample extension needs."""

    A: object  # ndarray (dense) or csr_matrix (k-NN)
    degree: np.ndarray  # D, row sums of K_alpha
    connected: bool  # whether the graph of the nonzero affinities is connected
    log_prior: np.ndarray  # -alpha log q_j: the attention prior of the Markov operator
    radius: np.ndarray  # k-NN graph: distance to each point's k-th neighbour (itself first)
    mean_sq_jump: float = None  # k-NN graph: sum_ij pi_i S_ij d_ij^2, the mean squared step of S


def resolve_n_neighbors(n_neighbors, n):
    """The operator for ``n`` points: ``None`` (dense) or the k of the k-NN graph.

    ``"auto"``: the dense operator while its ``n x n`` float64 array fits in the working memory
    (``working_memory`` MiB: 5,792 points at the default 256) and, together with that working
    memory (the fit's blocks may take it all), in the memory available to the process; the
    k-NN graph of ``AUTO_NEIGHBORS`` points otherwise (at most ``n``), as SpectralEmbedding
    defaults to its nearest-neighbours affinity; an explicit value is kept.
    """
    if n_neighbors != "auto":
        return n_neighbors
    need = 8 * n * n
    if need <= budget_bytes() and _shortfall(need, n) is None:
        return None
    return min(n, AUTO_NEIGHBORS)


# Bytes a (row, column) entry of the blocks that fill a diffusion fit's n x n arrays may take
# (the kernel's float64 temporaries): the most scratch those blocks hold is this times n^2.
_SCRATCH_PAIR_BYTES = 32


def _shortfall(array_bytes, n):
    """``None`` where arrays of ``array_bytes`` fit in the memory available to the process
    besides the scratch of ``n`` points' blocks (or that memory cannot be read), else
    ``(scratch, available)`` in bytes. The kernel and neighbour blocks of the same fit may take
    all of ``working_memory`` (which a ``ulimit -v`` can leave no room for) but never more
    than a few n x n arrays, and an allocation past what is available fails in torch only
    after the work before it."""
    available = available_memory()
    scratch = min(budget_bytes(), _SCRATCH_PAIR_BYTES * n * n)
    if available is None or array_bytes + scratch <= available:
        return None
    return scratch, available


def check_dense_memory(n, n_neighbors, eigen_solver, k, owner="AttentionDiffusionEmbedding",
                       auto=True):
    """Check that the dense n x n arrays of a diffusion fit fit in the memory available
    (``owner`` names the fit in the message; ``auto``: it takes ``n_neighbors="auto"``).

    The dense operator is one n x n float64 array (the shift-invert Cholesky factorises it in
    place); a full ``eigh`` adds its eigenvectors and LAPACK workspace (about 3 n^2 more). Like
    scikit-learn's dense SpectralEmbedding these arrays are the algorithm's, not scratch: an
    explicit ``n_neighbors=None`` or ``eigen_solver="dense"`` is checked against the memory
    available to the process less the working memory (``n_neighbors="auto"`` chooses the dense
    operator only within ``working_memory``), which bounds the blocks that fill them. Raises
    ``MemoryError`` suggesting the k-NN operator, another eigen-solver or a smaller
    ``working_memory`` when they cannot fit.
    """
    full_eigh = resolve_eigen_solver(eigen_solver, n, k, n_neighbors is not None) == "dense"
    if n_neighbors is not None and not full_eigh:
        return
    need = 8 * n * n * ((0 if n_neighbors is not None else 1) + (3 if full_eigh else 0))
    short = _shortfall(need, n)
    if short is None:
        return
    scratch, available = short
    what = (
        f"a dense {n} x {n} operator"
        if n_neighbors is None
        else f"a dense {n} x {n} eigen-decomposition"
    )
    values = "an int or 'auto'" if auto else "an int"
    hint = (
        f"set n_neighbors to {values} (a sparse k-NN operator)"
        if n_neighbors is None
        else "use eigen_solver='arpack' or 'lobpcg'"
        + (" (or 'auto')" if eigen_solver != "auto" else "")
    )
    if need <= available:  # the working memory is what does not fit besides the arrays
        hint += " or lower working_memory (skattention.config_context(working_memory=...))"
    raise MemoryError(
        f"{owner} needs {need / 2**20:.1f} MiB for {what} besides up to "
        f"{scratch / 2**20:.1f} MiB of working memory, but only {available / 2**20:.1f} MiB "
        f"of memory is available; {hint}."
    )


def diffusion_operator(Z, epsilon, alpha, knn, device, include_self=True):
    """Build the symmetric conjugate of the alpha-normalised attention operator.

    Dense (``knn=None``): the n x n kernel is the only n x n array (normalised in place), built in
    blocks within ``working_memory`` (MiB of scratch besides it). k-NN (``knn=(d2, idx)`` from
    :func:`knn_graph`): the symmetric graph in which j is a neighbour of i if it is among i's k
    nearest points (i itself included) or i is among j's. ``include_self=False`` gives each point
    no affinity with itself (a zero diagonal, as in the graph Laplacian of scikit-learn's
    SpectralEmbedding); points at distance 0 from each other keep theirs.
    """
    n = Z.shape[0]
    radius = mean_sq_jump = None
    self_affinity = 1.0 if include_self else 0.0
    if knn is None:
        K = gaussian_kernel(Z, Z, epsilon, device=device, dtype="float64")
        np.fill_diagonal(K, self_affinity)  # exact (the blockwise formula rounds)
        q = K.sum(1)
        _check_degrees(q, epsilon)
        connected = _dense_graph_connected(K)
        if alpha:
            scale = q**-alpha
            K *= scale[:, None]
            K *= scale[None, :]
        d = K.sum(1)
        inv_sqrt = 1.0 / np.sqrt(d)
        K *= inv_sqrt[:, None]
        K *= inv_sqrt[None, :]
        A = K
    else:
        d2, idx = knn
        radius = np.sqrt(d2[:, -1])
        # Each row's columns sorted once: both matrices are then built in canonical CSR form
        # directly (no COO conversion and duplicate sums).
        order = np.argsort(idx, axis=1, kind="stable")
        cols = np.take_along_axis(idx, order, axis=1).ravel()
        d2_sorted = np.take_along_axis(d2, order, axis=1).ravel()
        indptr = np.arange(0, n * idx.shape[1] + 1, idx.shape[1])
        K = sp.csr_matrix((np.exp(-d2_sorted / epsilon), cols, indptr), shape=(n, n))
        K = K.maximum(K.T).tocsr()  # the union graph; the kernel is symmetric
        K.setdiag(self_affinity)
        K.eliminate_zeros()
        q = np.asarray(K.sum(1)).ravel()
        _check_degrees(q, epsilon)
        connected = connected_components(K, directed=False, return_labels=False) == 1
        if alpha:
            _scale_entries(K, q**-alpha)
        d = np.asarray(K.sum(1)).ravel()
        sq_dist = sp.csr_matrix((d2_sorted, cols, indptr), shape=(n, n))
        mean_sq_jump = float(K.multiply(sq_dist.maximum(sq_dist.T)).sum() / d.sum())
        _scale_entries(K, 1.0 / np.sqrt(d))
        A = K
    return DiffusionOperator(
        A=A, degree=d, connected=connected, log_prior=-alpha * np.log(q), radius=radius,
        mean_sq_jump=mean_sq_jump,
    )


def _scale_entries(K, scale):
    """``diag(scale) @ K @ diag(scale)`` in the memory of the CSR matrix ``K``, rounded as the
    two sparse products round it (the row's factor first); entries that underflow to 0 are
    dropped, as the products drop them."""
    K.data *= np.repeat(scale, np.diff(K.indptr))
    K.data *= scale[K.indices]
    if not K.data.all():
        K.eliminate_zeros()


def _dense_graph_connected(K):
    """Whether the graph of the nonzero entries of the dense symmetric ``K`` (nonnegative) is
    connected: the points reached from the first, grown by one product with ``K`` per hop (a
    sparse copy of a dense kernel would hold all n^2 entries again)."""
    reached = np.zeros(K.shape[0])
    reached[0] = 1.0
    count = 1
    while True:
        reached = (K @ reached > 0).astype(np.float64)
        new_count = int(reached.sum())
        if new_count in (count, K.shape[0]):
            return new_count == K.shape[0]
        count = new_count


def _check_degrees(q, epsilon):
    if not np.all(q > 0):
        raise ValueError(
            f"{int(np.sum(q <= 0))} points have no affinity with any other point at "
            f"epsilon={epsilon:.6g} (include_self=False); raise epsilon or use n_neighbors."
        )


def knn_graph(Z, n_neighbors, device, keys=None, progress=False, known=None):
    """Squared distances and indices of each point's ``n_neighbors`` nearest points, itself first,
    by the engine's exact blockwise selection (``keys``: ``Z`` prepared by the engine once for
    this and the bandwidth rule, or ``None``).

    ``known``: ``(rows, d2, idx)``, at least ``n_neighbors`` nearest points of some rows found
    by the same selection (the bandwidth rule's :func:`reference_neighbors`): in its exact
    (distance, index) order their first ``n_neighbors`` are these rows' graph, so only the
    other rows are searched.
    """
    keys = Z if keys is None else keys
    if known is None:
        d2, idx = kneighbors(Z, keys, n_neighbors, device=device, dtype="float64",
                             progress=progress)
    else:
        rows, known_d2, known_idx = known
        if known_idx.shape[1] < n_neighbors:
            raise ValueError(f"{known_idx.shape[1]} known neighbours, fewer than {n_neighbors}.")
        d2 = np.empty((len(Z), n_neighbors), dtype=np.float64)
        idx = np.empty((len(Z), n_neighbors), dtype=known_idx.dtype)
        d2[rows], idx[rows] = known_d2[:, :n_neighbors], known_idx[:, :n_neighbors]
        rest = np.ones(len(Z), dtype=bool)
        rest[rows] = False
        if rest.any():
            d2[rest], idx[rest] = kneighbors(Z[rest], keys, n_neighbors, device=device,
                                             dtype="float64", progress=progress)
    # Each point is its own nearest neighbour at distance exactly 0 (duplicates aside).
    d2[:, 0] = np.where(idx[:, 0] == np.arange(len(Z)), 0.0, d2[:, 0])
    return d2, idx


def knn_graph_and_reference(Z, n_neighbors, sample, n_reference, device, keys=None,
                             progress=False):
    """``(knn_graph(...), reference)``: the k-NN graph and, for ``epsilon="auto"``
    (``sample`` not ``None``), the bandwidth rule's :func:`reference_neighbors` of ``sample``,
    searched once for both where ``n_reference >= n_neighbors`` (the sampled points' graph rows
    are the first ``n_neighbors`` of theirs, in the same exact order); else ``None`` for
    :func:`auto_epsilon` to search."""
    known = reference = None
    if sample is not None and n_reference >= n_neighbors:
        reference = reference_neighbors(Z, sample, n_reference, device, keys)
        known = (sample, *reference)
    return knn_graph(Z, n_neighbors, device, keys=keys, progress=progress, known=known), reference


def diffusion_coordinates(op, eigenvectors):
    """Right eigenvectors psi = D^-1/2 v of the Markov operator, with unit mean square under its
    stationary distribution, and a deterministic sign (largest entry positive)."""
    psi = eigenvectors / np.sqrt(op.degree)[:, None] * math.sqrt(op.degree.sum())
    biggest = np.abs(psi).argmax(0)
    psi *= np.sign(psi[biggest, np.arange(psi.shape[1])])[None, :]
    return psi


def signed_power(mu, t):
    """mu ** t, defined for negative mu and fractional t as sign(mu) |mu| ** t."""
    if float(t).is_integer():
        return mu ** int(t)
    return np.sign(mu) * np.abs(mu) ** t
