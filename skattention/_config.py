"""Global configuration (no torch or scikit-learn imports: the engine reads it too)."""

import math
import os
import threading
from contextlib import contextmanager
from numbers import Integral, Real


def _default_working_memory():
    """256 MiB, or the environment's ``SKATTENTION_WORKING_MEMORY`` (like scikit-learn's
    ``SKLEARN_WORKING_MEMORY``): the way to set the budget of processes a library starts, such as
    joblib or Dask workers, which do not inherit a ``set_config`` of the parent."""
    value = os.environ.get("SKATTENTION_WORKING_MEMORY")
    if value is None:
        return 256
    try:
        mib = float(value)
    except ValueError:
        mib = math.nan
    if not (math.isfinite(mib) and mib > 0):
        raise ValueError(
            f"SKATTENTION_WORKING_MEMORY must be a positive number of MiB, got {value!r}."
        )
    return int(mib) if mib.is_integer() else mib


_DEFAULTS = {
    # Extra working memory (MiB) one engine call may hold beyond its inputs and outputs,
    # like scikit-learn's ``working_memory``.
    "working_memory": _default_working_memory(),
}
_local = threading.local()


def _state():
    if not hasattr(_local, "config"):
        _local.config = dict(_DEFAULTS)
    return _local.config


def get_config():
    """Return a copy of the current skattention configuration.

    Returns
    -------
    config : dict
        Keys: ``working_memory`` (MiB of scratch memory an attention call may use; default 256,
        or the ``SKATTENTION_WORKING_MEMORY`` environment variable when the package is imported).

    Examples
    --------
    >>> import skattention
    >>> skattention.get_config()["working_memory"]
    256
    """
    return dict(_state())


def set_config(working_memory=None):
    """Set global skattention configuration (per thread).

    The setting does not reach other processes (joblib's loky or Dask workers): set the
    ``SKATTENTION_WORKING_MEMORY`` environment variable before they start instead.

    Parameters
    ----------
    working_memory : int or float, default=None
        Scratch memory budget in MiB for one attention call. Score blocks, top-k buffers
        and gathered values are sized to fit it. ``None`` leaves the value unchanged.

    Examples
    --------
    >>> import skattention
    >>> skattention.set_config(working_memory=128)
    >>> skattention.get_config()["working_memory"]
    128
    >>> skattention.set_config(working_memory=256)
    """
    if working_memory is not None:
        _state()["working_memory"] = check_working_memory(working_memory)


def check_working_memory(working_memory):
    """``working_memory`` if it is a positive, finite number of MiB (not a bool), else ValueError.

    The one check of the budget: :func:`set_config` applies it when the value is set, the engine
    to a ``working_memory`` passed to one call.
    """
    if (
        isinstance(working_memory, bool)
        or not isinstance(working_memory, Real)
        or not 0 < working_memory < math.inf
    ):
        raise ValueError(
            f"working_memory must be a positive number of MiB (finite, not a bool), got "
            f"{working_memory!r}."
        )
    # a Python number: a NumPy scalar's own arithmetic overflows (np.int32(2048) MiB in bytes
    # was a negative budget) or raises (np.float16)
    return int(working_memory) if isinstance(working_memory, Integral) else float(working_memory)


@contextmanager
def config_context(*, working_memory=None):
    """Context manager that temporarily changes the global configuration.

    Parameters
    ----------
    working_memory : int or float, default=None
        Scratch memory budget in MiB inside the context.

    Examples
    --------
    >>> import skattention
    >>> with skattention.config_context(working_memory=64):
    ...     skattention.get_config()["working_memory"]
    64
    """
    old = get_config()
    set_config(working_memory=working_memory)
    try:
        yield
    finally:
        _state().clear()
        _state().update(old)
