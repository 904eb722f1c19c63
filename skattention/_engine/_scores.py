"""Scores s(q, k) = -f(q, k) for the supported pseudo-metrics, computed blockwise.

Squared-Euclidean scores use the identity of docs/theory.md ("Computing it exactly"):
-||q - k||^2 = 2 q.k - ||k||^2 - ||q||^2, and the per-query term ||q||^2 is constant along a
softmax row, so blocks hold the *partial* score 2 q.k - ||k||^2 computed by one ``addmm``. Keys
are centred first (squared distances are translation invariant) to limit cancellation.

Euclidean scores (``"euclidean"``, -||q - k||, ModernNCA's non-squared distance) need the whole
distance: their blocks add the per-query term back and take a square root
(:meth:`PreparedKeys.to_scores`); what selects keys (k-NN, radius, ``T = 0``) works on the
squared distances as for ``"sqeuclidean"``, which order keys the same way.

These fast scores are rounded (the centring, the matmul); selections are never decided on them
alone. :meth:`PreparedKeys.margin` bounds their rounding error and :meth:`PreparedKeys.exact_f` /
:meth:`PreparedKeys.exact_pairs` give the exact values (float64 differences of the uncentred
coordinates) that ``_exact.py`` settles the close calls with.
"""

import functools
import math

import torch

from ._budget import (
    CPU_BLOCK_ENTRIES,
    KEY_CHUNK_ROWS,
    ROW_MULTIPLE,
    all_finite,
    plan_rows,
    span_columns,
    span_stop,
)
from ._device import dtype_name
from ._distance_logits import EuclideanLogits, distance_logits, sqrt_zero_grad
from ._kinds import (
    DISTANCE_KINDS,
    PAIRWISE_KINDS,
    exact_f_of_pairs,
    metric_kind,
    power_sums,
    unit_rows,
)
from ._scratch import scratch

# The score of a masked (query, key) pair: it gets no weight.
NEG_INF = float("-inf")


def padded_rows(x, multiple=ROW_MULTIPLE):
    """``x`` with zero rows appended up to a multiple of ``multiple`` rows (slice the product
    back)."""
    pad = -x.shape[0] % multiple
    return x if pad == 0 else torch.nn.functional.pad(x, (0, 0, 0, pad))


class ComputeOverflowError(ValueError):
    """Values overflowing the compute dtype. ``cause`` says what overflowed and
    ``by_temperature`` whether a higher temperature helps: an estimator without the engine's
    options (``dtype``, ``temperature``) re-raises ``cause`` with advice in its own terms."""


def overflow_error(cause, dtype, by_temperature=False):
    """A :class:`ComputeOverflowError` for ``cause``, advising the engine's options (float64
    only where ``dtype`` is narrower)."""
    advice = ["rescale the data"] + ["raise the temperature"] * by_temperature
    if dtype != torch.float64:
        advice.append("use dtype=torch.float64 (an estimator's dtype='float64')")
    exc = ComputeOverflowError(overflow_message(cause, advice))
    exc.cause, exc.by_temperature = cause, by_temperature  # kept in pickles (__dict__)
    return exc


def overflow_message(cause, advice):
    """``cause``, then the ``advice`` (a list of what to do): "a, b or c"."""
    return (f"{cause}; {', '.join(advice[:-1])}{' or ' if len(advice) > 1 else ''}"
            f"{advice[-1]}.")


class PreparedKeys:
    """Prepared keys for blockwise scoring.

    Parameters
    ----------
    keys : Tensor of shape (n_keys, d)
        Keys on the compute device and dtype.
    metric : {"sqeuclidean", "euclidean", "dot", "manhattan", "cosine"}, ("minkowski", p) \
            or callable
        A callable ``phi`` maps a ``(n, d)`` tensor to ``(n, d')``; scores are then
        ``-||phi(q) - phi(k)||^2``. ``"cosine"``: ``f = 1 - cos(q, k)``, blocks of the unit
        rows' products (partial score ``q.k / (|q| |k|)``, offset 1); ``"manhattan"`` and
        Minkowski: ``f = sum |q_j - k_j|^p`` (p = 1 for ``"manhattan"``), blocks by
        ``torch.cdist`` (partial score ``-f``).
    """

    def __init__(self, keys, metric, check_finite=True):
        self.metric, self.n_features = metric, keys.shape[1]
        self.phi = metric if callable(metric) else None
        self.kind, self.p = metric_kind(metric)
        if self.phi is not None:
            keys = _apply_phi(self.phi, keys, "keys")
        # The keys as given (mapped by phi): exact distances are differences of these.
        self.raw = keys
        if self.is_distance:
            self.shift, self.coef = keys.mean(0), 2.0
            # -||k||^2, the per-key offset; outside autograd by chunks, centred in keys_t below
            if keys.requires_grad:
                keys = keys - self.shift
                self.key_offset = -(keys * keys).sum(1)
            else:
                self.key_offset = torch.cat([-(c * c).sum(1) for c in (
                    part - self.shift for part in keys.split(KEY_CHUNK_ROWS))])
        else:
            self.shift = self.key_offset = None
            self.coef = 1.0
            if self.kind == "cosine":
                keys = unit_rows(keys)
        if keys.requires_grad:  # training: products take the transposed view
            self.keys, self.keys_t, self.wide_t = keys, keys.T, None
        else:
            # Products take the keys transposed and contiguous (``keys`` is a view of them):
            # with a few query rows MKL packs a transposed operand on every call, and the
            # contiguous form gave a row the same rounding among 4 rows as among 1,024 in every
            # shape tried, where the transposed view did not from 96 dimensions in float32
            # (docs/performance.md, "Batch independence"). For the distance kinds the offsets
            # are one more row of the same matrix: an addmm's bias is a copy into every score
            # block before the product (docs/performance.md, "Engine design notes").
            # Zero columns after the keys: a block of any width is computed over a span of whole
            # multiples (``span_stop``), sliced.
            rows, n = keys.shape[1] + (self.key_offset is not None), keys.shape[0]
            self.wide_t = keys.new_empty((rows, span_columns(n)))
            self.wide_t[:, n:] = 0
            self.keys_t = self.wide_t[:, :n]
            self.keys_t[: keys.shape[1]] = keys.T
            if self.is_distance:  # centred here, in place: no centred copy of every key
                self.keys_t[: keys.shape[1]].sub_(self.shift[:, None])
            if self.key_offset is not None:
                self.keys_t[-1] = self.key_offset
                self.keys_t = self.keys_t[:-1]
            self.keys = keys.contiguous() if self.pairwise else self.keys_t.T
        self.n_keys, self.dim = keys.shape
        # (``check_finite=False``: a training step, whose keys are the map's images of checked
        # inputs and whose loss is checked instead: the two passes and their reductions are a
        # noticeable part of a step)
        if check_finite and (not all_finite(self.keys) or (
            self.key_offset is not None and not all_finite(self.key_offset)
        ) or (self.pairwise and not math.isfinite(self._as_dtype(self.max_key_sq)))):
            raise overflow_error(
                f"Key coordinates overflow the compute dtype ({dtype_name(self.raw.dtype)}) "
                f"once {'raised to the power p' if self.pairwise else 'squared'}", self.raw.dtype
            )
        self._remembered = {}

    @functools.cached_property
    def max_key_sq(self):
        """The largest ``||k||^2`` of the (centred) keys (``sum |k_j|^p`` for the pairwise
        kinds, in float64), for the rounding margin of the fast scores (:meth:`margin`);
        computed when first needed (a host synchronisation)."""
        if not self.n_keys:
            return 0.0
        if self.pairwise:
            return float(power_sums(self.raw.detach().double(), self.p).max())
        key_sq = -self.key_offset if self.key_offset is not None else (self.keys * self.keys).sum(1)
        return float(key_sq.detach().max())

    def _as_dtype(self, value):
        """A Python float as the keys' dtype holds it (``inf`` beyond its range)."""
        return float(torch.tensor(value, dtype=torch.float64).to(self.raw.dtype))

    def remembered(self, name, source, build, *key):
        """``build()``, remembered on these keys under ``name`` while ``source`` (a per-key
        tensor a caller passes with them on every call: values, a log-prior) is the same
        tensor, unmodified (torch's version counter), and ``key`` (what else the result
        depends on) is equal. Prepared keys live as long as a fitted model's predictions: a
        model predicting one row at a time then skips the checks, conversions and copies of its
        fitted tensors on every call. Not for NumPy arrays (no version to tell a change) nor
        tensors that require grad (a graph is not reused) nor inference-mode tensors."""
        if (not isinstance(source, torch.Tensor) or source.requires_grad
                or source.is_inference()):  # inference tensors have no version counter
            return build()
        entry = self._remembered.get(name)
        if (entry is not None and entry[0] is source and entry[1] == source._version
                and entry[2] == key):
            return entry[3]
        out = build()
        self._remembered[name] = (source, source._version, key, out)
        return out

    @property
    def offsets_row(self):
        """Whether the transposed keys carry the offsets as one more row, ``[k; -||k||^2]``:
        partial scores are then one product with ``[coef q, 1]`` (no bias copy into the score
        block); not under autograd nor for ``"dot"``."""
        return self.wide_t is not None and self.key_offset is not None

    @property
    def is_distance(self):
        return self.kind in DISTANCE_KINDS

    @property
    def pairwise(self):
        """Whether blocks come from the coordinates' differences (``torch.cdist``), not from a
        matrix product: no augmented keys, no SDPA."""
        return self.kind in PAIRWISE_KINDS

    @property
    def squared(self):
        """Whether scores are the partial scores themselves (no square root)."""
        return self.kind != "euclidean"

    def prepare_queries(self, queries):
        """Map a block of raw queries into the space the (centred) keys live in."""
        return self.centre(self.map_queries(queries))

    def map_queries(self, queries):
        """A block of raw queries mapped by ``phi`` (uncentred: what :meth:`exact_f` takes)."""
        if self.phi is not None:
            queries = _apply_phi(self.phi, queries, "queries")
            if queries.shape[1] != self.dim:
                raise ValueError(
                    f"metric callable maps queries to {queries.shape[1]} features but keys to "
                    f"{self.dim}."
                )
        return queries

    def centre(self, queries):
        """Mapped queries in the centred coordinates of the keys (unit rows for cosine)."""
        if self.kind == "cosine":
            return unit_rows(queries)
        return queries if self.shift is None else queries - self.shift

    def margin(self, q):
        """Per centred query row, a bound on the rounding error of its fast values of ``f``
        (``query_offset - partial score``, from the centring and one matmul) against any key.

        The error of ``||q||^2 - 2 q.k + ||k||^2`` in floating point is at most about
        ``(d + 4) eps (||q||^2 + ||k||^2)`` (each term's dot product, the centring, the sums);
        twice that is used. Each operation near the subnormal range may also err by up to
        half the smallest subnormal, whatever its size: the bound adds as many smallest normal
        numbers (``tiny``), which only matters for values of about that size.
        """
        info = torch.finfo(q.dtype)
        eps = info.eps
        if self.pairwise:
            # |a - b|^p <= 2^(p-1) (|a|^p + |b|^p); the sum, cdist's root and the power
            sizes = power_sums(q.detach().double(), self.p) + self.max_key_sq
            factor = (2 * self.dim + 8 + 4 * self.p) * eps * 2 ** (self.p - 1)
            return (factor * sizes + factor / eps * info.tiny).to(q.dtype)
        q_sq = (q.detach() * q.detach()).sum(1)
        return (2 * self.dim + 8) * (eps * (q_sq + self.max_key_sq) + info.tiny)

    def exact_f(self, q_raw, index, budget):
        """Exact ``f`` (float64) of mapped queries ``q_raw`` (b, d) against ``raw[index]``
        (b, m); entries with index -1 are computed against key 0 (callers mask them).
        The gathered float64 keys are held in chunks that fit ``budget`` bytes."""
        index = index.clamp(min=0)
        b, m = index.shape
        chunk = max(1, _exact_entries(budget) // max(1, b * self.dim))
        parts = [
            self._exact_rows(q_raw[:, None, :], index[:, start : start + chunk])
            for start in range(0, m, chunk)
        ]
        return torch.cat(parts, 1) if parts else q_raw.new_zeros((b, 0), dtype=torch.float64)

    def exact_pairs(self, q_raw, rows, cols, budget):
        """Exact ``f`` (float64) of the pairs ``(q_raw[rows[n]], raw[cols[n]])``, shape (n,)."""
        out = []
        chunk = max(1, _exact_entries(budget) // max(1, self.dim))
        for start in range(0, rows.numel(), chunk):
            sl = slice(start, start + chunk)
            out.append(self._exact_rows(q_raw[rows[sl]], cols[sl]))
        return torch.cat(out) if out else q_raw.new_zeros(0, dtype=torch.float64)

    def _exact_rows(self, q_raw, index):
        keys = self.raw.detach()[index].double()
        q = q_raw.detach().double()
        if self.kind == "dot":
            return -(q * keys).sum(-1)
        return exact_f_of_pairs(self.kind, self.p, q, keys)

    def query_offset(self, q):
        """Per-query constant c such that the exact value of ``-f`` is ``partial - c`` (``f``
        the squared distance for both distance kinds, ``1 - cos`` for cosine)."""
        if self.is_distance:
            return (q * q).sum(1)
        if self.kind == "cosine":
            return torch.ones(q.shape[0], dtype=q.dtype, device=q.device)
        return torch.zeros(q.shape[0], dtype=q.dtype, device=q.device)

    def augmented(self, q):
        """The query block :meth:`block` multiplies with augmented keys, ``[coef q, 1]`` with
        padded rows (``None`` without them): a loop over key blocks prepares it once per query
        block and passes it as ``block(..., augmented=)``."""
        if not self.offsets_row:
            return None
        return padded_rows(torch.cat([q * self.coef, q.new_ones((q.shape[0], 1))], 1))

    def block(self, q, start, stop, scale=1.0, log_prior=None, augmented=None,
              scratch_key=None):
        """``scale * partial_score(q, keys[start:stop]) + log_prior[start:stop]``.

        One ``addmm`` for a float ``scale``; a tensor ``scale`` (a learned temperature) keeps
        its autograd graph. ``augmented``: ``self.augmented(q)``, if already computed. Outside
        autograd the product spans a multiple of ``KEY_SPAN_MULTIPLE`` keys (``span_stop``) and
        the block is its slice: a row's scores do not depend on the rows around it.
        ``scratch_key``: the offsets' row's partial scores (the selections') into the buffer
        ``_scratch.scratch`` keeps under it in ``reused_buffers`` (a fresh block's first touch
        costs page faults as its product does), valid until the next block.
        """
        rows, width = q.shape[0], stop - start
        if self.pairwise:
            return self._pairwise_block(q, start, stop, scale, log_prior)
        tensor_scale = isinstance(scale, torch.Tensor)
        if self.wide_t is not None:
            # the span's columns, the offsets' row included where the keys have one
            kt = self.wide_t[:, start:span_stop(start, stop, self.wide_t.shape[1])]
            offset = None if self.key_offset is None else kt[-1]
        else:
            kt = self.keys_t[:, start:stop]
            offset = None if self.key_offset is None else self.key_offset[start:stop]
        if self.offsets_row and log_prior is None and not tensor_scale and scale == 1.0:
            # partial scores [coef q, 1] . [k, -||k||^2] (coef = 2: exact scaling); the fast
            # scores' margin (``margin``) covers the one more term of the sum
            q_aug = self.augmented(q) if augmented is None else augmented
            if scratch_key is None:
                return torch.mm(q_aug, kt)[:rows, :width]
            out = scratch(scratch_key, (q_aug.shape[0], kt.shape[1]), q_aug)
            return torch.mm(q_aug, kt, out=out)[:rows, :width]
        q = padded_rows(q)
        kt = kt[:-1] if self.offsets_row else kt
        prior = None if log_prior is None else _padded(log_prior[start:stop], kt.shape[1])
        if tensor_scale:
            # Scale the (small) query block and key offsets, not the score block: one pass over
            # the block, and a cheap gradient for the temperature.
            bias = q.new_zeros(kt.shape[1]) if offset is None else offset * scale
            if prior is not None:
                bias = bias + prior
            return torch.addmm(bias, q * (self.coef * scale), kt)[:rows, :width]
        if start == 0 and stop == self.n_keys and not torch.is_grad_enabled():
            # every key in one block (a small call): the same bias on every call
            bias = self.remembered("bias", log_prior if log_prior is not None else self.keys,
                                   lambda: _block_bias(offset, scale, prior), scale)
        else:
            bias = _block_bias(offset, scale, prior)
        if bias is None:
            s = torch.mm(q, kt)[:rows, :width]
            return s if self.coef * scale == 1.0 else s.mul_(self.coef * scale)
        # The factor on the (small) query block, not as addmm's alpha: MKL applies alpha in a
        # way that depends on the number of rows (measured: a row among 4 to 100 rows rounded
        # otherwise than among 1,000), and a row's result must not depend on its batch.
        alpha = self.coef * scale
        return torch.addmm(bias, q if alpha == 1.0 else q * alpha, kt)[:rows, :width]

    def _pairwise_block(self, q, start, stop, scale, log_prior):
        """``scale * -f + log_prior`` of a key block for the pairwise kinds: ``torch.cdist``
        (a loop over the pairs: a row's values do not depend on the rows around it)."""
        keys = self.keys[start:stop]
        if q.dtype in (torch.float16, torch.bfloat16) and q.device.type == "cpu":
            # torch's CPU cdist has no half-precision kernel: float32, rounded back
            f = torch.cdist(q.float(), keys.float(), p=self.p).to(q.dtype)
        else:
            f = torch.cdist(q, keys, p=self.p)
        if self.p != 1.0:
            f = f.pow_(self.p) if not f.requires_grad else f.pow(self.p)
        if isinstance(scale, torch.Tensor) or f.requires_grad:
            s = f * (-scale)
        else:
            s = f.mul_(-scale)
        if log_prior is not None:
            s = s + log_prior[start:stop] if s.requires_grad else s.add_(log_prior[start:stop])
        return s

    def logits(self, q, start, stop, scale, log_prior=None):
        """``scale * score(q, keys[start:stop]) + log_prior[start:stop]``: the softmax logits
        of a block without masks (:meth:`block` for the squared kinds)."""
        if self.squared:
            return self.block(q, start, stop, scale, log_prior)
        prior = None if log_prior is None else log_prior[start:stop]
        partial = self.block(q, start, stop)
        if torch.is_grad_enabled() and (partial.requires_grad or _requires_grad(scale)):
            return EuclideanLogits.apply(partial, self.query_offset(q), scale, prior)
        # No graph: the same values in place, one pass per operation.
        offset = self.query_offset(q)
        return distance_logits(partial, offset, scale, prior, d_out=partial, z_out=partial)[1]

    def to_scores(self, partial, q):
        """Scores whose softmax is the attention, from a block of partial scores of the centred
        queries ``q`` (masked entries ``-inf`` stay ``-inf``): the partial scores themselves,
        except for ``"euclidean"``: ``-sqrt(max(||q||^2 - partial, 0))``."""
        if self.squared:
            return partial
        return -sqrt_zero_grad(self.query_offset(q)[:, None] - partial)

    def scores_of_f(self, f):
        """Scores from exact values of ``f`` (the squared distance for both distance kinds)."""
        return -f if self.squared else -torch.sqrt(f.clamp(min=0))

    def exact(self, q, index):
        """Exact scores of queries ``q`` (b, d) against ``keys[index]`` (b, k); differentiable."""
        gathered = self.keys[index.clamp(min=0)]
        if self.is_distance:
            diff = q[:, None, :] - gathered
            f = (diff * diff).sum(-1)
            return -f if self.squared else -sqrt_zero_grad(f)
        if self.pairwise:
            return -power_sums(q[:, None, :] - gathered, self.p)
        products = torch.einsum("bd,bkd->bk", q, gathered)
        # cosine: the unit rows' products less the offset 1
        return products - 1.0 if self.kind == "cosine" else products


def _padded(x, n):
    """The vector ``x`` with zeros appended up to ``n`` entries."""
    return x if x.shape[0] == n else torch.nn.functional.pad(x, (0, n - x.shape[0]))


def _block_bias(offset, scale, prior):
    """``scale * offset + prior`` of a key block (``None`` where both are)."""
    bias = None if offset is None else offset * scale
    if prior is not None:
        bias = prior if bias is None else bias + prior
    return bias


def _requires_grad(x):
    return isinstance(x, torch.Tensor) and x.requires_grad


def _exact_entries(budget):
    """Gathered coordinates per exact-distance chunk: three float64 copies (keys, queries,
    differences) within ``budget``, and cache-sized."""
    return plan_rows(None, row_bytes=3 * 8, budget=budget, max_rows=CPU_BLOCK_ENTRIES)


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
