"""Validation of engine inputs into one problem object, :class:`Spec` (torch only).

:func:`attention` and :func:`kneighbors` validate their arguments once, here, into a ``Spec``:
tensors on the compute device and dtype, the prepared keys (``PreparedKeys``), the priors and masks,
the temperature and the scratch budget. Backends read the spec and nothing else. The checks of
single values (temperature, counts, radius) are shared with the kernels of ``_kernels.py``.
"""

import functools
import math
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
import torch

from ._budget import all_finite, budget_bytes
from ._device import dtype_name, is_auto_device, resolve_device, resolve_dtype
from ._kinds import f_of_distance, metric_kind
from ._masks import Radius
from ._scores import PreparedKeys
from ._softmax import product_values


@dataclass
class Spec:
    """One validated attention (or k-NN) problem on its compute device and dtype.

    ``keys`` are the prepared keys (the caller's, or prepared here for this call);
    ``values`` is 2-D (``squeeze`` says whether the caller's was 1-D), ``values_mm`` the same
    as products take them (``_softmax.product_values``, built on first use: only the streaming
    backend's products need the copy); ``temperature`` a float,
    or a 0-d tensor when it is learned; ``prior_vec`` a per-key log-prior, ``prior_fn`` a
    callable one, ``key_mask`` the keys ``prior_vec`` masks (``None`` when none is);
    ``self_index`` the key each query excludes (``-1``: none), ``unit_out`` the key of which it
    leaves one unit of weight out instead (``_multiplicity.leave_one_unit_out``);
    ``n_weights`` how many weights to return (``None``: none); ``budget`` the scratch budget in
    bytes; ``grad`` whether the result is differentiated; ``prepared`` whether the keys came
    prepared (``prepare_keys``: what is built for them, such as the k-NN selection's key cells,
    serves later calls too).
    """

    device: torch.device
    dtype: torch.dtype
    queries: torch.Tensor
    keys: PreparedKeys
    values: torch.Tensor = None
    values_mm_of: object = None
    squeeze: bool = False
    as_numpy: bool = True
    temperature: object = 1.0
    n_neighbors: int = None
    radius: Radius = None
    prior_vec: torch.Tensor = None
    prior_fn: object = None
    key_mask: torch.Tensor = None
    self_index: torch.Tensor = None
    unit_out: torch.Tensor = None
    n_weights: int = None
    on_empty: str = "raise"
    budget: int = 0
    progress: object = False
    grad: bool = False
    prepared: bool = False

    @functools.cached_property
    def values_mm(self):
        return self.values_mm_of()

    @property
    def n_queries(self):
        return self.queries.shape[0]

    @property
    def n_keys(self):
        return self.keys.n_keys


def make_spec(queries, keys, values, *, metric, n_neighbors, radius, log_prior, exclude_self,
              device, dtype, working_memory, temperature=1.0, return_weights=False,
              n_weights=None, on_empty="raise", progress=False):
    """Validate the arguments of :func:`attention` (``values`` given) or :func:`kneighbors`."""
    prepared = keys if isinstance(keys, PreparedKeys) else None
    if prepared is not None:
        # keys validated and prepared once (prepare_keys): no per-call pass over them
        dev, dt = prepared.raw.device, prepared.raw.dtype
        check_prepared(prepared, metric, device, dtype)
    else:
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, queries, keys, values)
    Q = as_tensor(queries, "queries", dev, dt, ndims=(2,))
    if prepared is None:
        K = as_tensor(keys, "keys", dev, dt, ndims=(2,))
        n_k, key_features = K.shape
    else:
        n_k, key_features = prepared.n_keys, prepared.n_features
    n_q = Q.shape[0]
    if n_k == 0:
        raise ValueError("keys is empty: attention needs at least one key.")
    if not callable(metric) and key_features == 0:  # (every distance 0: uniform weights)
        raise ValueError("keys have 0 features: attention needs at least one, as scikit-learn's "
                         "neighbours do.")
    if not callable(metric) and Q.shape[1] != key_features:
        raise ValueError(
            f"queries have {Q.shape[1]} features but keys have {key_features}; they must match."
        )
    T = None if values is None else check_temperature(temperature, dev, dt)
    V = None if values is None else checked_values(prepared, values, n_k, dev,
                                                   averaging_dtype(values, T, dt, dev))
    kind, p = metric_kind(metric)
    if n_neighbors is not None:
        n_neighbors = check_count(n_neighbors, "n_neighbors", n_k, "the number of keys")
    if radius is not None:
        if metric == "dot":
            raise ValueError("radius needs a distance metric; metric='dot' has none.")
        radius = check_radius(radius, n_q, n_k, dev, dt,
                              lambda r: f_of_distance(kind, p, r))
    prior_vec, prior_fn, key_mask = checked_log_prior(prepared, log_prior, n_k, dev, dt)
    self_index = check_exclude_self(exclude_self, n_q, n_k, dev)
    if not isinstance(progress, (bool, np.bool_, Integral)):  # "yes" would have meant True
        raise TypeError(f"progress must be a bool or an int, got {progress!r}.")
    budget = budget_bytes(working_memory)
    spec = Spec(
        device=dev, dtype=dt, queries=Q, keys=prepared or PreparedKeys(K, metric),
        n_neighbors=n_neighbors,
        radius=radius, prior_vec=prior_vec, prior_fn=prior_fn, self_index=self_index,
        budget=budget, progress=progress, as_numpy=not isinstance(queries, torch.Tensor),
        prepared=prepared is not None,
    )
    spec.key_mask = key_mask
    if V is None:
        return spec
    spec.squeeze, spec.values, spec.values_mm_of = values_for_products(prepared, values, V)
    spec.temperature = T
    if on_empty not in ("raise", "zero"):
        raise ValueError(f"on_empty must be 'raise' or 'zero', got {on_empty!r}.")
    spec.on_empty = on_empty
    return spec


def differentiated(spec):
    """Whether the attention of ``spec`` is differentiated: autograd is on and an input
    requires grad (a learned ``phi`` shows up as keys that require grad), or the temperature
    is learned."""
    return torch.is_grad_enabled() and (
        spec.queries.requires_grad
        or spec.keys.keys.requires_grad
        or spec.values.requires_grad
        or isinstance(spec.temperature, torch.Tensor)
        or (spec.prior_vec is not None and spec.prior_vec.requires_grad)
    )


def prepare_keys(keys, *, metric="sqeuclidean", device="auto", dtype=None):
    """Keys validated and prepared once for many :func:`attention` / :func:`kneighbors` calls.

    Pass the result as ``keys``: the calls then skip the per-call conversion, finiteness check
    and preparation (centring, norms) of the keys, which for a single query row cost more than
    its attention. ``metric``, ``device`` and ``dtype`` of the calls must match (``device`` and
    ``dtype`` may be left to their defaults).
    """
    metric_kind(metric)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, keys)
    return PreparedKeys(as_tensor(keys, "keys", dev, dt, ndims=(2,)), metric)


def averaging_dtype(values, temperature, dtype, device):
    """The dtype the values are averaged in: ``dtype`` (the compute dtype), except float64
    values at temperature ``inf`` or ``0`` (the selections that equal scikit-learn's neighbour
    estimators: uniform weights over the selected keys), which keep float64 whatever the
    compute dtype, as scikit-learn averages its float64 targets for float32 inputs (a float32
    average differed from KNeighborsRegressor's by up to 1.5e-7 relative). Scores and
    selections stay in ``dtype``; values that require grad keep it too. With a per-key
    log-prior the weights themselves (``exp`` of the prior) still come from ``dtype``. Not on
    ``device`` types without float64 (Apple's MPS)."""
    if (dtype == torch.float64 or device.type == "mps" or not isinstance(temperature, float)
            or temperature not in (0.0, math.inf)):
        return dtype
    if isinstance(values, torch.Tensor):
        float64 = values.dtype == torch.float64 and not values.requires_grad
    else:
        float64 = isinstance(values, np.ndarray) and values.dtype == np.float64
    return torch.float64 if float64 else dtype


def checked_values(prepared, values, n_keys, device, dtype):
    """``values`` as a tensor on ``device`` and ``dtype``, checked (finite, 1-D or 2-D, a row
    per key); remembered on ``prepared`` keys (``None``: none)."""
    V = _remembered(prepared, "values", values,
                    lambda: as_tensor(values, "values", device, dtype, ndims=(1, 2)), dtype)
    if V.shape[0] != n_keys:
        raise ValueError(
            f"values has {V.shape[0]} rows but there are {n_keys} keys; they must match."
        )
    return V


def values_for_products(prepared, values, V):
    """``(squeeze, values, values_mm_of)`` of the checked values ``V``: whether they were 1-D,
    as columns, and a function giving them as products take them (``product_values``,
    remembered on ``prepared``; a copy, made only when called)."""
    squeeze = V.ndim == 1
    V = V[:, None] if squeeze else V
    return squeeze, V, lambda: _remembered(prepared, "values_mm", values,
                                           lambda: product_values(V), V.dtype)


def checked_log_prior(prepared, log_prior, n_keys, device, dtype):
    """``(prior_vec, prior_fn, key_mask)`` of ``log_prior`` (:func:`_checked_log_prior`),
    remembered on ``prepared`` keys (``None``: none)."""
    return _remembered(prepared, "log_prior", log_prior,
                       lambda: _checked_log_prior(log_prior, n_keys, device, dtype))


def _remembered(prepared, name, source, build, *key):
    """``build()``, remembered on prepared keys for the same unmodified ``source`` tensor and
    ``key`` (``PreparedKeys.remembered``; the call's device is the prepared keys')."""
    return build() if prepared is None else prepared.remembered(name, source, build, *key)


def _checked_log_prior(log_prior, n_keys, device, dtype):
    """``(prior_vec, prior_fn, key_mask)``: :func:`check_log_prior` and the keys a per-key
    prior masks (``None`` when it masks none). A fixed per-key prior of zeros (unit weights)
    is no prior: the same attention, with fewer operations (a k-NN block skips the
    multiplicities, a dense block the bias)."""
    prior_vec, prior_fn = check_log_prior(log_prior, n_keys, device, dtype)
    if prior_vec is not None and not prior_vec.requires_grad and not bool(prior_vec.any()):
        prior_vec = None
    key_mask = None
    if prior_vec is not None:
        masked = torch.isneginf(prior_vec)
        key_mask = masked if bool(masked.any()) else None
    return prior_vec, prior_fn, key_mask


def check_prepared(prepared, metric, device, dtype):
    """The call's ``metric``, ``device`` and ``dtype`` against those of prepared keys."""
    raw = prepared.raw
    if metric != prepared.metric:
        raise ValueError(
            f"metric={metric!r} differs from the metric the keys were prepared for "
            f"({prepared.metric!r})."
        )
    if not is_auto_device(device):
        asked = resolve_device(device)
        # "cuda" names the current device, which tensors report as "cuda:0"
        if (asked.type, asked.index or 0) != (raw.device.type, raw.device.index or 0):
            raise ValueError(
                f"device={device!r} differs from the device of the prepared keys ({raw.device})."
            )
    if dtype is not None and resolve_dtype(dtype) != raw.dtype:
        raise ValueError(
            f"dtype={dtype!r} differs from the dtype of the prepared keys ({raw.dtype})."
        )


def check_weights_count(spec, return_weights, n_weights, selected=None):
    """How many weights :func:`attention` returns per query (``None``: no weights): by default
    the keys that can get weight, ``selected`` with a k-NN prior (more than ``n_neighbors``
    where key weights below 1 count as fractions of a key), else every key; at most every key
    (a k-NN row's entries past its selection are padding)."""
    if not return_weights:
        if n_weights is not None:
            raise ValueError("n_weights sets how many weights return_weights=True returns; "
                             "pass return_weights=True with it.")
        return None
    if n_weights is None:
        return selected if spec.n_neighbors is not None else spec.n_keys
    return check_count(n_weights, "n_weights", spec.n_keys, f"the {spec.n_keys} keys")


def as_tensor(x, name, device, dtype, ndims):
    if isinstance(x, torch.Tensor):
        t = x
    else:
        try:
            arr = np.asarray(x)
        except Exception as exc:
            raise TypeError(f"{name} could not be converted to an array: {exc}") from exc
        if arr.dtype.kind not in "biuf":
            raise TypeError(f"{name} must be numeric, got an array of dtype {arr.dtype}.")
        if not arr.flags.writeable:
            arr = arr.copy()  # torch cannot wrap read-only memory (e.g. memory-mapped inputs)
        # (np.ascontiguousarray makes a 0-d array 1-d: the shape check below must see it)
        t = torch.from_numpy(np.ascontiguousarray(arr) if arr.ndim else arr.copy())
    if t.is_complex():
        raise TypeError(f"{name} must be real-valued, got dtype {t.dtype}.")
    if t.ndim not in ndims:
        expected = " or ".join(f"{d}-D" for d in ndims)
        raise ValueError(f"{name} must be {expected}, got an array of shape {tuple(t.shape)}.")
    source, t = t, t.to(device=device, dtype=dtype)
    if not all_finite(t):
        if source.dtype != t.dtype and all_finite(source):
            peak = float(source.abs().max())
            # the cast overflowed: finite inputs reported as NaN or infinity misled
            raise ValueError(f"{name}: values of magnitude {peak:.3g} are beyond "
                             f"{dtype_name(dtype)} (up to {torch.finfo(dtype).max:.3g}), the "
                             "dtype of the computation; pass a wider dtype or rescale them.")
        raise ValueError(f"{name} contains NaN or infinity.")
    return t


def check_temperature(temperature, device=None, dtype=None, *, positive_finite=False):
    """The one temperature check: a real number (Python or NumPy scalar) or a 0-d tensor.

    Attention accepts ``0`` (arg-max) and ``inf`` (uniform); a finite positive tensor that
    requires grad is returned as a 0-d tensor on ``device`` (a learned temperature), anything
    else as a float. ``positive_finite``: only ``0 < T < inf`` (the Gaussian kernels).
    """
    expected = "a positive finite number" if positive_finite else "a number >= 0 (inf allowed)"
    if isinstance(temperature, torch.Tensor):
        if temperature.numel() != 1:
            raise ValueError("temperature must be a scalar.")
        value = float(temperature.detach())
    elif isinstance(temperature, np.ndarray) and temperature.ndim == 0 and (
            temperature.dtype.kind in "iuf"):  # a 0-d array, as NumPy's reductions return
        value = float(temperature)
    elif isinstance(temperature, bool) or not isinstance(temperature, Real):
        raise ValueError(f"temperature must be {expected}, got {temperature!r}.")
    else:
        value = float(temperature)
    if positive_finite and not 0 < value < math.inf:
        raise ValueError(f"temperature must be {expected}, got {temperature!r}.")
    if math.isnan(value) or value < 0:
        raise ValueError(f"temperature must be >= 0 (inf allowed), got {temperature!r}.")
    learned = isinstance(temperature, torch.Tensor) and temperature.requires_grad
    if learned and not positive_finite and 0 < value < math.inf:
        return temperature.reshape(()).to(device=device, dtype=dtype)
    return value


def clamp_log_temperature(log_temperature, dtype=None):
    """A log-temperature (a float or a tensor) clamped to ``[log(tiny) / 2, log(max) / 2]`` of
    ``dtype`` (``None``: the tensor's own): a temperature whose ``exp`` under- or overflows
    the dtype would become 0 or inf, the limits without a gradient, so a learned or
    calibrated temperature stays well inside its range. A tensor comes back as a tensor
    (differentiable inside the range), a float as a float."""
    info = torch.finfo(log_temperature.dtype if dtype is None else dtype)
    low, high = 0.5 * math.log(info.tiny), 0.5 * math.log(info.max)
    if isinstance(log_temperature, torch.Tensor):
        return log_temperature.clamp(low, high)
    return min(max(log_temperature, low), high)


def check_nonnegative_real(value, name):
    """``value`` as a float if it is a finite real number >= 0 (NumPy scalars included)."""
    if isinstance(value, bool) or not isinstance(value, Real) or not 0 <= value < math.inf:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}.")
    return float(value)


def check_count(value, name, limit, limit_name=None):
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    if value > limit:
        what = limit_name or f"the {limit} keys that can get weight"
        raise ValueError(f"{name}={value} is larger than {what} ({limit}).")
    return int(value)


def check_radius(radius, n_q, n_k, device, dtype, f_of):
    """Validate ``radius`` into a :class:`Radius` (``f_of``: the metric's ``f`` at a
    distance); ``None`` for an infinite radius (no mask)."""
    if isinstance(radius, tuple) and len(radius) == 2:
        query_r, key_r = (
            as_tensor(r, name, device, dtype, ndims=(1,))
            for r, name in zip(radius, ("query radius", "key radius"))
        )
        if query_r.shape[0] != n_q or key_r.shape[0] != n_k:
            raise ValueError(
                f"a (query_radius, key_radius) pair needs shapes ({n_q},) and ({n_k},), got "
                f"{tuple(query_r.shape)} and {tuple(key_r.shape)}."
            )
        if bool((query_r < 0).any()) or bool((key_r < 0).any()):
            raise ValueError("radii must be >= 0.")
        return Radius(f_of, query_r=query_r, key_r=key_r)
    if not isinstance(radius, Real) or isinstance(radius, bool) or not radius >= 0:
        raise ValueError(
            f"radius must be a number >= 0, a (query_radius, key_radius) pair of arrays "
            f"or None, got {radius!r}."
        )
    return None if math.isinf(radius) else Radius(f_of, radius=float(radius))


def check_log_prior(log_prior, n_keys, device, dtype):
    if log_prior is None:
        return None, None
    if callable(log_prior) and not isinstance(log_prior, (np.ndarray, torch.Tensor)):
        return None, log_prior
    if isinstance(log_prior, torch.Tensor):
        prior = log_prior.to(device=device, dtype=dtype)
    else:
        arr = np.array(log_prior, copy=True)
        if arr.dtype.kind not in "biuf":
            raise TypeError(f"log_prior must be numeric, got dtype {arr.dtype}.")
        prior = torch.from_numpy(arr).to(device=device, dtype=dtype)
    if prior.shape != (n_keys,):
        raise ValueError(
            f"log_prior must have shape (n_keys,) = ({n_keys},), got {tuple(prior.shape)}."
        )
    if bool(torch.isnan(prior).any()) or bool((prior == math.inf).any()):
        raise ValueError("log_prior contains NaN or +inf; use -inf to mask a key.")
    return prior, None


def check_exclude_self(exclude_self, n_q, n_k, device):
    if isinstance(exclude_self, np.bool_):  # NumPy's True and False mean Python's
        exclude_self = bool(exclude_self)
    if exclude_self is None or exclude_self is False:
        return None
    if exclude_self is True:
        if n_q != n_k:
            raise ValueError(
                f"exclude_self=True needs the queries to be the keys, but there are {n_q} queries "
                f"and {n_k} keys; pass an index array instead."
            )
        return torch.arange(n_q, device=device)
    if not isinstance(exclude_self, torch.Tensor):
        exclude_self = np.asarray(exclude_self)
    idx = torch.as_tensor(exclude_self)
    if idx.dtype.is_floating_point or idx.dtype == torch.bool or idx.shape != (n_q,):
        raise ValueError(
            f"exclude_self must be a bool or an integer array of shape ({n_q},), got "
            f"dtype {idx.dtype} and shape {tuple(idx.shape)}."
        )
    if n_q and (int(idx.min()) < -1 or int(idx.max()) >= n_k):
        raise ValueError("exclude_self indices must lie in [-1, n_keys).")
    return idx.to(device=device, dtype=torch.long)
