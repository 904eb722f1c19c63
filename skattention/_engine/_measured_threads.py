"""The thread count of a loop of like CPU steps chosen from their measured times (torch only)."""

import contextlib
import math
import time

import torch

from ._parallel import cpu_threads

# MeasuredThreads: a neighbouring thread count is tried after the first two steps and then
# after this many steps, the interval doubled each time it loses; it replaces the current count
# where a step on it took at most _SWITCH_SHARE of the current count's time per unit of work
# (a single step's time is noisy) ...
_PROBE_INTERVAL = 16
_SWITCH_SHARE = 0.85
# ... and is tried on a second step where its first took at most _CONFIRM_SHARE of it: after a
# step on more threads, OpenMP's idle threads spin on for milliseconds, on the cores a step on
# fewer threads would have to itself.
_CONFIRM_SHARE = 1.25


class MeasuredThreads:
    """The thread count of a loop of like CPU steps (a fit's iterations), chosen from the
    steps' measured times: on a busy machine each parallel region of a step waits at its
    barrier for a descheduled thread, and fewer threads finish the same work sooner
    (docs/performance.md, "Shared machines"). It starts at the caller's count; a
    neighbouring count (half, or double up to the caller's) runs a step after the first two
    and then every ``_PROBE_INTERVAL`` steps or more, and replaces the current one where it
    took clearly less time per unit of ``work``. The engine's results do not depend on the
    thread count (each block is computed as the serial loop computes it, products of the
    calling thread on one MKL thread: :func:`map_blocks`), so the choice changes the speed
    alone.

    ``with threads.step(work): ...`` around each step; ``with threads.chosen(): ...`` around
    the work after the loop. ``clock`` gives seconds."""

    def __init__(self, device, clock=time.perf_counter):
        self.most = torch.get_num_threads() if device.type == "cpu" else 1
        self.current, self.cost = self.most, {}
        self.n_steps, self.next_probe, self.interval = 0, 2, _PROBE_INTERVAL
        self.clock, self.down, self.probing, self.last = clock, True, None, None

    def _neighbour(self):
        lower, upper = max(1, self.current // 2), min(self.most, 2 * self.current)
        if lower == self.current or upper == self.current:
            return upper if lower == self.current else lower
        self.down = not self.down  # between the two ends: down and up in turn
        return lower if self.down else upper

    def chosen(self):
        """The calling thread on the current count."""
        return self._on(self.current)

    def _on(self, count):
        """The calling thread on ``count`` threads (the caller's own: nothing to set)."""
        return contextlib.nullcontext() if count == self.most else cpu_threads(count)

    @contextlib.contextmanager
    def step(self, work):
        if self.most < 2:
            yield
            return
        now = self.clock()
        self._settle(now)
        if self.probing is None and self.n_steps >= self.next_probe:
            self.probing = [self._neighbour(), 0]
        count = self.current if self.probing is None else self.probing[0]
        self.last, self.n_steps = (count, now, work), self.n_steps + 1
        with self._on(count):
            yield

    def _settle(self, now):
        """Record the last step's time per unit of work, up to this step's start (what a count
        costs between the steps counts: OpenMP's threads spinning on after a step), and judge
        a neighbouring count tried on it."""
        if self.last is None:
            return
        count, start, work = self.last
        cost = (now - start) / max(work, 1)
        if self.probing is None:
            if self.n_steps > 1:  # the first step pays one-off costs (allocations, caches)
                self.cost[count] = cost
            return
        self.probing[1] += 1
        current = self.cost.get(self.current, math.inf)
        if cost <= _SWITCH_SHARE * current:
            self.current, self.interval = count, _PROBE_INTERVAL
        elif self.probing[1] < 2 and cost <= _CONFIRM_SHARE * current:
            return  # once more
        else:
            self.interval *= 2
        self.cost[count], self.probing = cost, None
        self.next_probe = self.n_steps + self.interval
