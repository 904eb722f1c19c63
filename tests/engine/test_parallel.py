"""Query blocks over single-threaded workers: the same results as the serial loop, the caller's
thread settings untouched, errors raised in the caller."""

import threading

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_limits

from skattention import attention, kneighbors
from skattention._engine import _parallel


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    # more queries than one CPU block holds (1,024 rows), integer coordinates: ties
    keys = rng.integers(0, 5, size=(1500, 4)).astype(np.float32)
    queries = rng.integers(0, 5, size=(2600, 4)).astype(np.float32)
    values = rng.normal(size=(1500, 3)).astype(np.float32)
    return queries, keys, values


CASES = [
    dict(temperature=1.5, backend="stream"),
    dict(temperature=1.5, backend="stream", radius=2.0, on_empty="zero"),
    dict(temperature=np.inf, backend="stream", return_weights=True, n_weights=4),
    dict(temperature=np.inf, n_neighbors=5),
    dict(temperature=1.0, n_neighbors=9, radius=1.5, on_empty="zero", return_weights=True),
    dict(temperature=0.0),
    dict(temperature=1.0, n_neighbors=3, log_prior=np.log(np.arange(1, 1501, dtype=float))),
]


@pytest.fixture
def pools(monkeypatch):
    """The worker pools started, as a list of their sizes."""
    started = []
    original = _parallel._started_workers

    def counting(workers):
        started.append(workers)
        return original(workers)

    monkeypatch.setattr(_parallel, "_started_workers", counting)
    return started


@pytest.mark.parametrize("kwargs", CASES)
def test_workers_give_the_serial_result(two_threads, pools, data, kwargs):
    queries, keys, values = data
    parallel = attention(queries, keys, values, device="cpu", **kwargs)
    assert pools == [2]
    with threadpool_limits(limits=1):
        serial = attention(queries, keys, values, device="cpu", **kwargs)
    assert pools == [2]  # one thread: the serial loop
    if not isinstance(parallel, tuple):
        parallel, serial = (parallel,), (serial,)
    for a, b in zip(parallel, serial, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kwargs", CASES[::3])
def test_threads_that_cannot_start_leave_the_work_to_the_caller(two_threads, data, kwargs,
                                                                  monkeypatch):
    # under a thread or address-space limit (ulimit -u / -v: a thread's stack takes address
    # space) threading raises "can't start new thread": the call failed with it
    queries, keys, values = data
    parallel = attention(queries, keys, values, device="cpu", **kwargs)
    started = []

    def refuse(thread):
        started.append(thread.name)
        if len(started) > 1:  # the second of two: the first must be stopped again
            raise RuntimeError("can't start new thread")
        original(thread)

    original = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", refuse)
    caller = attention(queries, keys, values, device="cpu", **kwargs)
    assert started and not [t for t in threading.enumerate() if t.name in started]
    if not isinstance(parallel, tuple):
        parallel, caller = (parallel,), (caller,)
    for a, b in zip(parallel, caller, strict=True):
        np.testing.assert_array_equal(a, b)


def test_kneighbors_with_workers_equals_serial(two_threads, data):
    queries, keys, _ = data
    parallel = kneighbors(queries, keys, 7, exclude_self=False, device="cpu")
    with threadpool_limits(limits=1):
        serial = kneighbors(queries, keys, 7, device="cpu")
    for a, b in zip(parallel, serial, strict=True):
        np.testing.assert_array_equal(a, b)


def test_thread_settings_are_left_as_found(two_threads, data):
    queries, keys, values = data
    attention(queries, keys, values, n_neighbors=5, device="cpu")
    assert torch.get_num_threads() == 2
    seen = []
    fresh = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    fresh.start()
    fresh.join()
    assert seen == [2]  # a thread started afterwards has the usual default


def test_errors_in_workers_reach_the_caller(two_threads, data):
    queries, keys, values = data
    far = queries.copy()
    far[-1] += 100.0  # only the last block has a query with no key within the radius
    with pytest.raises(ValueError, match="no key|radius"):
        attention(far, keys, values, radius=3.0, temperature=1.0, device="cpu")
    with pytest.raises(ValueError, match="no key|radius"):
        attention(far, keys, values, radius=3.0, n_neighbors=4, device="cpu")


def test_autograd_stays_in_the_calling_thread(two_threads, data):
    queries, keys, values = data
    q = torch.as_tensor(queries[:1100], dtype=torch.float64).requires_grad_()
    out = attention(q, torch.as_tensor(keys, dtype=torch.float64), values, temperature=2.0,
                    backend="stream", device="cpu")
    out.sum().backward()
    assert q.grad is not None and bool(torch.isfinite(q.grad).all())


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=1.5),  # the SDPA path
        dict(temperature=1.5, backend="stream"),
        dict(temperature=1.5, metric="euclidean"),  # whole-row key blocks, non-squared
        dict(temperature=1.0, n_neighbors=5),
        dict(temperature=2.0, radius=2.5, on_empty="zero"),
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_outputs_do_not_depend_on_the_batch(two_threads, data, kwargs, dtype):
    """One query alone (one thread, the small-call policy), in a small batch and among 2,600
    (several blocks over workers): bit-identical outputs."""
    queries, keys, values = data
    whole = attention(queries, keys, values, device="cpu", dtype=dtype, **kwargs)
    for i in [0, 1, 2, 3, 5, 1023, 1024, 1025, 2599, *range(7, 2600, 331)]:
        alone = attention(queries[i : i + 1], keys, values, device="cpu", dtype=dtype, **kwargs)
        np.testing.assert_array_equal(alone[0], whole[i])
    few = attention(queries[1020:1030], keys, values, device="cpu", dtype=dtype, **kwargs)
    np.testing.assert_array_equal(few, whole[1020:1030])


@pytest.mark.parametrize("n_keys", [1500, 20_000])  # one key block; several
@pytest.mark.parametrize("metric", ["sqeuclidean", "dot"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_streamed_logits_of_real_numbers_do_not_depend_on_the_batch(two_threads, n_keys,
                                                                    metric, dtype):
    # Integer coordinates multiply exactly whatever the product's kernel; real ones do not:
    # a logit block scaled by addmm's alpha rounded a row among 4 to 100 rows otherwise than
    # among 1,000 (found on the float64 dense benchmark).
    rng = np.random.default_rng(1)
    keys, values = rng.normal(size=(n_keys, 8)), rng.normal(size=(n_keys, 3))
    queries = rng.normal(size=(1000, 8))
    kw = dict(temperature=0.37, metric=metric, backend="stream", device="cpu", dtype=dtype)
    whole = attention(queries, keys, values, **kw)
    for i in [0, 1, 999]:
        np.testing.assert_array_equal(attention(queries[i : i + 1], keys, values, **kw)[0],
                                      whole[i])
    np.testing.assert_array_equal(attention(queries[3:40], keys, values, **kw), whole[3:40])


def test_cpu_threads_sets_mkl_for_the_calling_thread_and_restores_it():
    # A thread's MKL count is its own (torch.set_num_threads sets the calling thread's); a
    # worker thread starts with none and MKL's default (every core), which OpenMP's limit does
    # not change: without the thread-local count a worker's products ran on several threads,
    # rounding differently from the same rows on one.
    set_local = _parallel._mkl_set_num_threads_local()
    if set_local is None:
        pytest.skip("torch without MKL")
    before = set_local(0)
    set_local(before)
    with _parallel.one_thread():
        assert set_local(1) == 1
        seen = []
        worker = threading.Thread(target=lambda: seen.append(set_local(0)))
        worker.start()
        worker.join()
        assert seen == [0]  # other threads keep their own
    assert set_local(before) == before


@pytest.mark.parametrize("working_memory", [0.1, 0.25, 0.5])
def test_a_small_budget_does_not_make_outputs_depend_on_the_batch(two_threads, working_memory):
    # the key blocks are the serial plan's whatever the workers; a budget too small to share
    # computes in the calling thread with MKL on one thread, as the workers do (found in review)
    rng = np.random.default_rng(0)
    K, V, Q = rng.normal(size=(12000, 4)), rng.normal(size=(12000, 3)), rng.normal(size=(64, 4))
    kw = dict(temperature=1.5, backend="stream", dtype="float64", working_memory=working_memory)
    whole = attention(Q, K, V, **kw)
    for i in [0, 1, 5, 63]:
        np.testing.assert_array_equal(attention(Q[i : i + 1], K, V, **kw)[0], whole[i])
    np.testing.assert_array_equal(attention(Q[:10], K, V, **kw), whole[:10])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("dim", [20, 96, 128, 200])
def test_score_products_round_a_row_alike_in_any_block(dtype, dim):
    # The products take the keys transposed and contiguous: with torch's MKL the transposed
    # view of row-major keys rounded a row among 4 rows differently from among 1,024 from 96
    # dimensions in float32 (measured on a Xeon with AVX-512); the contiguous form did not.
    from skattention._engine._scores import PreparedKeys

    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(3000, dim, generator=gen, dtype=dtype)
    queries = torch.randn(1024, dim, generator=gen, dtype=dtype)
    prepared = PreparedKeys(keys, "sqeuclidean")
    prior = torch.randn(3000, generator=gen, dtype=dtype)
    # logits (scale and prior: one addmm) and partial scores (one product with the offsets
    # as one more row of the keys)
    for kwargs in (dict(scale=0.5, log_prior=prior), dict()):
        with _parallel.one_thread():
            whole = prepared.block(queries, 0, 3000, **kwargs)
            for rows in (4, 12, 64):
                parts = torch.cat([prepared.block(queries[i : i + rows], 0, 3000, **kwargs)
                                   for i in range(0, 1024, rows)])
                assert torch.equal(parts, whole[: parts.shape[0]])


def test_nested_thread_contexts_make_no_library_calls_and_restore_the_counts(monkeypatch):
    # a single-row call enters the single-thread context in the estimator, the engine and the
    # map: only the outermost changes the libraries' counts, and every count comes back
    runtimes = _parallel._openmp_runtimes()
    set_local = _parallel._mkl_set_num_threads_local()
    if not runtimes or set_local is None:
        pytest.skip("needs threadpoolctl's OpenMP handles and MKL")
    calls = []

    def counted(fn, name):
        def call(*args):
            calls.append(name)
            return fn(*args)
        return call

    monkeypatch.setattr(_parallel, "_openmp_runtimes", lambda: tuple(
        (counted(get, "get"), counted(set_threads, "set"), torchs)
        for get, set_threads, torchs in runtimes))
    monkeypatch.setattr(_parallel, "_mkl_set_num_threads_local",
                        lambda: counted(set_local, "mkl"))
    before = [get() for get, _, _ in runtimes]
    with _parallel.one_thread():
        outer = len(calls)
        assert outer > 0 and torch.get_num_threads() == 1
        with _parallel.one_thread(), _parallel._mkl_threads(1):
            assert len(calls) == outer
        with _parallel.cpu_threads(2):  # another count: set, then restored
            assert torch.get_num_threads() == 2
        assert torch.get_num_threads() == 1
        with _parallel._mkl_threads(1):
            assert set_local(1) == 1
    assert [get() for get, _, _ in runtimes] == before
    assert not any(getattr(_parallel._pinned, name, None) for name in ("omp_torch", "omp_all",
                                                                       "mkl"))


def test_one_thread_sets_torchs_openmp_runtime_only():
    # scikit-learn's own OpenMP runtime (its wheels bundle one) runs none of torch's kernels:
    # the engine's single-thread context leaves it alone; cpu_threads (n_jobs) sets every one
    runtimes = _parallel._openmp_runtimes()
    if not runtimes or not any(torchs for _, _, torchs in runtimes):
        pytest.skip("no OpenMP runtime found in torch's folder")
    with threadpool_limits(2, user_api="openmp"):
        with _parallel.one_thread():
            assert [get() for get, _, _ in runtimes] == [
                1 if torchs else 2 for _, _, torchs in runtimes]
        with _parallel.cpu_threads(1):
            assert [get() for get, _, _ in runtimes] == [1] * len(runtimes)
        assert [get() for get, _, _ in runtimes] == [2] * len(runtimes)


def test_cpu_threads_without_the_runtimes_handles_uses_threadpoolctl(monkeypatch):
    # threadpoolctl's controllers expose their libraries (dynlib) in version 3; without them
    # the count is set through threadpoolctl's own limit
    monkeypatch.setattr(_parallel, "_openmp_runtimes", lambda: None)
    before = torch.get_num_threads()
    with _parallel.cpu_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_a_training_loop_keeps_its_chunk_workers(pools):
    # within kept_workers the chunk groups of every call run on one pool's worker threads, in
    # order, an error reaches the caller and the pool serves the next call; outside, each call
    # starts its own pool
    import threading

    from skattention._engine._parallel import chunk_workers, kept_workers, map_chunk_groups

    def names(calls):
        seen = set()
        for _ in range(calls):
            with chunk_workers(2):
                out = map_chunk_groups(lambda g: (g, threading.get_ident()), 4)
            assert [g for g, _ in out] == [0, 1, 2, 3]
            seen |= {ident for _, ident in out}
        return seen

    def workers():  # the engine's worker threads (others, such as tqdm's monitor, come and go)
        return {t for t in threading.enumerate() if t.name.startswith("skattention-")}

    before = workers()
    with kept_workers():
        kept = names(5)
        # the pool's two threads (which of them took the groups is the scheduler's choice)
        pool_threads = {t.ident for t in workers() - before}
        assert pools == [2] and len(pool_threads) == 2 and kept <= pool_threads
        assert threading.get_ident() not in kept

        def fail(g):
            if g == 2:
                raise ValueError("group 2")
            return g

        with chunk_workers(2), pytest.raises(ValueError, match="group 2"):
            map_chunk_groups(fail, 4)
        assert names(1) <= pool_threads and pools == [2]  # the same threads after the error
    assert workers() == before  # closed on leaving
    names(3)
    assert pools == [2] * 4  # outside: a pool per call


def test_a_threads_first_kernel_inside_a_context_leaves_its_count_as_found():
    # torch sets a thread's OpenMP count at its first parallel kernel, from MKL's count of the
    # moment: a fresh thread (a process that unpickles a model and predicts one row) whose
    # first kernel ran inside the map's one-MKL-thread context stayed on one thread for good
    if _parallel._mkl_set_num_threads_local() is None:
        pytest.skip("torch without MKL")
    counts = {}

    def first_kernel_inside(context, name):
        with context:
            torch.ones(100_000).exp()  # (a parallel kernel)
        counts[name] = torch.get_num_threads()

    def untouched():
        counts["fresh"] = torch.get_num_threads()

    for target, args in ((first_kernel_inside, (_parallel._mkl_threads(1), "mkl")),
                         (first_kernel_inside, (_parallel.one_thread(), "one")),
                         (untouched, ())):
        worker = threading.Thread(target=target, args=args)
        worker.start()
        worker.join()
    if counts["fresh"] < 2:
        pytest.skip("one thread by default here")
    assert counts["mkl"] == counts["one"] == counts["fresh"]


def test_a_single_row_over_grouped_keys_runs_on_one_thread(monkeypatch):
    # a few rows' near and far scores are too short for a parallel region (on a busy machine
    # each one waits for a descheduled thread): the estimator maps and attends them on one
    from skattention._engine import _near_far, group_keys

    rng = np.random.default_rng(0)
    points = torch.as_tensor(rng.normal(size=(4000, 8)), dtype=torch.float32)
    values = torch.as_tensor(rng.normal(size=(4000, 2)), dtype=torch.float32)
    grouped = group_keys(points, values, torch.zeros(4000), points[:64], "sqeuclidean", 4)
    with _near_far.grouped_rows_single_threaded(grouped, 1):
        one = torch.get_num_threads()
    with _near_far.grouped_rows_single_threaded(grouped, 10_000):
        many = torch.get_num_threads()
    assert one == 1 and many == torch.get_num_threads()
