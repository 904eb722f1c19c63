"""Query blocks shared out to single-threaded workers on the CPU (torch only).

torch parallelises each CPU op over its OpenMP pool, so a blockwise loop is thousands of short
parallel regions, each ending at a barrier where every thread waits for the slowest. On a busy
machine one of them is often descheduled and the others spin: with one competing process the
k-NN predict took twice the time of scikit-learn's, which runs one parallel loop over chunks
with single-threaded BLAS. :func:`map_blocks` does the same: whole query blocks go to
``torch.get_num_threads()`` worker threads, each running its ops on one thread (no barriers), the
next block to whichever worker is free (a slow worker delays only its own blocks). Results come
back in block order and each block is computed as the serial loop computes it, so the output
does not depend on the number of workers.
"""

import contextlib
import copy
import ctypes
import dataclasses
import functools
import pathlib
import queue
import threading

import torch

from ._budget import ROW_MULTIPLE

# Multiply-adds below which a call runs on one thread (about a millisecond of one core).
_SMALL_CALL_WORK = 1 << 22
# Multiply-adds of a training step's attention below which the whole training loop runs on one
# thread: a step is dozens of small kernels (the map, its backward, the optimizer), each a
# parallel region whose barrier waits for a descheduled thread on a busy machine.
SMALL_STEP_WORK = 1 << 26
# Blocks handed out ahead of the one being consumed, per worker: keeps every worker busy while
# bounding the finished results held at once.
_AHEAD_PER_WORKER = 2


def small_calls_single_threaded(spec):
    """Run a small CPU call (a few queries: a web service's single row) on the calling thread's
    one core: its kernels are too short for a parallel region to pay, and on a busy machine every
    region waits for a descheduled thread (docs/performance.md, "Engine design notes"). The
    caller's thread count is restored afterwards."""
    width = spec.keys.dim + (spec.values.shape[1] if spec.values is not None else 0)
    return small_work_single_threaded(spec.n_queries * spec.n_keys * width, spec.device)


@contextlib.contextmanager
def small_work_single_threaded(work, device, limit=_SMALL_CALL_WORK):
    """:func:`small_calls_single_threaded` of a call of ``work`` multiply-adds on ``device``
    (small: below ``limit``)."""
    if device.type != "cpu" or torch.get_num_threads() < 2 or not work < limit:
        yield
        return
    with one_thread():
        yield


def rows_single_threaded(prepared, n_rows, n_values):
    """:func:`small_work_single_threaded` of ``n_rows`` queries over ``prepared`` keys
    (``PreparedKeys``) with ``n_values`` values: a caller that maps a few rows before their
    attention (an estimator's learned map) enters it once around both."""
    return small_work_single_threaded(n_rows * prepared.n_keys * (prepared.dim + n_values),
                                      prepared.raw.device)


@contextlib.contextmanager
def one_thread():
    """torch's CPU kernels on one thread in the calling thread only (:func:`cpu_threads`, of
    torch's OpenMP runtime alone: another library's copy, such as scikit-learn's, runs none of
    these kernels, and each runtime costs three library calls a small call)."""
    with _openmp_threads(1, torch_only=True), _mkl_threads(1):
        yield


@contextlib.contextmanager
def cpu_threads(n):
    """torch's CPU kernels on ``n`` threads in the calling thread only.

    Not ``torch.set_num_threads``: it also sets the count that threads started later take,
    which other threads fitting at the same moment (joblib's threading backend) would pick up.
    The OpenMP setting of this thread alone is changed through threadpoolctl (a dependency of
    scikit-learn), and MKL's thread-local count, which outranks OpenMP's and which a thread
    torch did not set up starts without (MKL then takes every core): on CPUs where MKL splits a
    product's inner dimension over threads (docs/performance.md, "Batch independence"), a
    block computed on two threads rounds differently from the same rows on one. Without either
    library, nothing is changed there.
    """
    with _openmp_threads(n), _mkl_threads(n):
        yield


# The counts this thread's enclosing contexts set (``omp``, ``mkl``): a nested context asking
# for the same count changes nothing and makes no library call (a single-row predict entered
# three, each slow when its code is out of the cache).
_pinned = threading.local()


@contextlib.contextmanager
def _openmp_threads(n, torch_only=False):
    """The calling thread's OpenMP count of every OpenMP runtime loaded (``torch_only``:
    torch's) set to ``n``, restored afterwards (``omp_set_num_threads`` is per thread). The
    runtimes are found once through threadpoolctl and called directly: its ``limit`` costs a
    noticeable part of a single-row predict."""
    scopes = ("omp_torch",) if torch_only else ("omp_torch", "omp_all")
    enclosing = [getattr(_pinned, scope, None) for scope in scopes]
    if all(count == n for count in enclosing):
        yield
        return
    _thread_counts_set_up()
    runtimes = _openmp_runtimes()
    if runtimes is None:  # threadpoolctl without its libraries' handles: its own limit
        with _openmp_controller().limit(limits=n):
            yield
        return
    if torch_only:
        runtimes = tuple(r for r in runtimes if r[2]) or runtimes
    before = [get() for get, _, _ in runtimes]
    for _, set_threads, _ in runtimes:
        set_threads(n)
    for scope in scopes:
        setattr(_pinned, scope, n)
    try:
        yield
    finally:
        for (_, set_threads, _), count in zip(runtimes, before, strict=True):
            set_threads(count)
        for scope, count in zip(scopes, enclosing, strict=True):
            setattr(_pinned, scope, count)


@functools.cache
def _openmp_runtimes():
    """``(omp_get_max_threads, omp_set_num_threads, torchs)`` of each OpenMP runtime
    threadpoolctl finds (torch's, and scikit-learn's own copy), ``torchs`` whether the library
    lies in torch's folder; none without threadpoolctl; ``None`` where its controllers do not
    expose their library handles (``dynlib``, threadpoolctl 3's)."""
    controller = _openmp_controller()
    torch_dir = pathlib.Path(torch.__file__).resolve().parent
    runtimes = []
    try:
        for library in [] if controller is None else controller.lib_controllers:
            dynlib = library.dynlib
            get, set_threads = dynlib.omp_get_max_threads, dynlib.omp_set_num_threads
            get.argtypes, get.restype = [], ctypes.c_int
            set_threads.argtypes, set_threads.restype = [ctypes.c_int], None
            torchs = torch_dir in pathlib.Path(library.filepath).resolve().parents
            runtimes.append((get, set_threads, torchs))
    except AttributeError:
        return None
    return tuple(runtimes)


@contextlib.contextmanager
def _mkl_threads(n):
    """MKL's thread-local count set to ``n`` in the calling thread, restored afterwards."""
    enclosing = getattr(_pinned, "mkl", None)
    set_mkl_local = _mkl_set_num_threads_local()
    if set_mkl_local is None or enclosing == n:
        yield
        return
    _thread_counts_set_up()
    before = set_mkl_local(n)
    _pinned.mkl = n
    try:
        yield
    finally:
        set_mkl_local(before)
        _pinned.mkl = enclosing


def _thread_counts_set_up():
    """torch's thread counts of the calling thread set up before a context changes them: torch
    sets a thread's OpenMP count at its first parallel kernel, to MKL's count of the moment, so
    a thread whose first kernel ran inside ``_mkl_threads(1)`` (a single row's map) stayed on
    one thread for good."""
    torch.get_num_threads()


@functools.cache
def _openmp_controller():
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    torch.get_num_threads()  # torch's OpenMP runtime loaded and this thread's count set up
    return ThreadpoolController().select(user_api="openmp")


@functools.cache
def _mkl_set_num_threads_local():
    """MKL's ``mkl_set_num_threads_local`` from the library torch links it into, or None (no
    MKL, or not exported). Its C entry is ``MKL_Set_Num_Threads_Local`` (an int by value; the
    lower-case names are the Fortran one, by pointer); it returns the thread's previous setting,
    0 for none (MKL's process-wide count)."""
    if not torch.backends.mkl.is_available():
        return None
    lib_dir = pathlib.Path(torch.__file__).parent / "lib"
    for path in sorted(lib_dir.glob("*torch_cpu.*")):
        try:
            fn = ctypes.CDLL(str(path)).MKL_Set_Num_Threads_Local
        except (OSError, AttributeError):
            continue
        fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
        return fn
    return None


_step = threading.local()


@contextlib.contextmanager
def chunk_workers(n):
    """Within, :func:`map_chunk_groups` (a training step's attention) shares its groups of row
    chunks out to ``n`` single-threaded workers; everything else runs on the calling thread's
    one core (:func:`one_thread`): a step of the tabular recipe is a few hundred kernels
    whose parallel regions each waited for a descheduled thread on a busy machine."""
    before = getattr(_step, "workers", None)
    _step.workers = max(1, int(n))
    try:
        with one_thread():
            yield
    finally:
        _step.workers = before


def map_chunk_groups(fn, n_groups):
    """``[fn(g) for g in range(n_groups)]``: within :func:`chunk_workers`, on its workers,
    each group on one thread (the results do not depend on the number of workers; within
    :func:`kept_workers`, the same threads from call to call); elsewhere (a differentiated
    ``attention`` call) in the calling thread on its threads."""
    workers = min(getattr(_step, "workers", None) or 1, n_groups)
    if workers < 2:  # (within chunk_workers, the calling thread is on one thread already)
        return [fn(g) for g in range(n_groups)]
    pools = getattr(_kept, "pools", None)
    if pools is None:
        return list(map_blocks(fn, range(n_groups), workers))
    pool = pools.get(workers) or _started_workers(workers)
    if pool is None:
        return [fn(g) for g in range(n_groups)]
    pools[workers] = pool
    for g in range(n_groups):
        pool.submit(g, fn, g)
    outcomes = [pool.outcome(g) for g in range(n_groups)]  # every one: none left behind
    for ok, value in outcomes:
        if not ok:
            raise value
    return [value for _, value in outcomes]


_kept = threading.local()


@contextlib.contextmanager
def kept_workers():
    """Within (a training loop), :func:`map_chunk_groups` called in this thread keeps its
    worker threads from call to call instead of starting and joining them in each (two calls a
    step); they are closed on leaving (the outermost context)."""
    if getattr(_kept, "pools", None) is not None:
        yield
        return
    _kept.pools = {}
    try:
        yield
    finally:
        pools, _kept.pools = _kept.pools, None
        for pool in pools.values():
            pool.close()


def n_workers(spec):
    """How many workers a loop of query blocks may use: the caller's torch thread count
    (``threadpoolctl`` / ``torch.set_num_threads``) on the CPU, without autograd; else 1."""
    if spec.device.type != "cpu" or spec.grad:
        return 1
    return max(1, torch.get_num_threads())


def parallel_plan(spec, n_q, n_k, bq, bk, plan):
    """``(workers, bq, bk)``: ``bq, bk`` are the serial plan, ``plan`` the other
    :func:`plan_blocks` arguments.

    The key blocks stay the serial plan's: their width decides how a dense row's sums are
    grouped, and a query's output must depend neither on its batch nor on the number of
    workers. The blocks in flight share the budget through their rows (one worker when a
    share cannot hold a row of a key block). Fewer query blocks than workers are cut into one
    block per worker (rows a multiple of the padding's, ``padded_rows``), not computed as one
    block on several threads: a product's rounding can depend on its thread count (MKL splits
    a long inner dimension over threads)."""
    workers = n_workers(spec)
    if workers < 2 or n_q <= ROW_MULTIPLE:
        return 1, bq, bk
    rows_share = (spec.budget // workers) // (bk * plan["pair_bytes"] + plan.get("row_bytes", 0))
    if rows_share < 1:
        return 1, bq, bk
    per_worker = -(-n_q // workers)
    bq_share = max(1, min(bq, rows_share, per_worker + -per_worker % ROW_MULTIPLE))
    # As many blocks for every worker: no worker left computing a last block alone while the
    # others wait (docs/performance.md, "Under load").
    n_blocks = -(-n_q // bq_share)
    n_blocks += -n_blocks % workers
    per_block = -(-n_q // n_blocks)
    bq_share = min(bq_share, per_block + -per_block % ROW_MULTIPLE)
    return min(workers, -(-n_q // bq_share)), bq_share, bk


def block_spec(spec):
    """The spec one block is computed with: the radius keeps per-block state, so each block
    gets its own copy (everything else is read only)."""
    if spec.radius is None:
        return spec
    return dataclasses.replace(spec, radius=copy.copy(spec.radius))


def map_blocks(fn, starts, workers, grad=False):
    """``fn(start)`` for each block start, yielded in order; computed by ``workers``
    single-threaded worker threads (``workers == 1``, or where no thread can be started: in
    the calling thread, lazily).

    In the calling thread, MKL's products run on one thread too, as in the workers, unless
    ``grad`` (training, whose outputs need not be batch-independent, keeps OpenMP's count):
    MKL may split a product's inner dimension over threads and round it differently, so a
    query computed here (a call of a few queries, or a budget too small to share) would not
    equal the same query computed among others by the workers. Elementwise kernels keep the
    caller's OpenMP threads."""
    starts = list(starts)
    pool = _started_workers(workers) if workers >= 2 else None
    if pool is None:
        for start in starts:
            with _mkl_threads(torch.get_num_threads() if grad else 1):
                result = fn(start)
            yield result
        return
    try:
        handed = 0
        for i in range(len(starts)):
            while handed < min(len(starts), i + workers * _AHEAD_PER_WORKER):
                pool.submit(handed, fn, starts[handed])
                handed += 1
            yield pool.result(i)
    finally:
        pool.close()


def _started_workers(workers):
    """A pool of ``workers`` threads, or ``None`` where the system cannot start them (a thread
    or address-space limit, ``ulimit -u`` or ``-v``: each thread's stack takes address space):
    the caller then runs the tasks itself, in order, with the same results (a task's result
    does not depend on the thread that runs it)."""
    pool = _Workers()
    try:
        for i in range(workers):
            thread = threading.Thread(target=pool._work, name=f"skattention-{i}", daemon=True)
            thread.start()
            pool.threads.append(thread)
    except RuntimeError:  # "can't start new thread"
        pool.close()
        return None
    return pool


class _Workers:
    """Threads that run the tasks submitted, ``fn(arg)``, on one torch thread each, results by
    task number (started by :func:`_started_workers`)."""

    def __init__(self):
        self.tasks, self.results = queue.SimpleQueue(), {}
        self.done = threading.Condition()
        self.threads = []

    def submit(self, number, fn, arg):
        self.tasks.put((number, fn, arg))

    def _work(self):
        torch.get_num_threads()  # torch sets up a thread's count lazily: before the limit
        with one_thread():
            while (task := self.tasks.get()) is not None:
                number, fn, arg = task
                try:
                    with torch.no_grad():
                        outcome = (True, fn(arg))
                except BaseException as exc:  # re-raised in the caller
                    outcome = (False, exc)
                with self.done:
                    self.results[number] = outcome
                    self.done.notify_all()

    def outcome(self, number):
        """``(ok, value)`` of task ``number`` once done: its result, or the error it raised."""
        with self.done:
            self.done.wait_for(lambda: number in self.results)
            return self.results.pop(number)

    def result(self, number):
        ok, value = self.outcome(number)
        if not ok:
            raise value
        return value

    def close(self):
        for _ in self.threads:
            self.tasks.put(None)
        for thread in self.threads:
            thread.join()
