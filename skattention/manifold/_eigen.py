"""The leading eigenpairs of the symmetric diffusion operator ``A = D^-1/2 K_alpha D^-1/2``.

Four solvers, as :class:`~sklearn.manifold.SpectralEmbedding` names them, plus a full
decomposition:

* ``"dense"``: ``torch.linalg.eigh`` of the whole matrix (on the device);
* ``"arpack"``: scipy's Lanczos in shift-invert mode just above the top eigenvalue 1, with a
  Cholesky factorisation made in the memory of a dense operator or a sparse LU of a k-NN one;
* ``"lobpcg"``: LOBPCG with products by ``A`` only (no factorisation). On a k-NN operator it
  starts from a multilevel cascade: the graph's nodes are aggregated level after level
  (``A_c = P^T A P``, the Galerkin operator of a piecewise-constant prolongation ``P``) down
  to a few hundred nodes, solved there exactly, and each level's eigenvectors, prolongated,
  start LOBPCG on the next finer level;
* ``"amg"``: LOBPCG preconditioned by pyamg's smoothed aggregation (optional dependency).

The top eigenvector of ``A`` is known, ``sqrt(D)`` with eigenvalue 1: LOBPCG searches its
orthogonal complement (scipy's constraints ``Y``) and the known pair is prepended.

Every solver runs with scipy's BLAS on one thread: OpenBLAS's multithreaded Cholesky
(``dpotrf``) crashes the process with a segmentation fault on large matrices (reproduced
with SciPy's and NumPy's OpenBLAS builds, without torch loaded; docs/performance.md), and on a
shared machine the thin products of Lanczos and LOBPCG lose more at each call's thread barrier
than a second thread gains.
"""

import warnings

import numpy as np
import scipy.sparse as sp
import torch
from scipy.linalg import cho_factor, cho_solve
from scipy.sparse.linalg import LinearOperator, eigsh, lobpcg, splu
from sklearn.exceptions import ConvergenceWarning
from threadpoolctl import threadpool_limits

from .._engine import progress_bar, resolve_device

# "auto": a full dense decomposition up to this many points.
_DENSE_EIGEN_MAX = 200
# "auto" on a k-NN operator: shift-invert with a sparse LU up to this many points (its fill
# grows faster than the graph), LOBPCG beyond.
_SPARSE_LU_MAX = 100_000
# Shift-invert target just above the top eigenvalue 1 of A: the leading eigenvalues, which
# crowd near 1 when eps is small, become well separated (1 / (mu - sigma)).
_SHIFT = 1.0 + 1e-6
# LOBPCG: extra vectors in the block, beyond those wanted. The convergence of the wanted ones
# depends on their gap to the first eigenvalue outside the block, which guards widen.
_GUARD_VECTORS = 6
# LOBPCG needs at least this many points per block vector (scipy falls back to eigh below).
_POINTS_PER_VECTOR = 5
# eigen_tol="auto" for LOBPCG: largest residual norm ||A v - mu v|| of the wanted unit vectors.
_LOBPCG_TOL = 1e-6
# LOBPCG iterations at most, on the finest level, and on each coarse level of the cascade
# (only a start there), and between two convergence checks (a restart keeps the block).
_MAX_ITER = 1000
_COARSE_MAX_ITER = 60
_CHECK_EVERY = 20
# The multilevel cascade aggregates until at most this many nodes remain, solved by eigh.
_COARSEST = 600
# Aggregation rounds; nodes left after them are aggregates of their own.
_AGGREGATION_ROUNDS = 4


def resolve_eigen_solver(eigen_solver, n, k, sparse):
    """The solver that finds ``k`` eigenpairs of an operator on ``n`` points (``sparse``:
    a k-NN operator): ``"dense"`` (asked for, ``"auto"`` up to ``_DENSE_EIGEN_MAX`` points, or
    too many eigenpairs for an iterative solver), else ``eigen_solver``, with ``"auto"``
    resolved to ``"arpack"`` for dense operators and k-NN operators up to ``_SPARSE_LU_MAX``
    points, ``"lobpcg"`` beyond."""
    if eigen_solver == "dense" or k >= n - 1:
        return "dense"
    if eigen_solver in ("lobpcg", "amg") and n < _POINTS_PER_VECTOR * (k + _GUARD_VECTORS):
        return "dense"
    if eigen_solver == "auto":
        if n <= _DENSE_EIGEN_MAX:
            return "dense"
        return "lobpcg" if sparse and n > _SPARSE_LU_MAX else "arpack"
    return eigen_solver


def top_eigenpairs(A, k, eigen_solver, device, random_state, *, sqrt_degree=None,
                   eigen_tol="auto", progress=False, on_solve=None):
    """The ``k`` largest eigenvalues of the symmetric ``A`` (descending) and their eigenvectors.

    ``A`` is consumed: the dense shift-invert path factorises ``sigma I - A`` in its memory.
    ``sqrt_degree``: ``sqrt(D)``, the top eigenvector (eigenvalue 1), which LOBPCG and AMG
    need. ``eigen_tol``: ``"auto"`` (machine precision for ARPACK, ``_LOBPCG_TOL`` for LOBPCG)
    or ARPACK's relative accuracy of the eigenvalues / LOBPCG's largest residual norm.
    ``progress``: verbosity. ``on_solve()``, when given, is called after each application of
    the iterated operator (ARPACK's shift-inverted solve, a LOBPCG block product); its result is
    ignored: the solvers cannot be stopped and still return eigenpairs.
    """
    solver = resolve_eigen_solver(eigen_solver, A.shape[0], k, sp.issparse(A))
    with threadpool_limits(limits=1, user_api="blas"):
        if solver == "dense":
            w, v = _dense_eigh(A, k, device)
        elif solver == "arpack":
            tol = 0.0 if eigen_tol == "auto" else float(eigen_tol)
            w, v = _shift_invert(A, k, tol, random_state, progress, on_solve)
        else:
            tol = _LOBPCG_TOL if eigen_tol == "auto" else float(eigen_tol)
            w, v = _lobpcg_pairs(A, sqrt_degree, k, tol, solver, random_state, progress,
                                 on_solve)
    order = np.argsort(w)[::-1]
    return np.ascontiguousarray(w[order]), np.ascontiguousarray(v[:, order])


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
        # sigma I - A is symmetric positive definite: a symmetric fill-reducing ordering and
        # no pivoting (an LDL^T in effect) factorise it about 3x faster than scipy's default.
        factor = splu(
            (A - _SHIFT * sp.identity(n, format="csr")).tocsc(),
            permc_spec="MMD_AT_PLUS_A",
            diag_pivot_thresh=0.0,
            options=dict(SymmetricMode=True),
        )
        solve = factor.solve
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


def _lobpcg_pairs(A, sqrt_degree, k, tol, solver, random_state, progress, on_solve):
    """LOBPCG (``solver="lobpcg"`` or ``"amg"``) for the ``k - 1`` leading eigenpairs
    orthogonal to the known top one, which is prepended."""
    top = sqrt_degree / np.linalg.norm(sqrt_degree)
    wanted = k - 1
    block = wanted + _GUARD_VECTORS
    count = (progress, on_solve)
    if solver == "amg":
        w, v = _amg_lobpcg(A, top, block, wanted, tol, random_state, count)
    elif sp.issparse(A):
        w, v = _multilevel_lobpcg(A, top, block, wanted, tol, random_state, count)
    else:
        X = random_state.standard_normal((A.shape[0], block))
        w, v = _refine(A, X, top, wanted, tol, _MAX_ITER, count)
    return np.r_[1.0, w[:wanted]], np.c_[top, v[:, :wanted]]


def _refine(A, X, top, wanted, tol, max_iter, count, M=None, shift=None):
    """LOBPCG from the block ``X`` in the orthogonal complement of ``top`` until the ``wanted``
    leading residual norms are at most ``tol`` or ``max_iter`` iterations have run; restarted
    every ``_CHECK_EVERY`` iterations to check and to report progress (``count``: the
    verbosity, and ``on_solve`` called once per iteration); a bar of ``max_iter`` iterations
    shows the time left at most. ``shift``: the block solves for the smallest eigenvalues of
    ``shift I - A`` (preconditioned by ``M``). Returns the Ritz values of ``A`` (descending) and
    vectors."""
    progress, on_solve = count
    operator = A if shift is None else shift * sp.identity(A.shape[0], format="csr") - A
    Y = top[:, None]
    done = 0
    with progress_bar(progress, total=max_iter, desc=f"LOBPCG on {A.shape[0]:,} points",
                      unit="it", inner=True) as bar:
        while True:
            n_iter = min(_CHECK_EVERY, max_iter - done)
            with warnings.catch_warnings():
                # its own warning on stopping early: the residuals are checked here
                warnings.simplefilter("ignore", UserWarning)
                w, X = lobpcg(operator, X, M=M, Y=Y, tol=tol, maxiter=n_iter,
                              largest=shift is None)
            done += n_iter
            bar.update(n_iter)
            for _ in range(n_iter if on_solve is not None else 0):
                on_solve()
            mu = w if shift is None else shift - w
            order = np.argsort(mu)[::-1]
            mu, X = mu[order], X[:, order]
            residual = np.linalg.norm(A @ X[:, :wanted] - X[:, :wanted] * mu[:wanted], axis=0)
            if residual.max() <= tol or done >= max_iter:
                break
    if max_iter == _MAX_ITER and residual.max() > tol:
        warnings.warn(
            f"LOBPCG stopped after {done} iterations with a residual norm of "
            f"{residual.max():.3g} above eigen_tol={tol:.3g}; raise eigen_tol or use "
            "eigen_solver='arpack'.",
            ConvergenceWarning,
            stacklevel=4,
        )
    return mu, X


def _multilevel_lobpcg(A, top, block, wanted, tol, random_state, count):
    """LOBPCG on the k-NN operator ``A``, started from the multilevel cascade."""
    levels = []  # (operator, its top eigenvector, prolongation to the finer level)
    operator, vector = A.tocsr(), top
    while operator.shape[0] > _COARSEST:
        aggregate_of, n_aggregates = _aggregate(operator, random_state)
        if n_aggregates > operator.shape[0] // 2:  # too little coarsening to pay
            break
        P = _prolongation(vector, aggregate_of, n_aggregates)
        levels.append((operator, vector, P))
        operator, vector = (P.T @ operator @ P).tocsr(), P.T @ vector
    if operator.shape[0] <= max(_COARSEST, _POINTS_PER_VECTOR * block):
        # the coarsest level solved exactly, without its top eigenvector (eigenvalue 1)
        _, V = np.linalg.eigh(operator.toarray())
        V = V[:, ::-1][:, : block + 1]
        X = np.delete(V, np.argmax(np.abs(vector @ V)), axis=1)
    else:
        X = random_state.standard_normal((operator.shape[0], block))
        if levels:
            _, X = _refine(operator, X, vector / np.linalg.norm(vector), wanted, tol,
                           _COARSE_MAX_ITER, count)
    for depth, (finer, finer_vector, P) in enumerate(reversed(levels)):
        finest = depth == len(levels) - 1
        w, X = _refine(finer, P @ X, finer_vector / np.linalg.norm(finer_vector), wanted, tol,
                       _MAX_ITER if finest else _COARSE_MAX_ITER, count)
    if not levels:
        w, X = _refine(A, X, top, wanted, tol, _MAX_ITER, count)
    return w, X


def _aggregate(A, random_state):
    """Nodes of the graph of ``A`` grouped into aggregates of neighbours: ``(aggregate of each
    node, number of aggregates)``. In each round the free nodes whose random priority beats
    that of each free neighbour become roots (no two adjacent), and every free neighbour of a
    root joins the root it is most strongly connected to."""
    n = A.shape[0]
    rows = np.repeat(np.arange(n), np.diff(A.indptr))
    cols, weights = A.indices, A.data
    priority = random_state.permutation(n).astype(np.float64)
    aggregate_of = np.full(n, -1)
    n_aggregates = 0
    for _ in range(_AGGREGATION_ROUNDS):
        free = aggregate_of < 0
        if not free.any():
            break
        p = np.where(free, priority, -1.0)
        root = free & (p >= _row_max(A, p[cols]))
        aggregate_of[root] = n_aggregates + np.arange(np.count_nonzero(root))
        n_aggregates += int(np.count_nonzero(root))
        link = np.where(root[cols] & free[rows] & ~root[rows], weights, -1.0)
        strongest = _row_max(A, link)
        joins = (link > 0) & (link >= strongest[rows])
        aggregate_of[rows[joins]] = aggregate_of[cols[joins]]
    alone = aggregate_of < 0
    aggregate_of[alone] = n_aggregates + np.arange(np.count_nonzero(alone))
    return aggregate_of, n_aggregates + int(np.count_nonzero(alone))


def _row_max(A, values):
    """The largest of ``values`` (one per stored entry of the CSR ``A``) in each row; -inf in
    empty rows."""
    out = np.full(A.shape[0], -np.inf)
    nonempty = np.diff(A.indptr) > 0
    out[nonempty] = np.maximum.reduceat(values, A.indptr[:-1][nonempty])
    return out


def _prolongation(vector, aggregate_of, n_aggregates):
    """The prolongation ``P`` (n x n_aggregates, orthonormal columns) that is constant on each
    aggregate up to ``vector``'s weights: ``vector`` (the top eigenvector) lies in its range, so
    the Galerkin operator ``P^T A P`` keeps the eigenvalue 1 with eigenvector ``P^T vector``."""
    mass = np.bincount(aggregate_of, weights=vector**2, minlength=n_aggregates)
    values = vector / np.sqrt(mass[aggregate_of])
    n = len(vector)
    return sp.csr_matrix((values, (np.arange(n), aggregate_of)), shape=(n, n_aggregates))


def _amg_lobpcg(A, top, block, wanted, tol, random_state, count):
    """LOBPCG for the smallest eigenvalues of ``I - A`` preconditioned by pyamg's smoothed
    aggregation, as scikit-learn's SpectralEmbedding does with ``eigen_solver="amg"``."""
    try:
        from pyamg import smoothed_aggregation_solver
    except ImportError as exc:
        raise ImportError(
            "eigen_solver='amg' needs pyamg (pip install pyamg); eigen_solver='lobpcg' needs "
            "no extra package."
        ) from exc
    if not sp.issparse(A):
        A = sp.csr_matrix(A)
    n = A.shape[0]
    # a small shift makes the Laplacian positive definite, as scikit-learn does
    shift = 1.0 + 1e-5
    laplacian = (shift * sp.identity(n, format="csr") - A).tocsr()
    M = smoothed_aggregation_solver(laplacian).aspreconditioner()
    X = random_state.standard_normal((n, block))
    return _refine(A, X, top, wanted, tol, _MAX_ITER, count, M=M, shift=shift)

