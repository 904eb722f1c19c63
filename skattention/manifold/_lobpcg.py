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

# SVQB: directions whose Gram eigenvalue is below this fraction of the largest are dropped.
_DEPENDENT = 1e-12


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
    P = None
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
        Z = _orthonormalize(_orthogonalize(W, Y, X))
        if P is not None:
            Z = np.hstack([Z, _orthonormalize(_orthogonalize(P, Y, X, Z))])
        # L Z by a fresh product: tracked through the projections, which cancel most of P
        # once it converges, its rounding would no longer be that of L Z
        S, LS = np.hstack([X, Z]), np.hstack([LX, apply(Z)])
        m = X.shape[1]
        lam, C = _ritz(S, LS, m)
        X, LX = S @ C, LS @ C
        P = Z @ C[m:]
        iteration += 1
        on_iteration()


def _residual_norms(X, LX, lam, wanted):
    return np.linalg.norm(LX[:, :wanted] - X[:, :wanted] * lam[:wanted], axis=0)


def _orthogonalize(V, *bases):
    """``V`` without its components along the orthonormal columns of each of ``bases``
    (mutually orthogonal), in two passes: one leaves rounding residues where ``V`` lies
    nearly in their span."""
    for _ in range(2):
        for Q in bases:
            V = V - Q @ (Q.T @ V)
    return V


def _orthonormalize(V):
    """An orthonormal basis ``V T`` of the columns of ``V`` (SVQB, with a second pass for
    accuracy), near-dependent directions dropped."""
    for _ in range(2):
        scale = np.sqrt(np.einsum("ij,ij->j", V, V))
        scale[scale == 0] = 1.0
        gram = (V.T @ V) / scale[:, None] / scale[None, :]
        w, U = np.linalg.eigh((gram + gram.T) / 2)
        keep = w > _DEPENDENT * max(w[-1], 0.0)
        step = (U[:, keep] / np.sqrt(w[keep])[None, :]) / scale[:, None]
        V = V @ step
    return V


def _ritz(S, LS, m):
    """The ``m`` smallest Ritz values and coefficient vectors of the orthonormal basis ``S``."""
    G = S.T @ LS
    w, C = np.linalg.eigh((G + G.T) / 2)
    return w[:m], C[:, :m]


def _rayleigh_ritz(X, LX, m):
    lam, C = _ritz(X, LX, m)
    return lam, X @ C, LX @ C
