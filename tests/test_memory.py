"""The working-memory budget (skattention.config_context(working_memory=MiB)) on every code path.

Each path is run with a tiny budget (many small blocks or chunks) and must give the unbounded
result; inputs that cannot fit even in chunks raise MemoryError naming working_memory.
"""

import math
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from sklearn.datasets import make_blobs, make_classification, make_s_curve
from sklearn.exceptions import ConvergenceWarning

import skattention
from skattention import MetricAttentionClassifier, MetricAttentionRegressor, attention
from skattention.cluster import AttentionKMeans, AttentionMeanShift
from skattention.manifold import AttentionDiffusionEmbedding
from skattention.manifold._operator import per_point_bandwidth
from skattention.nn import IPN

TINY = 0.01  # MiB: a few hundred score entries per block


@pytest.fixture(scope="module")
def data():
    X, y = make_classification(400, 6, n_informative=4, random_state=0)
    return X.astype(np.float32), y


def test_default_budget_is_at_most_one_gigabyte():
    assert 0 < skattention.get_config()["working_memory"] * 2**20 <= 1e9


# ------------------------------------------------------------------------------ engine


def test_sdpa_path_falls_back_to_streaming_when_its_key_copies_do_not_fit():
    g = torch.Generator().manual_seed(0)
    K, Q, V = (torch.randn(n, 5, generator=g) for n in (500, 60, 500))
    prior = torch.randn(500, generator=g)
    ref = attention(Q, K, V, temperature=2.0, log_prior=prior, backend="sdpa")
    with skattention.config_context(working_memory=TINY):  # 500 keys x 8 x 2 x 4 bytes > TINY
        small = attention(Q, K, V, temperature=2.0, log_prior=prior)
        with pytest.raises(MemoryError, match="working_memory"):
            attention(Q, K, V, temperature=2.0, log_prior=prior, backend="sdpa")
    torch.testing.assert_close(small, ref, rtol=1e-4, atol=1e-5)
    # a budget that holds the key copies but few queries: several query blocks, same result
    blocked = attention(
        Q, K, V, temperature=2.0, log_prior=prior, backend="sdpa", working_memory=0.035
    )
    torch.testing.assert_close(blocked, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("Estimator", [MetricAttentionClassifier, MetricAttentionRegressor])
@pytest.mark.parametrize("n_neighbors", [None, 5])
def test_estimator_predict_is_unchanged_by_a_tiny_budget(data, Estimator, n_neighbors):
    X, y = data
    est = Estimator(n_neighbors=n_neighbors, temperature=1.0).fit(X[:300], y[:300])
    ref = est.predict(X[300:])
    with skattention.config_context(working_memory=TINY):
        small = est.predict(X[300:])
    np.testing.assert_allclose(small, ref, rtol=1e-5, atol=1e-6)


def test_impossible_budget_names_working_memory_and_n_neighbors(data):
    X, y = data
    est = MetricAttentionClassifier(n_neighbors=50, temperature=1.0).fit(X, y)
    with skattention.config_context(working_memory=1e-5):
        with pytest.raises(MemoryError, match=r"working_memory(.|\n)*n_neighbors"):
            est.predict(X[:5])


def test_a_need_just_above_the_budget_is_told_apart_from_it():
    # both rounded to "0.001 MiB", the message read as if the need fitted the budget
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 3))
    est = MetricAttentionClassifier("euclidean", n_neighbors=5, temperature=np.inf).fit(
        X, (X[:, 0] > 0).astype(int))
    with skattention.config_context(working_memory=0.001):
        with pytest.raises(MemoryError) as error:
            est.predict(X)
    need, budget = (int(n.replace(",", "")) for n in re.findall(r"\(([\d,]+) bytes\)",
                                                                str(error.value)))
    assert need > budget == math.floor(0.001 * 2**20)

# ------------------------------------------------------------------------------ attention weights


@pytest.mark.parametrize("metric", ["euclidean", "linear"])
@pytest.mark.parametrize("queries", [None, "X"])
def test_attention_weights_are_unchanged_by_a_tiny_budget(data, monkeypatch, metric, queries):
    X, y = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = MetricAttentionClassifier(metric, max_iter=3, random_state=0).fit(X[:300], y[:300])
    Q = None if queries is None else X  # (the training rows among others)
    ref = est.attention_weights(Q, n_weights=10)
    calls = []
    weights = type(est._keys).weights
    monkeypatch.setattr(type(est._keys), "weights",
                        lambda *a, **k: calls.append(1) or weights(*a, **k))
    with skattention.config_context(working_memory=TINY):
        small = est.attention_weights(Q, n_weights=10)
    assert len(calls) > 5  # many chunks, filled into one result
    for got, want in zip(small, ref, strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


_ATTENTION_WEIGHTS_UNDER_A_CAP = """
import resource
import numpy as np
from skattention import MetricAttentionClassifier, config_context
rng = np.random.default_rng(0)
X, Q = rng.standard_normal((2000, 4)), rng.standard_normal((8000, 4))
clf = MetricAttentionClassifier("euclidean", temperature=1.0).fit(X, np.arange(2000) % 3)
with config_context(working_memory=8):
    ref = clf.attention_weights(Q[:500], n_weights=1000)  # warm, and the first rows' result
    vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    cap = vm + 200 * 2**20  # a ulimit -v: the result (weights and indices) takes 122 MiB
    resource.setrlimit(resource.RLIMIT_AS,
                       (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    weights, indices = clf.attention_weights(Q, n_weights=1000)
np.testing.assert_array_equal(weights[:500], ref[0])
np.testing.assert_array_equal(indices[:500], ref[1])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_attention_weights_hold_their_result_once_under_an_address_space_limit():
    # The result is allocated whole and filled from the engine's outputs on row chunks: its
    # block outputs, their float64 copies and a concatenation of them were all alive at once.
    out = subprocess.run([sys.executable, "-c", _ATTENTION_WEIGHTS_UNDER_A_CAP],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]


_ATTENTION_OUTPUT_UNDER_A_CAP = """
import resource, sys
import numpy as np
from skattention import attention, config_context
rng = np.random.default_rng(0)
d, n_keys, n_queries = map(int, sys.argv[1:4])
kwargs = eval(sys.argv[4])
K = rng.standard_normal((n_keys, d)).astype(np.float32)
V = rng.standard_normal((n_keys, 1000)).astype(np.float32)
Q = rng.standard_normal((n_queries, d)).astype(np.float32)
with config_context(working_memory=1):
    ref = attention(Q[:300], K, V, **kwargs)  # warm (threads, caches), and the first rows
    vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    cap = vm + int(1.6 * n_queries * 1000 * 4) + 15 * 2**20  # the output and a margin
    resource.setrlimit(resource.RLIMIT_AS,
                       (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    out = attention(Q, K, V, **kwargs)
np.testing.assert_array_equal(out[:300], ref)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.parametrize("d, n_keys, n_queries, kwargs", [
    (16, 2000, 20000, "dict(temperature=1.0)"),
    (16, 2000, 20000, "dict(n_neighbors=5, temperature=float('inf'))"),
    (4, 10000, 8000, "dict(n_neighbors=5, temperature=float('inf'))"),  # over the key tree
])
def test_attention_holds_its_output_once_under_an_address_space_limit(d, n_keys, n_queries,
                                                                      kwargs):
    # Three copies were alive at once: torch.isfinite's temporaries of the whole output (and of
    # the values), the query blocks' outputs kept in a list and their concatenation; over the
    # key tree the gathered values of a chunk of queries were not counted in the budget.
    out = subprocess.run(
        [sys.executable, "-c", _ATTENTION_OUTPUT_UNDER_A_CAP, str(d), str(n_keys), str(n_queries),
         kwargs],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]


# ------------------------------------------------------------------------------ training


def test_training_chunks_a_batch_too_large_for_the_budget(data):
    X, y = data
    kw = dict(metric="mlp", max_iter=3, batch_size=128, random_state=0, early_stopping=False)
    ref = MetricAttentionClassifier(**kw).fit(X, y)
    with skattention.config_context(working_memory=0.3):  # about 50 rows per chunk
        small = MetricAttentionClassifier(**kw).fit(X, y)
    np.testing.assert_allclose(small.loss_curve_, ref.loss_curve_, rtol=1e-5)
    np.testing.assert_allclose(small.predict_proba(X), ref.predict_proba(X), atol=1e-4)


def test_auto_batch_size_is_sized_from_the_budget(data, monkeypatch):
    from skattention._engine import batch_rows

    X, y = data
    seen = []
    original = batch_rows

    def spy(*args, **kwargs):
        seen.append(original(*args, **kwargs))
        return seen[-1]

    import skattention.neighbors._learned as base

    monkeypatch.setattr(base, "batch_rows", spy)
    batches = []
    real_train = base.train_metric

    def train_spy(*args, **kwargs):
        batches.append(kwargs["batch_size"])
        return real_train(*args, **kwargs)

    monkeypatch.setattr(base, "train_metric", train_spy)
    MetricAttentionClassifier(
        metric="linear", max_iter=1, random_state=0, early_stopping=False
    ).fit(X, y)
    with skattention.config_context(working_memory=0.1):
        MetricAttentionClassifier(
            metric="linear", max_iter=1, random_state=0, early_stopping=False
        ).fit(X, y)
    assert batches[0] == min(len(X), 1024)  # the "auto" rule: 1,024, or all points when fewer
    assert batches[1] == seen[1] < batches[0]


def test_training_that_cannot_fit_one_row_is_clear(data):
    X, y = data
    with skattention.config_context(working_memory=1e-4):
        with pytest.raises(MemoryError, match=r"working_memory(.|\n)*sample_rate"):
            MetricAttentionClassifier(metric="linear", max_iter=1, temperature=1.0).fit(X, y)


# ------------------------------------------------------------------------------ diffusion


def test_dense_diffusion_arrays_beyond_available_memory_suggest_n_neighbors(monkeypatch):
    # The dense n x n operator is the algorithm's own array (as in SpectralEmbedding), checked
    # against the memory the system has; working_memory bounds the kernel blocks that fill it.
    X, _ = make_s_curve(400, random_state=0)  # dense operator: 400^2 x 8 bytes = 1.2 MiB
    ref = AttentionDiffusionEmbedding(n_neighbors=15, random_state=0).fit(X)
    monkeypatch.setattr("skattention.manifold._operator.available_memory", lambda: 2**20)
    with pytest.raises(
        MemoryError, match=r"1\.2 MiB for a dense 400 x 400 operator(.|\n)*n_neighbors"
    ):
        AttentionDiffusionEmbedding(n_neighbors=None, random_state=0).fit(X)
    with pytest.raises(MemoryError, match="eigen_solver='arpack'"):
        AttentionDiffusionEmbedding(n_neighbors=15, eigen_solver="dense", random_state=0).fit(X)
    small = AttentionDiffusionEmbedding(n_neighbors=15, random_state=0).fit(X)  # sparse path fits
    np.testing.assert_allclose(small.embedding_, ref.embedding_, rtol=1e-7, atol=1e-10)


_DIFFUSION_UNDER_A_CAP = """
import resource
from sklearn.datasets import make_s_curve
from skattention import config_context
from skattention.manifold import AttentionDiffusionEmbedding
X, _ = make_s_curve(6000, random_state=0)
with config_context(working_memory=4):
    AttentionDiffusionEmbedding(n_neighbors=15, random_state=0).fit(X[:300])  # warm
    vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    cap = vm + 150 * 2**20  # a ulimit -v: the dense 6000 x 6000 operator takes 275 MiB
    resource.setrlimit(resource.RLIMIT_AS,
                       (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    try:
        AttentionDiffusionEmbedding(n_neighbors=None, random_state=0).fit(X)
    except MemoryError as exc:
        print(exc)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_dense_diffusion_counts_an_address_space_limit_as_unavailable():
    # Under ulimit -v the allocations fail (torch's as a RuntimeError after the kernel blocks)
    # whatever MemAvailable says: the check before any work reads the limit too.
    out = subprocess.run([sys.executable, "-c", _DIFFUSION_UNDER_A_CAP], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "274.7 MiB for a dense 6000 x 6000 operator" in out.stdout, out.stdout


_AUTO_DIFFUSION_UNDER_A_CAP = """
import resource
import numpy as np
from sklearn.datasets import make_s_curve
from skattention import config_context
from skattention.manifold import AttentionDiffusionEmbedding, spectral_cluster_count
X, _ = make_s_curve(3000, random_state=0)  # dense operator: 68.7 MiB
with config_context(working_memory=4096):
    ref = AttentionDiffusionEmbedding(n_neighbors=15, random_state=0).fit(X)  # warm: threads
    vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    cap = vm + 150 * 2**20  # room for the operator, not for it and a whole-matrix kernel block
    resource.setrlimit(resource.RLIMIT_AS,
                       (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    auto = AttentionDiffusionEmbedding(random_state=0).fit(X)
    print(auto.n_neighbors_, np.array_equal(auto.embedding_, ref.embedding_))
    for fit in (lambda: AttentionDiffusionEmbedding(n_neighbors=None, random_state=0).fit(X),
                lambda: spectral_cluster_count(X, random_state=0)):
        try:
            fit()
        except MemoryError as exc:
            print(exc)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_auto_diffusion_counts_the_working_memory_against_an_address_space_limit():
    # A working memory larger than a ulimit -v leaves: the dense operator fits but the kernel
    # blocks that fill it do not. "auto" takes the k-NN graph; an explicit dense operator (and
    # spectral_cluster_count's) is refused before any work, suggesting less working memory.
    out = subprocess.run([sys.executable, "-c", _AUTO_DIFFUSION_UNDER_A_CAP],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "15 True", out.stdout
    for line, owner in zip(lines[1:], ["AttentionDiffusionEmbedding", "spectral_cluster_count"]):
        assert line.startswith(f"{owner} needs 68.7 MiB for a dense 3000 x 3000 operator "
                               "besides up to 274.7 MiB of working memory"), out.stdout
        assert "lower working_memory" in line, out.stdout
    assert len(lines) == 3, out.stdout


def test_dense_diffusion_operator_is_not_scratch():
    # A budget smaller than the n x n operator still fits it (default settings must not refuse
    # ordinary sizes): only the kernel blocks follow working_memory, and the result is the same.
    X, _ = make_s_curve(250, random_state=1)
    ref = AttentionDiffusionEmbedding(n_neighbors=None, random_state=0).fit(X)
    with skattention.config_context(working_memory=0.02):  # 250^2 x 8 bytes = 0.48 MiB
        small = AttentionDiffusionEmbedding(n_neighbors=None, random_state=0).fit(X)
    np.testing.assert_allclose(small.embedding_, ref.embedding_, rtol=1e-8, atol=1e-12)


def test_per_point_bandwidth_in_row_blocks():
    d2 = np.sort(np.random.default_rng(0).exponential(size=(300, 40)), axis=1)
    d2[:, 0] = 0.0
    ref = per_point_bandwidth(d2, 10.0)
    with skattention.config_context(working_memory=0.002):  # a couple of rows per block
        assert per_point_bandwidth(d2, 10.0) == ref


# ------------------------------------------------------------------------------ clustering


def test_kmeans_predict_paths_are_unchanged_by_a_tiny_budget():
    X, _ = make_blobs(2000, centers=4, random_state=0)
    km = AttentionKMeans(4, random_state=0, device="cpu").fit(X)
    ref = km.predict(X), km.transform(X), km.soft_assignments(X, temperature=1.0)
    with skattention.config_context(working_memory=TINY):
        small = km.predict(X), km.transform(X), km.soft_assignments(X, temperature=1.0)
        refit = AttentionKMeans(4, random_state=0, device="cpu").fit(X)
    np.testing.assert_array_equal(small[0], ref[0])
    np.testing.assert_allclose(small[1], ref[1], rtol=1e-10)
    np.testing.assert_allclose(small[2], ref[2], atol=1e-10)
    np.testing.assert_array_equal(refit.labels_, km.labels_)


def test_mean_shift_is_unchanged_by_a_tiny_budget():
    X, _ = make_blobs(300, centers=3, random_state=0)
    ref = AttentionMeanShift(bandwidth=1.5, device="cpu").fit(X)
    with skattention.config_context(working_memory=TINY):
        small = AttentionMeanShift(bandwidth=1.5, device="cpu").fit(X)
    np.testing.assert_allclose(small.cluster_centers_, ref.cluster_centers_, atol=1e-8)
    np.testing.assert_array_equal(small.labels_, ref.labels_)


# ------------------------------------------------------------------------------ nn


def test_ipn_context_chunks_follow_the_budget():
    torch.manual_seed(0)
    net = IPN(3, 2, width=6, num_heads=2).double()
    ctx, x = torch.randn(300, 3, dtype=torch.float64), torch.randn(40, 3, dtype=torch.float64)
    ref = net(x, context=ctx, chunk_size=1024)
    with skattention.config_context(working_memory=0.1):  # a few queries per chunk
        torch.testing.assert_close(net(x, context=ctx), ref, rtol=1e-12, atol=1e-12)
    with skattention.config_context(working_memory=1e-3):
        with pytest.raises(MemoryError, match="working_memory"):
            net(x, context=ctx)


def test_working_memory_default_from_environment():
    # Worker processes (joblib's loky, Dask) do not inherit set_config, but the environment.
    import subprocess
    import sys

    code = "import skattention; print(skattention.get_config()['working_memory'])"
    env = dict(os.environ, SKATTENTION_WORKING_MEMORY="64")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "64"
    env["SKATTENTION_WORKING_MEMORY"] = "lots"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert (
        out.returncode != 0
        and "SKATTENTION_WORKING_MEMORY must be a positive number of MiB" in out.stderr
    )


def test_working_memory_reaches_loky_workers_through_the_environment(monkeypatch):
    import joblib

    monkeypatch.setenv("SKATTENTION_WORKING_MEMORY", "48")
    # fresh workers: loky reuses workers started with an earlier environment otherwise
    joblib.externals.loky.get_reusable_executor().shutdown(wait=True)
    with joblib.parallel_config(backend="loky"):
        seen = joblib.Parallel(n_jobs=2)(joblib.delayed(_worker_working_memory)() for _ in range(2))
    joblib.externals.loky.get_reusable_executor().shutdown(wait=True)
    assert seen == [48, 48]


def _worker_working_memory():
    import skattention

    return skattention.get_config()["working_memory"]


# ------------------------------------------------------------------------------ configuration


@pytest.mark.parametrize("value", [True, False, 0, -1.0, float("inf"), float("nan"), "64", None])
def test_working_memory_is_validated_when_set(value):
    # None leaves the value unchanged; anything else but a positive finite number is rejected at
    # once, not by every later attention call
    before = skattention.get_config()["working_memory"]
    if value is None:
        skattention.set_config(working_memory=value)
    else:
        with pytest.raises(ValueError, match="working_memory must be a positive number"):
            skattention.set_config(working_memory=value)
        with pytest.raises(ValueError, match="working_memory must be a positive number"):
            with skattention.config_context(working_memory=value):
                pass
    assert skattention.get_config()["working_memory"] == before


@pytest.mark.parametrize("value", [np.float32(64), np.int64(64), 64, 0.5])
def test_working_memory_accepts_real_numbers(value):
    with skattention.config_context(working_memory=value):
        out = skattention.attention(np.ones((2, 1)), np.ones((3, 1)), np.ones(3))
    np.testing.assert_allclose(out, 1.0)


def _cgroup(tmp_path, monkeypatch, version, limit, usage=0, inactive=0, below="a/b"):
    """A cgroup ``version`` (2 or 1) mount under ``tmp_path`` whose group ``a`` has a memory
    ``limit``, this process's group ``below`` it (none of its own), read by the engine."""
    from skattention._engine import _available_memory as memory

    names = (("memory.max", "memory.current", "inactive_file", "") if version == 2 else
             ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file",
              "memory"))
    group = tmp_path / "mnt" / "a"
    (group / "b").mkdir(parents=True, exist_ok=True)
    (group / names[0]).write_text(f"{limit}\n")
    (group / names[1]).write_text(f"{usage}\n")
    (group / "memory.stat").write_text(f"anon 1\n{names[2]} {inactive}\nactive_file 5\n")
    line = "0::" if version == 2 else "4:memory:"
    (tmp_path / "cgroup").write_text(f"9:name=systemd:/\n{line}/{below}\n")
    monkeypatch.setattr(memory, "_CGROUPS", ((str(tmp_path / "mnt"), *names),))
    monkeypatch.setattr(memory, "_SELF_CGROUP", str(tmp_path / "cgroup"))
    return memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/meminfo")
@pytest.mark.parametrize("version", [2, 1])
def test_a_containers_memory_limit_counts_as_unavailable(tmp_path, monkeypatch, version):
    # Inside a container /proc/meminfo shows the host's memory: a dense operator the
    # container's limit cannot hold was attempted, and the kernel ended the process. The limit
    # is read from this process's group up to the mount point (a limit on an ancestor binds).
    memory = _cgroup(tmp_path, monkeypatch, version, 2**30, 700 * 2**20, 200 * 2**20)
    assert memory.available_memory() == 2**30 - 500 * 2**20  # inactive page cache reclaimable
    X, _ = make_s_curve(12_000, random_state=0)  # a 1,098.6 MiB dense operator
    with pytest.raises(MemoryError, match="only 524.0 MiB of memory is available"):
        AttentionDiffusionEmbedding(n_neighbors=None).fit(X)
    _cgroup(tmp_path, monkeypatch, version, 2**30, below="")  # the mount point's own group
    assert memory.available_memory() > 2**30
    unlimited = "max" if version == 2 else 9223372036854771712
    _cgroup(tmp_path, monkeypatch, version, unlimited, 1)
    assert memory.available_memory() > 500 * 2**20


@pytest.mark.parametrize("value", [np.int32(2048), np.int16(4), np.uint8(4), np.float16(4)])
def test_a_numpy_scalar_budget_is_that_many_mib(value):
    # np.int32(2048) MiB in bytes overflowed to a negative budget (every call then failed),
    # np.float16 and the small integers raised OverflowError, in later unrelated calls
    with skattention.config_context(working_memory=value):
        assert skattention.get_config()["working_memory"] == float(value)
        X = np.random.default_rng(0).normal(size=(50, 3))
        out = skattention.attention(X, X, X, temperature=1.0)
    np.testing.assert_allclose(out, skattention.attention(X, X, X, temperature=1.0))
