"""LOBPCG for the smallest eigenpairs of a symmetric positive semi-definite operator.

Knyazev's locally optimal block preconditioned conjugate gradient, in the form of
Hetmaniuk and Lehoucq (the search directions ``W`` (preconditioned residuals) and ``P``
(the previous step) kept orthonormal and orthogonal to the iterates ``X``, so the
Rayleigh–Ritz step is a standard symmetric eigenproblem of ``3 m`` unknowns), with
orthonormalisation by SVQB (the eigen-decomposition of the Gram matrix, near-dependent
directions dropped). It replaces scipy's ``lobpcg`` here: that one stops only when every vector
of the block has converged (guard vectors included), and returns its best iterate by the
block's mean residual, so that restarting it to check the wanted vectors alone can leave
it returning its starting block again and again.
"""

import numpy as np

# SVQB: directions whose Gram eigenvalue is below this fraction of the largest are dropped,
# and a second pass runs when the smallest kept is below this fraction.
_DEPENDENT = 1e-12
_WELL_CONDITIONED = 1e-4
# Coefficients of a search direction below this norm (the iterates' basis being orthonormal)
# are rounding residues: the direction is dropped.
_NEGLIGIBLE_STEP = 1e-13
# A projection is repeated when it leaves less than this fraction of a column's norm.
_REPROJECT = 0.5


def lobpcg_smallest(apply, X, Y, precondition, wanted, tolerance, max_iter, on_iteration):
    """The ``m = X.shape[1]`` smallest eigenpairs of the operator ``apply`` (a block ``V`` to
    ``L V``) orthogonal to the orthonormal columns of ``Y``, from the start block ``X``.

    ``precondition``: a block of residuals to search directions (``None``: the residuals).
    Iterates until the ``wanted`` leading residual norms ``||L x - lambda x||`` (unit ``x``)
    are at most ``tolerance(lambdas)`` (an array per wanted vector) or ``max_iter``
    iterations have run; ``on_iteration()`` is called after each. Returns the eigenvalues
    (ascending), the vectors, the wanted residual norms (from a final product with ``L``)
    and the number of iterations.
    """
    X = _orthonormalize(_orthogonalize(X, Y))
    if X.shape[1] < wanted:
        raise ValueError("the start block of LOBPCG is rank deficient")
    LX = apply(X)
    lam, X, LX = _rayleigh_ritz(X, LX, X.shape[1])
    P = LP = None
    iteration = 0
    while True:
        residual = _residual_norms(X, LX, lam, wanted)
        if np.all(residual <= tolerance(lam[:wanted])) or iteration >= max_iter:
            # the products were tracked through linear combinations: confirm with a fresh one
            LX = apply(X)
            residual = _residual_norms(X, LX, lam, wanted)
            if np.all(residual <= tolerance(lam[:wanted])) or iteration >= max_iter:
                return lam, X, residual, iteration
        R = LX - X * lam
        W = R if precondition is None else precondition(R)
        kept = [X] if P is None else [X, P]
        Z = _orthonormalize(_orthogonalize(W, Y, *kept))
        S = np.hstack([*kept, Z])
        LS = np.hstack([LX, apply(Z)] if P is None else [LX, LP, apply(Z)])
        m = X.shape[1]
        lam, C = _ritz(S, LS, m)
        step = _step_coefficients(C, m)
        X, LX = S @ C, LS @ C
        P, LP = S @ step, LS @ step
        iteration += 1
        on_iteration()


def _step_coefficients(C, m):
    """The coefficients (in the orthonormal basis ``[X, P, W]``) of an orthonormal basis of
    the new search direction ``P``: the part of the update outside the old iterates ``X``
    (``C`` without its first ``m`` rows), made orthogonal to the new iterates ``C`` here,
    among a few dozen coefficients, instead of by projections of n-long vectors. The
    direction is then exactly orthonormal, so ``L P`` can follow it by the same combination
    of ``L [X, P, W]`` without the cancellation of a projection."""
    step = C.copy()
    step[:m] = 0.0
    for _ in range(2):
        step -= C @ (C.T @ step)
    step = step[:, _column_norms(step) > _NEGLIGIBLE_STEP]
    return _orthonormalize(step)


def _residual_norms(X, LX, lam, wanted):
    return np.linalg.norm(LX[:, :wanted] - X[:, :wanted] * lam[:wanted], axis=0)


def _orthogonalize(V, *bases):
    """``V`` without its components along the orthonormal columns of each of ``bases``
    (mutually orthogonal). A second pass where the first removed most of a column: its
    rounding residues are then no longer small against what is left (Kahan's "twice is
    enough")."""
    before = _column_norms(V)
    for Q in bases:
        V = V - Q @ (Q.T @ V)
    if np.any(_column_norms(V) < _REPROJECT * before):
        for Q in bases:
            V -= Q @ (Q.T @ V)
    return V


def _orthonormalize(V):
    """An orthonormal basis ``V T`` of the columns of ``V`` (SVQB: the eigen-decomposition of
    their Gram matrix, scaled to unit diagonal), near-dependent directions dropped; a second
    pass where the Gram matrix was ill-conditioned enough for the first to leave rounding
    errors in the orthogonality (they grow with its condition)."""
    if V.shape[1] == 0:  # (no direction to keep)
        return V
    for _ in range(2):
        scale = _column_norms(V)
        scale[scale == 0] = 1.0
        gram = (V.T @ V) / scale[:, None] / scale[None, :]
        w, U = np.linalg.eigh((gram + gram.T) / 2)
        keep = w > _DEPENDENT * max(w[-1], 0.0)
        V = V @ ((U[:, keep] / np.sqrt(w[keep])[None, :]) / scale[:, None])
        if w[keep].min(initial=w[-1]) > _WELL_CONDITIONED * w[-1]:
            break
    return V


def _column_norms(V):
    return np.sqrt(np.einsum("ij,ij->j", V, V))


def _ritz(S, LS, m):
    """The ``m`` smallest Ritz values and coefficient vectors of the orthonormal basis ``S``."""
    G = S.T @ LS
    w, C = np.linalg.eigh((G + G.T) / 2)
    return w[:m], C[:, :m]


def _rayleigh_ritz(X, LX, m):
    lam, C = _ritz(X, LX, m)
    return lam, X @ C, LX @ C
