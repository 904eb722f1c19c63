"""Device and dtype resolution for the attention engine, and the seeded torch RNG of a fit."""

import contextlib
import threading

import numpy as np
import torch

# torch's default RNG is process-wide, and fork_rng() saves it on entry and restores it on exit:
# two fits inside it at once (joblib's threading backend) would draw from each other's seeded
# stream and restore each other's state. Fits hold this lock while they draw from it.
_GLOBAL_RNG_LOCK = threading.RLock()

_DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}


def is_auto_device(device):
    """Whether a ``device`` parameter asks for the default device (``"auto"`` or ``None``)."""
    return device is None or (isinstance(device, str) and device == "auto")


def parse_device(device):
    """The :class:`torch.device` a ``device`` parameter names, without checking that this
    machine has it; ``"auto"`` (or ``None``) is CUDA when available, else the CPU.

    The one parser of ``device`` values: :func:`resolve_device` adds the availability check,
    and ``skattention.utils`` asks it whether a configured device exists here.

    Raises
    ------
    ValueError
        If ``device`` names no device, or one of a type the engine does not support.
    """
    if is_auto_device(device):
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"device={device!r} is not a valid device; use 'auto', 'cpu', 'cuda' or 'cuda:N'."
        ) from exc
    if dev.type not in ("cpu", "cuda", "mps"):
        raise ValueError(
            f"device={device!r} is not supported; use 'auto', 'cpu', 'cuda' or 'cuda:N'."
        )
    return dev


def device_available(dev):
    """Whether this machine has the parsed device ``dev`` (:func:`parse_device`)."""
    return _unavailable(dev, dev) is None


def _unavailable(dev, device):
    """Why this machine does not have the parsed device ``dev`` (asked for as ``device``), or
    ``None`` when it has it."""
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return (
                f"device={device!r} was requested but CUDA is not available on this machine "
                "(torch.cuda.is_available() is False); use device='cpu' or device='auto'."
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            return (
                f"device={device!r} was requested but only {torch.cuda.device_count()} "
                "CUDA device(s) are visible."
            )
    elif dev.type == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            return f"device={device!r} was requested but MPS is not available."
    return None


def resolve_device(device="auto"):
    """Turn a device specification into a usable :class:`torch.device`.

    A :class:`torch.device` that an estimator resolved once for a public call passes through
    without being parsed again (an accelerator's is still checked to exist here, the CPU
    always does).

    Parameters
    ----------
    device : {"auto", "cpu", "cuda", "cuda:N", "mps"} or torch.device, default="auto"
        ``"auto"`` picks CUDA when available, else the CPU.

    Returns
    -------
    device : torch.device

    Raises
    ------
    ValueError
        If the device string is malformed or names an accelerator that is not available.

    Examples
    --------
    >>> from skattention import resolve_device
    >>> resolve_device("cpu")
    device(type='cpu')
    """
    if isinstance(device, torch.device) and device.type == "cpu":
        return device
    dev = parse_device(device)
    reason = _unavailable(dev, device)
    if reason is not None:
        raise ValueError(reason)
    return dev


def resolve_dtype(dtype, *tensors):
    """Pick the compute dtype.

    ``None`` keeps the floating dtype of torch tensor inputs (promoted across them) and uses
    float32 for everything else (NumPy arrays, integer tensors, lists).
    """
    if dtype is None:
        floats = [t.dtype for t in tensors if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if not floats:
            return torch.float32
        out = floats[0]
        for dt in floats[1:]:
            out = torch.promote_types(out, dt)
        return out
    if isinstance(dtype, torch.dtype):
        resolved = dtype
    elif isinstance(dtype, str) and dtype in _DTYPES:
        resolved = _DTYPES[dtype]
    else:
        try:
            resolved = _DTYPES[np.dtype(dtype).name]
        except (TypeError, KeyError):
            raise ValueError(
                f"dtype={dtype!r} is not supported; use one of {sorted(_DTYPES)} or None."
            ) from None
    if not resolved.is_floating_point:
        raise ValueError(f"dtype={dtype!r} is not a floating dtype.")
    return resolved


def accumulation_dtype(dtype):
    """The dtype sums of weights and weighted values of ``dtype`` accumulate in: float32 for
    the half-precision dtypes (float16's largest number is 65,504: the weight sum of a row over
    more keys than that overflowed, and each added weight lost more bits), as fused attention
    kernels accumulate; else ``dtype``."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def dtype_name(dtype):
    """The name (``"float64"``, ...) of the floating dtype that ``dtype`` names, read as
    :func:`resolve_dtype` reads it (a name, a NumPy scalar type or dtype, a torch dtype);
    ``None`` where it names none (``None``, an integer dtype, an unknown name)."""
    if dtype is None:
        return None  # "follow the inputs", not a dtype
    try:
        return str(resolve_dtype(dtype)).removeprefix("torch.")
    except (TypeError, ValueError):
        return None


@contextlib.contextmanager
def seeded_torch_rng(seed, device):
    """Seed torch's global RNG (CPU, and ``device`` if it is a GPU) for the block, restoring the
    caller's state afterwards; one thread at a time. Module initialisation and dropout draw from
    this RNG; anything else should take a ``torch.Generator``.

    Yields ``release(module)``: once the modules are built, it ends the seeded scope early (the
    caller's state restored, other threads' fits free to seed) unless training ``module`` draws
    from the global RNG (dropout), in which case the scope lasts to the end of the block.
    """
    devices = [device] if torch.device(device).type == "cuda" else []
    with contextlib.ExitStack() as scope:
        scope.enter_context(_GLOBAL_RNG_LOCK)
        scope.enter_context(torch.random.fork_rng(devices=devices))
        torch.manual_seed(seed)

        def release(module):
            if not draws_from_global_rng(module):
                scope.close()

        yield release


# The dropout modules of torch (public names: their common base class is private).
_DROPOUT_MODULES = (
    torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d,
    torch.nn.AlphaDropout, torch.nn.FeatureAlphaDropout,
)


def draws_from_global_rng(module):
    """Whether running ``module`` in training mode draws from torch's global RNG (dropout)."""
    for m in module.modules():
        rate = m.p if isinstance(m, _DROPOUT_MODULES) else getattr(m, "dropout", 0.0)
        # skattention.nn layers keep their rate as `dropout`
        if isinstance(rate, float) and rate > 0:
            return True
    return False
