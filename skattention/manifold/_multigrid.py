"""A smoothed-aggregation multigrid preconditioner for the graph Laplacian ``L = I - A``.

``A = D^-1/2 K_alpha D^-1/2`` is the symmetric diffusion operator of a k-NN graph, so
``L`` is positive semi-definite with the known null vector ``sqrt(D)``. Its smallest
nonzero eigenvalues, the ones the embedding needs, shrink with the graph's spacing (like
``n^(-2/d)`` on a d-dimensional manifold) while its largest stay near 1 and 2: without a
preconditioner the iterations LOBPCG needs grow with ``n``.

The hierarchy aggregates the graph's nodes level after level (neighbours grouped around
roots that no two neighbours share), down to a few hundred nodes. Each level's
prolongation is the piecewise-constant one (weighted by the null vector, which it therefore
keeps exactly) smoothed by one damped Jacobi step, as in Vanek, Mandel and Brezina's
smoothed aggregation (pyamg's ``smoothed_aggregation_solver``); the coarse operators are
the Galerkin products ``P^T L P``, and the coarsest is inverted exactly on the complement of
its null vector. One symmetric cycle, a damped Jacobi sweep before and after each coarse
correction (one correction per visit on the finest level, two below: a W-cycle there),
approximates ``L^+`` on whole blocks of vectors at once. The spectral radius of ``D^-1 L``
that sets the damping is estimated by a few Lanczos steps: Gershgorin's bound can be nearly
twice it where a few points have a large self-affinity, and damps too little.
"""

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.linalg import eigvalsh_tridiagonal

# The hierarchy aggregates until at most this many nodes remain, inverted densely.
COARSEST = 600
# Aggregation rounds; nodes left after them are aggregates of their own.
_AGGREGATION_ROUNDS = 4
# Damping of the Jacobi steps (smoothing and the prolongation's smoothing), over a bound of
# the spectral radius of D^-1 L: error components at that radius are multiplied by -1/3.
_JACOBI_DAMPING = 4.0 / 3.0
# The spectral radius of D^-1 L is estimated by this many Lanczos steps, widened by this much.
_LANCZOS_STEPS = 20
_RADIUS_SLACK = 0.05
# Jacobi sweeps before and after each coarse correction.
_SWEEPS = 1
# Coarse corrections per visit of a level below the finest: a W-cycle there, whose quality
# does not wane with the number of levels as a V-cycle's does, for a few percent more work
# (each level has about a tenth of the nodes of the finer one).
_COARSE_CORRECTIONS = 2
# Eigenvalues of the coarsest operator below this fraction of its largest are its null space.
_COARSE_NULL = 1e-12


@dataclass
class _Level:
    laplacian: object  # csr: this level's operator
    jacobi: np.ndarray  # the damped Jacobi step: damping / diagonal (0 on empty rows)
    prolongation: object  # csr: coarser level -> this level
    restriction: object  # csr: its transpose


@dataclass
class LaplacianMultigrid:
    """The levels of the hierarchy and the coarsest operator's pseudo-inverse
    (``coarse_vectors``, ``coarse_inverse``: its eigenvectors and inverse eigenvalues on the
    complement of its null space)."""

    levels: list
    coarse_vectors: np.ndarray
    coarse_inverse: np.ndarray

    def __call__(self, B):
        """One cycle on the block ``B`` (n x m): an approximation of ``L^+ B``."""
        return self._cycle(np.asarray(B, dtype=np.float64).reshape(B.shape[0], -1), 0)

    def _cycle(self, B, depth):
        if depth == len(self.levels):
            V = self.coarse_vectors
            return V @ (self.coarse_inverse[:, None] * (V.T @ B))
        level = self.levels[depth]
        X = level.jacobi[:, None] * B
        for _ in range(_SWEEPS - 1):
            X += level.jacobi[:, None] * (B - level.laplacian @ X)
        for _ in range(1 if depth == 0 else _COARSE_CORRECTIONS):
            X += level.prolongation @ self._cycle(
                level.restriction @ (B - level.laplacian @ X), depth + 1
            )
        for _ in range(_SWEEPS):
            X += level.jacobi[:, None] * (B - level.laplacian @ X)
        return X

    def start_block(self, m):
        """``m`` vectors of the finest level: the coarsest operator's eigenvectors of the
        smallest nonzero eigenvalues, prolongated level by level (a start for LOBPCG)."""
        X = self.coarse_vectors[:, :m]
        for level in reversed(self.levels):
            X = level.prolongation @ X
        return X


def laplacian_multigrid(L, null_vector, random_state):
    """The multigrid hierarchy of the CSR Laplacian ``L`` whose null vector is
    ``null_vector``; ``random_state`` orders the nodes of each aggregation."""
    levels = []
    L = L.tocsr()
    while L.shape[0] > COARSEST:
        # the strength of a connection is the affinity -L_ij (positive off the diagonal)
        aggregate_of, n_aggregates = aggregate(-L, random_state)
        if n_aggregates > L.shape[0] // 2:  # too little coarsening to pay
            break
        tentative = prolongation(null_vector, aggregate_of, n_aggregates)
        diagonal = L.diagonal()
        inverse = np.divide(1.0, diagonal, out=np.zeros_like(diagonal), where=diagonal > 0)
        jacobi = (_JACOBI_DAMPING / _spectral_radius(L, inverse, random_state)) * inverse
        # (I - w D^-1 L) keeps the null vector: L null_vector = 0
        P = (tentative - sp.diags(jacobi) @ (L @ tentative)).tocsr()
        levels.append(_Level(L, jacobi, P, P.T.tocsr()))
        L = (P.T @ L @ P).tocsr()
        null_vector = tentative.T @ null_vector
    w, V = np.linalg.eigh(L.toarray())
    keep = w > _COARSE_NULL * max(w[-1], 0.0)
    return LaplacianMultigrid(levels, np.ascontiguousarray(V[:, keep]), 1.0 / w[keep])


def _spectral_radius(L, inverse, random_state):
    """An estimate of the largest eigenvalue of ``D^-1 L`` (``inverse``: ``D^-1``): the largest
    Ritz value of ``_LANCZOS_STEPS`` Lanczos steps on its symmetric conjugate, widened by
    ``_RADIUS_SLACK`` (a Ritz value bounds it from below)."""
    root = np.sqrt(inverse)
    v = random_state.uniform(-1, 1, L.shape[0])
    v /= np.linalg.norm(v)
    previous, beta = np.zeros_like(v), 0.0
    alphas, betas = [], []
    for _ in range(min(_LANCZOS_STEPS, L.shape[0])):
        w = root * (L @ (root * v)) - beta * previous
        alpha = float(w @ v)
        w -= alpha * v
        alphas.append(alpha)
        beta = float(np.linalg.norm(w))
        if beta <= 1e-12 * abs(alpha):  # an invariant subspace: the Ritz values are exact
            break
        betas.append(beta)
        previous, v = v, w / beta
    top = eigvalsh_tridiagonal(np.array(alphas), np.array(betas[: len(alphas) - 1]))[-1]
    return float(top) * (1.0 + _RADIUS_SLACK) if top > 0 else 1.0


def aggregate(S, random_state):
    """Nodes of the graph of ``S`` grouped into aggregates of neighbours: ``(aggregate of each
    node, number of aggregates)``. In each round the free nodes whose random priority beats
    that of each free neighbour become roots (no two adjacent), and every free neighbour of a
    root joins the root it is most strongly connected to (the largest positive ``S_ij``)."""
    n = S.shape[0]
    rows = np.repeat(np.arange(n), np.diff(S.indptr))
    cols, weights = S.indices, S.data
    priority = random_state.permutation(n).astype(np.float64)
    aggregate_of = np.full(n, -1)
    n_aggregates = 0
    for _ in range(_AGGREGATION_ROUNDS):
        free = aggregate_of < 0
        if not free.any():
            break
        p = np.where(free, priority, -1.0)
        root = free & (p >= _row_max(S, p[cols]))
        aggregate_of[root] = n_aggregates + np.arange(np.count_nonzero(root))
        n_aggregates += int(np.count_nonzero(root))
        link = np.where(root[cols] & free[rows] & ~root[rows], weights, -1.0)
        strongest = _row_max(S, link)
        joins = (link > 0) & (link >= strongest[rows])
        aggregate_of[rows[joins]] = aggregate_of[cols[joins]]
    alone = aggregate_of < 0
    aggregate_of[alone] = n_aggregates + np.arange(np.count_nonzero(alone))
    return aggregate_of, n_aggregates + int(np.count_nonzero(alone))


def _row_max(S, values):
    """The largest of ``values`` (one per stored entry of the CSR ``S``) in each row; -inf in
    empty rows."""
    out = np.full(S.shape[0], -np.inf)
    nonempty = np.diff(S.indptr) > 0
    out[nonempty] = np.maximum.reduceat(values, S.indptr[:-1][nonempty])
    return out


def prolongation(vector, aggregate_of, n_aggregates):
    """The prolongation ``P`` (n x n_aggregates, orthonormal columns) that is constant on each
    aggregate up to ``vector``'s weights: ``vector`` lies in its range (``P P^T vector =
    vector``)."""
    mass = np.bincount(aggregate_of, weights=vector**2, minlength=n_aggregates)
    values = vector / np.sqrt(mass[aggregate_of])
    n = len(vector)
    return sp.csr_matrix((values, (np.arange(n), aggregate_of)), shape=(n, n_aggregates))
