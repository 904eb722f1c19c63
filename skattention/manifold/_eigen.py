"""The leading eigenpairs of the symmetric diffusion operator ``A = D^-1/2 K_alpha D^-1/2``.

Four solvers, as :class:`~sklearn.manifold.SpectralEmbedding` names them, plus a full
decomposition:

* ``"dense"``: ``torch.linalg.eigh`` of the whole matrix (on the device);
* ``"arpack"``: scipy's Lanczos in shift-invert mode just above the top eigenvalue 1, with a
  Cholesky factorisation made in the memory of a dense operator or a sparse LU of a k-NN one
  (whose size is estimated first, ``_sparse_lu_estimate``);
* ``"lobpcg"``: LOBPCG with products by ``A`` only (no factorisation), for the smallest
  eigenvalues of the Laplacian ``L = I - A`` (``1 - mu``, computed without the cancellation of
  ``1 - mu`` when ``mu`` crowds near 1). On a k-NN operator it is preconditioned by a
  smoothed-aggregation multigrid cycle of ``L`` (``_multigrid``) and starts from the
  coarsest level's eigenvectors, prolongated: the iterations it needs then stay bounded as
  ``n`` grows, where without a preconditioner they grow with the condition of ``L``;
* ``"amg"``: LOBPCG preconditioned by pyamg's smoothed aggregation (optional dependency).

``"auto"``: dense up to a few hundred points; beyond, ``"arpack"`` on a dense operator and
``"lobpcg"`` on a k-NN operator (for more than ten components, ``"arpack"`` where its sparse
LU fits the working memory).

The null vector of ``L`` is known, ``sqrt(D)`` (eigenvalue 1 of ``A``): LOBPCG searches its
orthogonal complement and the known pair is prepended.

Every solver runs with scipy's BLAS on one thread: OpenBLAS's multithreaded Cholesky
(``dpotrf``) crashes the process with a segmentation fault on large matrices (reproduced
with SciPy's and NumPy's OpenBLAS builds, without torch loaded; docs/performance.md), and on a
shared machine the thin products of Lanczos and LOBPCG lose more at each call's thread barrier
than a second thread gains.
"""

import math

import numpy as np
import scipy.sparse as sp
import torch
from scipy.linalg import cho_factor, cho_solve
from scipy.sparse.csgraph import (
    breadth_first_order,
    connected_components,
    reverse_cuthill_mckee,
)
from scipy.sparse.linalg import LinearOperator, eigsh, splu
from sklearn.exceptions import ConvergenceWarning
from threadpoolctl import threadpool_limits

from .._engine import available_memory, budget_bytes, progress_bar, resolve_device
from ..utils._warnings import warn_user
from ._lobpcg import lobpcg_smallest
from ._multigrid import laplacian_multigrid

# "auto": a full dense decomposition up to this many points.
_DENSE_EIGEN_MAX = 200
# "auto" on a k-NN operator takes LOBPCG for up to this many eigenpairs: measured as fast or
# faster than shift-invert with a sparse LU there (1.0-3.8x on 2-10-D data, 6,000-100,000
# points, up to 10 components), in megabytes where the LU took up to gigabytes, and on a real
# table (one isolated point beside one component) where Lanczos ran for minutes; with more
# eigenpairs LOBPCG's block grows and Lanczos was 2-8x faster (docs/manifold.md).
_LOBPCG_AUTO_PAIRS = 11
# ... and for more eigenpairs, shift-invert with a sparse LU up to this many points where the
# LU's estimated size fits in the working memory, LOBPCG otherwise.
_SPARSE_LU_MAX = 100_000
# SuperLU cannot be stopped once it runs, and past the memory there is the kernel ends the
# process (a MemoryError comes only under an address-space limit): the LU's size is estimated
# before it is made, from trial LUs of balls of the graph (_sparse_lu_estimate), whose
# power-law growth extrapolated was within 1 + _TRIAL_ERROR * (_TRIAL_NODES / m) ** 0.75 of
# the LU on data of one intrinsic dimension (m: the ball's nodes; docs/manifold.md).
_TRIAL_NODES = 1000
_TRIAL_ERROR = 2.4
# Balls grown from this many nodes spread over a component: a region of higher intrinsic
# dimension fills more than a ball elsewhere predicts.
_TRIAL_STARTS = 4
# Bytes per entry of the LU: a float64 value and an int32 row index.
_LU_ENTRY_BYTES = 12
# Shift-invert target just above the top eigenvalue 1 of A: the leading eigenvalues, which
# crowd near 1 when eps is small, become well separated (1 / (mu - sigma)).
_SHIFT = 1.0 + 1e-6
# LOBPCG: extra vectors in the block, beyond those wanted. The convergence of the wanted ones
# depends on their gap to the first eigenvalue outside the block, which guards widen.
_GUARD_VECTORS = 2
# LOBPCG needs at least this many points per block vector (the dense solver below).
_POINTS_PER_VECTOR = 5
# eigen_tol="auto" for LOBPCG: the residual norm ||L v - lambda v|| of each wanted unit vector
# at most this fraction of its eigenvalue lambda = 1 - mu. Its angle to the eigenvector is at
# most that residual over the gap to the other eigenvalues, and lambda / gap is a ratio of the
# limit operator's eigenvalues: the same accuracy at every n, where a fixed residual norm is
# out of reach at large n (the eigenvalues shrink like n^(-2/d)) and loose at small n.
_RELATIVE_TOL = 1e-5
# ... and at least this: the rounding of a product with L leaves residual norms of about 1e-15.
_ABSOLUTE_TOL = 1e-13
# LOBPCG iterations at most.
_MAX_ITER = 1000


def resolve_eigen_solver(eigen_solver, n, k, sparse, A=None):
    """The solver that finds ``k`` eigenpairs of an operator on ``n`` points (``sparse``:
    a k-NN operator): ``"dense"`` (asked for, ``"auto"`` up to ``_DENSE_EIGEN_MAX`` points, or
    too many eigenpairs for an iterative solver), else ``eigen_solver``, with ``"auto"``
    resolved to ``"arpack"`` for dense operators, ``"lobpcg"`` for k-NN operators up to
    ``_LOBPCG_AUTO_PAIRS`` eigenpairs; with more, ``"arpack"`` on k-NN operators up to
    ``_SPARSE_LU_MAX`` points, ``"lobpcg"`` beyond.

    Given the k-NN operator ``A`` itself, the size of its sparse LU is estimated
    (:func:`_sparse_lu_estimate`) where arpack would factorise it: ``"auto"`` takes
    ``"lobpcg"`` unless the estimate fits in the working memory and the memory available, and
    an explicit ``"arpack"`` raises ``MemoryError`` where it exceeds the memory available.
    """
    if eigen_solver == "dense" or k >= n - 1:
        return "dense"
    if eigen_solver in ("lobpcg", "amg") and n < _POINTS_PER_VECTOR * (k + _GUARD_VECTORS):
        return "dense"
    knn_operator = A is not None and sp.issparse(A)
    if eigen_solver == "auto":
        if n <= _DENSE_EIGEN_MAX:
            return "dense"
        if sparse and (k <= _LOBPCG_AUTO_PAIRS or n > _SPARSE_LU_MAX
                       or knn_operator and not _sparse_lu_fits(A)):
            return resolve_eigen_solver("lobpcg", n, k, sparse)
        return "arpack"
    if eigen_solver == "arpack" and knn_operator:
        _check_sparse_lu(A)
    return eigen_solver


def _sparse_lu_fits(A):
    """Whether the estimated sparse LU of the k-NN operator ``A`` fits in the working memory
    and in the memory available to the process."""
    limit = budget_bytes()
    available = available_memory()
    if available is not None:
        limit = min(limit, available)
    return _sparse_lu_estimate(A, limit) <= limit


def _check_sparse_lu(A):
    """``MemoryError`` where the estimated sparse LU of the k-NN operator ``A`` exceeds the
    memory available to the process. Like the dense operator of an explicit
    ``eigen_solver="dense"`` (``_operator.check_dense_memory``), the LU of an explicit
    ``"arpack"`` is the algorithm's array, not scratch: the working memory does not bound it."""
    available = available_memory()
    if available is None:
        return
    estimate = _sparse_lu_estimate(A, available)
    if estimate > available:
        raise MemoryError(
            f"eigen_solver='arpack' factorises the {A.shape[0]:,}-point k-NN operator: its "
            f"sparse LU, estimated from trial factorisations, may need up to "
            f"{estimate / 2**20:.1f} MiB but only {available / 2**20:.1f} MiB of memory is "
            "available; use eigen_solver='lobpcg' or 'auto' (products by the operator only, "
            "no factorisation)."
        )


def _sparse_lu_estimate(A, limit):
    """An estimate from above of the bytes of the sparse LU of ``sigma I - A`` (``A`` a
    symmetric sparse operator), refined only until it decides against ``limit`` bytes (a
    value above ``limit`` may stop short of the best estimate). Components of fewer than
    ``4 * _TRIAL_NODES`` points are bounded by their dense LU; each larger one by the largest
    extrapolation of balls grown from ``_TRIAL_STARTS`` nodes spread over it."""
    n_components, labels = connected_components(A, directed=False)
    sizes = np.bincount(labels).astype(np.float64)
    small = sizes < 4 * _TRIAL_NODES
    # a dense LU holds the diagonal in both factors
    estimate = _LU_ENTRY_BYTES * float(np.sum(sizes[small] * (sizes[small] + 1)))
    A = A.tocsr()
    for component in np.flatnonzero(~small):
        if estimate > limit:
            break
        nodes = np.flatnonzero(labels == component)
        graph = A if n_components == 1 else A[nodes][:, nodes]
        estimate += _component_lu_estimate(graph, limit - estimate)
    return estimate


def _component_lu_estimate(graph, limit):
    """:func:`_sparse_lu_estimate` of a connected graph of at least ``4 * _TRIAL_NODES``
    nodes: per start node (a pseudo-peripheral one, then nodes evenly spaced in a
    breadth-first order from it), balls of its first ``m / 2`` and ``m`` nodes breadth first,
    ``m`` doubling from ``_TRIAL_NODES`` up to a quarter of the graph, their growth taken as a
    power of the size (at least linear) and extrapolated; each start refined until its
    interval (the error factor both ways) decides against ``limit``."""
    size = graph.shape[0]
    far = breadth_first_order(graph, 0, directed=False, return_predecessors=False)[-1]
    sweep = breadth_first_order(graph, far, directed=False, return_predecessors=False)
    starts = sweep[(np.arange(_TRIAL_STARTS) * size) // _TRIAL_STARTS]
    estimate = 0.0
    for start in starts:
        order = sweep if start == far else breadth_first_order(
            graph, start, directed=False, return_predecessors=False)
        m, half = _TRIAL_NODES, _ball_lu_entries(graph, order[: _TRIAL_NODES // 2])
        low, high = 0.0, math.inf
        while 4 * m <= size and low <= limit < high:
            entries = _ball_lu_entries(graph, order[:m])
            growth = max(1.0, math.log2(entries / half))
            predicted = _LU_ENTRY_BYTES * entries * (size / m) ** growth
            error = 1.0 + _TRIAL_ERROR * (_TRIAL_NODES / m) ** 0.75
            low, high = predicted / error, predicted * error
            # the next ball's LU, at this growth, stays within the limit too
            if _LU_ENTRY_BYTES * entries * 2.0**growth > limit:
                break
            half, m = entries, 2 * m
        estimate = max(estimate, high)
        if estimate > limit:
            break
    return min(estimate, _LU_ENTRY_BYTES * size * (size + 1.0))


def _ball_lu_entries(graph, nodes):
    """The entries of the sparse LU of the principal subgraph of the CSR ``graph`` on
    ``nodes``."""
    nodes = np.sort(nodes)
    return _sparse_lu(graph[nodes][:, nodes]).nnz


def _sparse_lu(A):
    """SuperLU's factorisation of ``sigma I - A`` (of the sparse symmetric ``A``)."""
    # sigma I - A is symmetric positive definite: a symmetric fill-reducing ordering and
    # no pivoting (an LDL^T in effect) factorise it about 3x faster than scipy's default.
    return splu(
        (A - _SHIFT * sp.identity(A.shape[0], format="csr")).tocsc(),
        permc_spec="MMD_AT_PLUS_A",
        diag_pivot_thresh=0.0,
        options=dict(SymmetricMode=True),
    )


def top_eigenpairs(A, k, eigen_solver, device, random_state, *, sqrt_degree=None,
                   eigen_tol="auto", progress=False, on_solve=None, after_arpack=False,
                   resolved=False):
    """The ``k`` largest eigenvalues of the symmetric ``A`` (descending) and their eigenvectors.

    ``A`` is consumed: the dense shift-invert path factorises ``sigma I - A`` in its memory.
    ``sqrt_degree``: ``sqrt(D)``, the top eigenvector (eigenvalue 1), which LOBPCG and AMG
    need. ``eigen_tol``: ARPACK's relative accuracy of the eigenvalues (``"auto"``: machine
    precision) / LOBPCG's largest residual norm ``||L v - lambda v||`` of the unit vectors
    (``"auto"``: ``_RELATIVE_TOL`` of each ``lambda = 1 - mu``, at least ``_ABSOLUTE_TOL``).
    ``progress``: verbosity. ``on_solve()``, when given, is called after each application of
    the iterated operator (ARPACK's shift-inverted solve, a LOBPCG iteration); its result is
    ignored: the solvers cannot be stopped and still return eigenpairs. ``after_arpack``: LOBPCG
    is the fallback from ARPACK, which its warning then does not advise. ``resolved``:
    ``eigen_solver`` is :func:`resolve_eigen_solver`'s answer for ``A`` already (the size of a
    sparse LU is not predicted again).
    """
    solver = (eigen_solver if resolved else
              resolve_eigen_solver(eigen_solver, A.shape[0], k, sp.issparse(A), A=A))
    with threadpool_limits(limits=1, user_api="blas"):
        if solver == "dense":
            w, v = _dense_eigh(A, k, device)
        elif solver == "arpack":
            tol = 0.0 if eigen_tol == "auto" else float(eigen_tol)
            w, v = _shift_invert(A, k, tol, random_state, progress, on_solve)
        else:
            w, v = _lobpcg_pairs(A, sqrt_degree, k, _lobpcg_tolerance(eigen_tol), solver,
                                 random_state, progress, on_solve, after_arpack)
    # stable: the known top eigenvector stays first when a disconnected graph ties it
    order = np.argsort(-w, kind="stable")
    return np.ascontiguousarray(w[order]), np.ascontiguousarray(v[:, order])


def _lobpcg_tolerance(eigen_tol):
    """The largest residual norms LOBPCG accepts, a function of the wanted eigenvalues of
    ``L``: relative to each (``"auto"``) or ``eigen_tol`` for all."""
    if eigen_tol == "auto":
        return lambda lam: np.maximum(_RELATIVE_TOL * np.abs(lam), _ABSOLUTE_TOL)
    # below the rounding's residuals no iteration converges (eigen_tol=0: as close as they
    # allow, as ARPACK's 0 is machine precision)
    return lambda lam: np.full(len(lam), max(float(eigen_tol), _ABSOLUTE_TOL))


def _dense_eigh(A, k, device):
    dense = A.toarray() if sp.issparse(A) else A
    dense = torch.from_numpy(np.ascontiguousarray(dense)).to(resolve_device(device))
    w, v = torch.linalg.eigh(dense)
    return w.cpu().numpy()[::-1][:k], v.cpu().numpy()[:, ::-1][:, :k]


def _shift_invert(A, k, tol, random_state, progress, on_solve):
    """Shift-invert Lanczos: the eigenvalues of A near 1 become the largest of
    (sigma I - A)^-1, far apart even when eps is small and they crowd below 1."""
    n = A.shape[0]
    v0 = random_state.uniform(-1, 1, n)
    if sp.issparse(A):
        solve = _sparse_lu(A).solve
    else:
        A *= -1.0
        A.flat[:: n + 1] += _SHIFT  # sigma I - A, positive definite, factorised in place
        # A is symmetric, so its transpose (a Fortran-ordered view) is the same matrix:
        # LAPACK factorises it in place instead of copying n x n.
        factor = cho_factor(A.T, overwrite_a=True, check_finite=False)

        def solve(x):
            return -cho_solve(factor, x, check_finite=False)

    with progress_bar(progress, desc="Lanczos", unit="solve", inner=True) as bar:

        def counted_solve(x):
            bar.update()
            x = solve(x)
            if on_solve is not None:
                on_solve()
            return x

        inverse = LinearOperator((n, n), matvec=counted_solve, dtype=np.float64)
        # In shift-invert mode ARPACK only applies OPinv = (A - sigma I)^-1; A is never used.
        return eigsh(_never_applied(n), k=k, sigma=_SHIFT, which="LM", OPinv=inverse, v0=v0,
                     tol=tol)


def _never_applied(n):
    def fail(x):
        raise RuntimeError("shift-invert Lanczos applied A itself")  # pragma: no cover

    return LinearOperator((n, n), matvec=fail, dtype=np.float64)


def _lobpcg_pairs(A, sqrt_degree, k, tolerance, solver, random_state, progress, on_solve,
                  after_arpack=False):
    """LOBPCG (``solver="lobpcg"`` or ``"amg"``) for the smallest eigenpairs of the Laplacian
    ``L = I - A`` orthogonal to its known null vectors (one per connected component of a sparse
    graph), which are prepended (the eigenvalues returned are those of ``A``: ``1 - lambda``)."""
    top = sqrt_degree / np.linalg.norm(sqrt_degree)
    n = A.shape[0]
    nulls, order, start_block = top[:, None], None, None
    if sp.issparse(A):
        # Nodes renumbered along the graph (reverse Cuthill-McKee): the rows a product with
        # the graph gathers then lie close in memory, where the data's order scatters them.
        order = reverse_cuthill_mckee(A.tocsr(), symmetric_mode=True)
        L = (sp.identity(n, format="csr") - A).tocsr()[order][:, order].tocsr()
        top = top[order]
        # A disconnected graph has eigenvalue 1 once per component (each component's
        # sqrt(D)); LOBPCG started from one null vector found the others only by chance: they
        # are known, so they join the top vector as constraints
        nulls = _null_vectors(L, top)

        def apply(V):
            return L @ V

        if solver == "amg":
            precondition = _amg_preconditioner(L)
        else:
            precondition = laplacian_multigrid(L, top, random_state)
            start_block = precondition.start_block
    else:

        def apply(V):
            return V - A @ V

        precondition = None
        if solver == "amg":
            precondition = _amg_preconditioner(sp.identity(n) - sp.csr_matrix(A))
    known = min(k, nulls.shape[1])
    wanted, block = k - known, k - known + _GUARD_VECTORS
    X = None if start_block is None else start_block(block)
    if X is None or X.shape[1] < block:
        X = random_state.standard_normal((n, block))
    lam = np.zeros(0)
    if wanted:
        lam, X = _iterate(apply, X, nulls, precondition, wanted, tolerance, progress, on_solve,
                          after_arpack)
    vectors = np.c_[nulls[:, :known], X[:, :wanted]]
    if order is not None:
        vectors[order] = vectors.copy()
    return np.r_[np.ones(known), 1.0 - lam[:wanted]], vectors


def _null_vectors(L, top):
    """An orthonormal basis of the Laplacian ``L``'s null space, ``top`` (its normalised
    ``sqrt(D)``) first: each connected component's part of ``top``, orthogonalised against
    ``top`` (one vector for a connected graph)."""
    n_components, labels = connected_components(L, directed=False)
    if n_components == 1:
        return top[:, None]
    parts = np.zeros((top.shape[0], n_components))
    parts[np.arange(top.shape[0]), labels] = top
    rest = parts - top[:, None] * (top @ parts)[None, :]
    basis, _ = np.linalg.qr(rest)  # rank n_components - 1: the last column is noise
    return np.c_[top, basis[:, :n_components - 1]]


def _iterate(apply, X, nulls, precondition, wanted, tolerance, progress, on_solve,
             after_arpack=False):
    """:func:`lobpcg_smallest` (orthogonal to the orthonormal columns of ``nulls``) with a
    progress bar of at most ``_MAX_ITER`` iterations (the time left at most) and a
    ``ConvergenceWarning`` when they do not reach ``tolerance``."""
    with progress_bar(progress, total=_MAX_ITER, desc=f"LOBPCG on {X.shape[0]:,} points",
                      unit="it", inner=True) as bar:

        def count():
            bar.update()
            if on_solve is not None:
                on_solve()

        lam, X, residual, done = lobpcg_smallest(
            apply, X, nulls, precondition, wanted, tolerance, _MAX_ITER, count
        )
    if np.any(residual > tolerance(lam[:wanted])):
        warn_user(
            f"LOBPCG stopped after {done} iterations with a residual norm of "
            f"{residual.max():.3g} above its tolerance "
            f"{tolerance(lam[:wanted]).min():.3g}; raise eigen_tol or "
            + ("epsilon (ARPACK, which it fell back from, did not converge either: eigenvalues "
               "crowded at 1)." if after_arpack else "use eigen_solver='arpack'."),
            ConvergenceWarning,
        )
    return lam, X


def _amg_preconditioner(L):
    """pyamg's smoothed aggregation of the Laplacian ``L`` shifted by ``1e-5`` (positive
    definite), as scikit-learn's SpectralEmbedding builds it for ``eigen_solver="amg"``."""
    try:
        from pyamg import smoothed_aggregation_solver
    except ImportError as exc:
        raise ImportError(
            "eigen_solver='amg' needs pyamg (pip install pyamg); eigen_solver='lobpcg' needs "
            "no extra package."
        ) from exc
    shifted = sp.csr_matrix(L) + 1e-5 * sp.identity(L.shape[0], format="csr")
    return smoothed_aggregation_solver(shifted.tocsr()).aspreconditioner()
