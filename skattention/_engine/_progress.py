"""Progress reporting for long loops: standard library only, tqdm when it is installed.

Everything goes to standard error, never to standard output. ``verbose=0`` (or ``False``)
reports nothing and does not import tqdm. ``verbose >= 1`` shows a tqdm bar; without tqdm
(an optional dependency: ``pip install tqdm`` or ``skattention[progress]``) it writes plain
lines instead, at most one per ``mininterval`` seconds plus the final state, after a one-time
note. Used by the engine (query blocks) and by the estimators (epochs, iterations, restarts).
"""

import sys
import time

# A loop that finishes within ``delay`` seconds shows nothing; bars redraw at most this often.
INNER_DELAY = 2.0
_MININTERVAL = 0.5
_FALLBACK_INTERVAL = 2.0
_note_shown = False


def _tqdm_class():
    """tqdm's bar (``tqdm.auto``: widgets in Jupyter) writing its messages to standard error
    (``tqdm.write`` defaults to stdout), or ``None`` when tqdm is not installed."""
    try:
        from tqdm import auto  # through the package: a missing tqdm is an ImportError
    except ImportError:
        return None

    class StderrTqdm(auto.tqdm):
        @classmethod
        def write(cls, s, file=None, end="\n", nolock=False):
            super().write(s, file=sys.stderr if file is None else file, end=end, nolock=nolock)

        def update(self, n=1):
            # tqdm's close() draws the final state of a bar that stays on screen; the update
            # reaching the total drew it too whenever it came later than the minimum interval
            # (AttentionKMeans' runs always do): logs and any output that does not interpret
            # carriage returns showed the last line twice. close() alone draws it.
            if self.leave and self.total is not None and self.n + n >= self.total:
                mininterval, self.mininterval = self.mininterval, float("inf")
                try:
                    return super().update(n)
                finally:
                    self.mininterval = mininterval
            return super().update(n)

    return StderrTqdm


def progress_bar(verbose, *, total=None, desc=None, unit="it", inner=False, mininterval=None):
    """A progress reporter with tqdm's ``update``, ``set_postfix``, ``write`` and ``close``.

    Parameters
    ----------
    verbose : int or bool
        ``0``/``False``: a reporter that does nothing.
    total : int, default=None
        Expected number of updates (``None``: a counter).
    desc : str, default=None
        Label of the bar.
    unit : str, default="it"
    inner : bool, default=False
        An inner loop: shown only once it has lasted ``INNER_DELAY`` seconds (short loops stay
        silent), and removed when done.
    mininterval : float, default=None
        Minimum seconds between redraws (or between fallback lines).
    """
    if not verbose:
        return _NullProgress()
    leave, delay = (False, INNER_DELAY) if inner else (True, 0.0)
    tqdm = _tqdm_class()
    if tqdm is None:
        _note_once()
        return _LineProgress(total, desc, unit, leave, delay, mininterval)
    try:
        return tqdm(
            total=total, desc=desc, unit=unit, leave=leave, delay=delay, file=sys.stderr,
            mininterval=_MININTERVAL if mininterval is None else mininterval, dynamic_ncols=True,
        )
    except TypeError:  # a tqdm older than 4.60 (no `delay`), installed without the extra
        return _LineProgress(total, desc, unit, leave, delay, mininterval)


def track(iterable, verbose, *, total=None, desc=None, unit="it", inner=True, min_total=2):
    """Iterate ``iterable`` with a progress bar when ``verbose`` and it has at least
    ``min_total`` items; else ``iterable`` itself. By default an inner loop (see
    :func:`progress_bar`)."""
    if not verbose:
        return iterable
    if total is None:
        try:
            total = len(iterable)
        except TypeError:
            total = None
    if total is not None and total < min_total:
        return iterable
    return _tracked(iterable, verbose, total, desc, unit, inner)


def _tracked(iterable, verbose, total, desc, unit, inner):
    with progress_bar(verbose, total=total, desc=desc, unit=unit, inner=inner) as bar:
        for item in iterable:
            yield item
            bar.update()


def write(message):
    """One line on standard error that does not break the progress bars on screen."""
    tqdm = _tqdm_class()
    if tqdm is None:
        sys.stderr.write(str(message).rstrip("\n") + "\n")
    else:
        tqdm.write(str(message).rstrip("\n"), file=sys.stderr)


def _note_once():
    global _note_shown
    if not _note_shown:
        _note_shown = True
        sys.stderr.write(
            "skattention: progress bars need tqdm (pip install tqdm, or skattention[progress]); "
            "writing progress lines instead.\n"
        )


class _NullProgress:
    """The reporter of ``verbose=0``: does nothing."""

    n = 0

    def update(self, n=1):
        pass

    def set_postfix(self, ordered_dict=None, refresh=True, **kwargs):
        pass

    def set_postfix_str(self, s="", refresh=True):
        pass

    def set_description(self, desc=None, refresh=True):
        pass

    def write(self, s):
        pass

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _LineProgress(_NullProgress):
    """tqdm's interface as plain lines on standard error (when tqdm is not installed)."""

    def __init__(self, total, desc, unit, leave, delay, mininterval):
        self.total, self.desc, self.unit, self.leave = total, desc, unit, leave
        self.n, self.postfix = 0, ""
        self.start = time.monotonic()
        self.delay = delay
        self.interval = _FALLBACK_INTERVAL if mininterval is None else mininterval
        self.last = None  # time of the last line
        self.closed = False

    def update(self, n=1):
        self.n += n
        now = time.monotonic()
        if now - self.start < self.delay:
            return
        if self.last is None or now - self.last >= self.interval:
            self._line(now)

    def set_postfix(self, ordered_dict=None, refresh=True, **kwargs):
        items = dict(ordered_dict or {}, **kwargs)
        self.postfix = ", ".join(f"{k}={_format(v)}" for k, v in items.items())

    def set_postfix_str(self, s="", refresh=True):
        self.postfix = str(s)

    def set_description(self, desc=None, refresh=True):
        self.desc = desc

    def write(self, s):
        sys.stderr.write(str(s).rstrip("\n") + "\n")

    def close(self):
        if self.closed:
            return
        self.closed = True
        now = time.monotonic()
        # The final state, unless nothing was shown (a short inner loop) or it is already shown
        # (its count and postfix: a postfix set after the last update is part of it).
        shown = self.last is not None
        if (
            (self.leave or shown)
            and now - self.start >= self.delay
            and (self.n, self.postfix) != getattr(self, "_last_shown", None)
        ):
            self._line(now)

    def _line(self, now):
        self.last, self._last_shown = now, (self.n, self.postfix)
        count = f"{self.n}/{self.total}" if self.total is not None else str(self.n)
        head = f"{self.desc}: " if self.desc else ""
        tail = f" ({self.postfix})" if self.postfix else ""
        sys.stderr.write(f"{head}{count} {self.unit}{tail} [{now - self.start:.1f}s]\n")


def _format(value):
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
