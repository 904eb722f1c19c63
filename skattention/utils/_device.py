"""Moving fitted models between machines with different accelerators."""

import threading
import warnings
import weakref

import torch

from .._engine import device_available, parse_device
from ._dask import computed_state

# Per estimator, what predict keeps ready on a compute device (see DevicePortableMixin).
_DEVICE_CACHE = weakref.WeakKeyDictionary()
_CACHE_LOCK = threading.Lock()


def _same_version(kept, version):
    """Whether ``version`` equals the ``kept`` one (:meth:`DevicePortableMixin._on_device`)."""
    return len(kept) == len(version) and all(
        torch.equal(k, v) if isinstance(v, torch.Tensor) else k is v
        for k, v in zip(kept, version, strict=True)
    )


def _available(device):
    """Whether a ``device`` parameter value names a device this machine has."""
    try:
        dev = parse_device(device)
    except ValueError:
        return True  # not a device at all: left for parameter validation to report
    return device_available(dev)


class DevicePortableMixin:
    """Unpickling where the configured accelerator is missing falls back to the CPU, with a warning.

    Fitted attributes are NumPy arrays or CPU torch modules, so a model fitted on a GPU loads
    anywhere; only the ``device`` parameter still names the GPU. As skorch does, loading such
    a model on a machine without that device warns and sets ``device="cpu"``, so that
    ``predict`` works instead of failing on the missing device.
    """

    def _on_device(self, name, source, device, dtype, build, version=()):
        """``build(source, device, dtype)``, cached per fitted ``source`` object and compute
        device/dtype, so that predict does not convert or prepare the fitted model again on
        every call. ``version``: what else the result depends on (tensors compared by value
        with copies taken at the build, other objects by identity). The cache lives outside
        the estimator (predict leaves ``__dict__`` as it was, and pickles and clones do not
        carry it); an entry is rebuilt once ``source`` is replaced by a new fit or ``version``
        changes, and goes with the estimator."""
        with _CACHE_LOCK:
            cache = _DEVICE_CACHE.setdefault(self, {})
        key = (name, device.type, device.index, dtype)
        entry = cache.get(key)
        if entry is None or entry[0] is not source or not _same_version(entry[1], version):
            kept = tuple(v.detach().clone() if isinstance(v, torch.Tensor) else v
                         for v in version)
            entry = cache[key] = (source, kept, build(source, device, dtype))
        return entry[2]

    def __getstate__(self):
        # fitted on a Dask cluster: the pickle holds the computed arrays (a self-contained
        # in-memory model), not references to the cluster's memory
        return computed_state(super().__getstate__())

    def __setstate__(self, state):
        super().__setstate__(state)
        device = getattr(self, "device", None)
        if not _available(device):
            warnings.warn(
                f"{type(self).__name__} was configured with device={device!r}, which this machine "
                "does not have; it was loaded with device='cpu'.",
                UserWarning,
                stacklevel=2,
            )
            self.device = "cpu"


def _cuda_nondeterministic(device):
    """Whether work on ``device`` may differ between runs: CUDA float atomics (``index_add_``,
    the backward of ``gather``/indexing and of fused attention) unless
    ``torch.use_deterministic_algorithms(True)`` is in effect. The CPU is always exact.

    For the ``non_deterministic`` estimator tag; ``device="auto"`` counts as CUDA when a GPU is
    visible, as it resolves to one.
    """
    if torch.are_deterministic_algorithms_enabled() or not torch.cuda.is_available():
        return False
    try:
        return parse_device(device).type == "cuda"
    except ValueError:
        return False
