"""Scores s(q, k) = -f(q, k) for the supported pseudo-metrics, computed blockwise.

Squared-Euclidean scores use THEORY.md section 3: -||q - k||^2 = 2 q.k - ||k||^2 - ||q||^2, and the
per-query term ||q||^2 is constant along a softmax row, so blocks hold the *partial* score
2 q.k - ||k||^2 computed by one ``addmm``. Keys are centred first (squared distances are
translation invariant) to limit cancellation.
"""

import torch

# The one table of metric names. Scores the engine computes (``attention(metric=...)``):
ENGINE_METRICS = ("sqeuclidean", "dot")
# Pseudo-metrics learned end to end (``_maps.py``; the estimators and ``skattention.nn``) ->
# the engine score between the mapped inputs:
LEARNED_METRICS = {"mlp": "sqeuclidean", "linear": "sqeuclidean", "dot": "dot"}
# The metric estimators' ``metric``: the fixed Euclidean one and the learned ones.
METRICS = {"euclidean": "sqeuclidean", **LEARNED_METRICS}


class Scorer:
    """Prepared keys for blockwise scoring.

    Parameters
    ----------
    keys : Tensor of shape (n_keys, d)
        Keys on the compute device and dtype.
    metric : {"sqeuclidean", "dot"} or callable
        A callable ``phi`` maps a ``(n, d)`` tensor to ``(n, d')``; scores are then
        ``-||phi(q) - phi(k)||^2``.
    """

    def __init__(self, keys, metric):
        self.phi = metric if callable(metric) else None
        self.kind = "sqeuclidean" if callable(metric) else metric
        if self.phi is not None:
            keys = _apply_phi(self.phi, keys, "keys")
        if self.kind == "sqeuclidean":
            self.shift = keys.mean(0)
            keys = keys - self.shift
            # -||k||^2, the per-key offset of the partial score.
            self.key_offset = -(keys * keys).sum(1)
            self.coef = 2.0
        else:
            self.shift = None
            self.key_offset = None
            self.coef = 1.0
        self.keys = keys
        self.n_keys, self.dim = keys.shape
        if not bool(torch.isfinite(keys).all()) or (
            self.key_offset is not None and not bool(torch.isfinite(self.key_offset).all())
        ):
            raise ValueError(
                "Key coordinates overflow the compute dtype once squared; rescale the data "
                "or use dtype=torch.float64."
            )

    @property
    def is_distance(self):
        return self.kind == "sqeuclidean"

    def prepare_queries(self, queries):
        """Map a block of raw queries into the space the keys live in."""
        if self.phi is not None:
            queries = _apply_phi(self.phi, queries, "queries")
            if queries.shape[1] != self.dim:
                raise ValueError(
                    f"metric callable maps queries to {queries.shape[1]} features but keys to "
                    f"{self.dim}."
                )
        if self.shift is not None:
            queries = queries - self.shift
        return queries

    def query_offset(self, q):
        """Per-query constant c such that the exact score is ``partial - c``."""
        if self.kind == "sqeuclidean":
            return (q * q).sum(1)
        return torch.zeros(q.shape[0], dtype=q.dtype, device=q.device)

    def block(self, q, start, stop, scale=1.0, log_prior=None):
        """``scale * partial_score(q, keys[start:stop]) + log_prior[start:stop]``.

        One ``addmm`` for a float ``scale``; a tensor ``scale`` (a learned temperature) keeps
        its autograd graph.
        """
        kt = self.keys[start:stop].T
        offset = None if self.key_offset is None else self.key_offset[start:stop]
        prior = None if log_prior is None else log_prior[start:stop]
        if isinstance(scale, torch.Tensor):
            # Scale the (small) query block and key offsets, not the score block: one pass over
            # the block, and a cheap gradient for the temperature.
            bias = q.new_zeros(stop - start) if offset is None else offset * scale
            if prior is not None:
                bias = bias + prior
            return torch.addmm(bias, q * (self.coef * scale), kt)
        bias = None if offset is None else offset * scale
        if prior is not None:
            bias = prior if bias is None else bias + prior
        if bias is None:
            s = torch.mm(q, kt)
            return s if self.coef * scale == 1.0 else s.mul_(self.coef * scale)
        return torch.addmm(bias, q, kt, alpha=self.coef * scale)

    def exact(self, q, index):
        """Exact scores of queries ``q`` (b, d) against ``keys[index]`` (b, k); differentiable."""
        gathered = self.keys[index.clamp(min=0)]
        if self.kind == "sqeuclidean":
            diff = q[:, None, :] - gathered
            return -(diff * diff).sum(-1)
        return torch.einsum("bd,bkd->bk", q, gathered)


def _apply_phi(phi, x, name):
    try:
        out = phi(x)
    except Exception as exc:  # a user callable failed: say which side and why
        raise ValueError(f"metric callable failed on the {name}: {exc}") from exc
    if not isinstance(out, torch.Tensor) or out.ndim != 2 or out.shape[0] != x.shape[0]:
        raise ValueError(
            f"metric callable must map a (n, d) tensor to a (n, d') tensor; got "
            f"{type(out).__name__} of shape {getattr(out, 'shape', None)} for the {name}."
        )
    return out
