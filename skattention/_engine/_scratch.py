"""Scratch buffers that the steps of a training loop reuse (torch only).

A training step's attention passes over its (rows x keys) block in cache-sized chunks, each
chunk's scores, weights and gradients in a buffer of about a megabyte. Allocated afresh in every
step, such buffers come from the system as new pages, and touching them the first time costs
page faults comparable to the arithmetic done in them (docs/performance.md, "Shared
machines"). Within :func:`reused_buffers` (a training loop), :func:`scratch` hands out the same
buffers again from step to step; elsewhere it allocates, as before.
"""

import contextlib
import threading

_held = threading.local()


@contextlib.contextmanager
def reused_buffers():
    """Within, :func:`scratch` called in this thread keeps its buffers from call to call, and
    :func:`claim` records their claims; both are released on leaving (the outermost context)."""
    before = getattr(_held, "buffers", None), getattr(_held, "claims", None)
    if before[0] is None:
        _held.buffers, _held.claims = {}, {}
    try:
        yield
    finally:
        _held.buffers, _held.claims = before


def reusing_buffers():
    """Whether :func:`scratch` called in this thread now keeps its buffers (within
    :func:`reused_buffers`)."""
    return getattr(_held, "buffers", None) is not None


class Claim:
    """The latest use of the buffer kept under a key (:func:`claim`): a use that spans two
    calls (a forward pass's kept values read by its backward) finds with :meth:`release`
    whether another use has taken the buffer in between."""

    def __init__(self, owners, key):
        self.owners, self.key = owners, key
        owners[key] = self

    def release(self):
        """True (once) if no later claim of the buffer was made, and the buffer is free."""
        held = self.owners.get(self.key) is self
        if held:
            del self.owners[self.key]
        return held


def claim(key):
    """A :class:`Claim` of the buffer kept under ``key`` in this thread (within
    :func:`reused_buffers`), which ends every earlier claim of it."""
    return Claim(_held.claims, key)


def scratch(key, shape, like):
    """An uninitialised tensor of ``shape`` with the dtype and device of ``like``: within
    :func:`reused_buffers`, a view of the buffer kept under ``key`` (grown when too small),
    else a new tensor. A buffer serves one use at a time: the caller names distinct keys for
    buffers in use together, and a tensor it returns must not outlive that use (it is
    overwritten by the next)."""
    buffers = getattr(_held, "buffers", None)
    if buffers is None:
        return like.new_empty(shape)
    size = 1
    for n in shape:
        size *= n
    held = buffers.get(key)
    if (held is None or held.numel() < size or held.dtype != like.dtype
            or held.device != like.device):
        held = buffers[key] = like.new_empty(size)
    return held[:size].view(shape)
