"""Global configuration (no torch or scikit-learn imports: the engine reads it too)."""

import threading
from contextlib import contextmanager

_DEFAULTS = {
    # Extra working memory (MiB) one engine call may hold beyond its inputs and outputs,
    # like scikit-learn's ``working_memory``.
    "working_memory": 256,
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
        Keys: ``working_memory`` (MiB of scratch memory an attention call may use).

    Examples
    --------
    >>> import skattention
    >>> skattention.get_config()["working_memory"]
    256
    """
    return dict(_state())


def set_config(working_memory=None):
    """Set global skattention configuration (per thread).

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
        if not (isinstance(working_memory, (int, float)) and working_memory > 0):
            raise ValueError(f"working_memory must be a positive number of MiB, got {working_memory!r}.")
        _state()["working_memory"] = working_memory


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
