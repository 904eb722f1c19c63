"""Attention over shards of the keys, merged, equals one call over all keys."""

import numpy as np
import pytest

from skattention import attention, kneighbors
from skattention._engine import (
    finish_partial,
    merge_partials,
    partial_neighbors,
    selection_size,
    shard_attention,
    shard_lightest_weights,
)

BOUNDS = [0, 3, 130, 131, 300]  # shards of 3, 127, 1 and 169 keys


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 4, size=(300, 3)).astype(np.float64)
    keys[200:260] = keys[:60]  # duplicated rows in other shards: ties across shards
    queries = rng.integers(0, 4, size=(50, 3)).astype(np.float64)
    values = np.eye(3)[rng.integers(0, 3, 300)]
    weights = rng.choice([0.5, 1.0, 3.0], size=300)
    return queries, keys, values, weights


def sharded(queries, keys, values, log_prior=None, **kwargs):
    shards = list(zip(BOUNDS[:-1], BOUNDS[1:], strict=True))
    n_neighbors = kwargs.get("n_neighbors")
    lightest = None
    if log_prior is not None and n_neighbors is not None:
        lightest = [shard_lightest_weights(log_prior[a:b], n_neighbors) for a, b in shards]
    n_select = selection_size(n_neighbors, lightest) if (
        n_neighbors is not None or kwargs.get("temperature") == 0) else None
    parts = [
        shard_attention(
            queries, keys[a:b], values[a:b], key_offset=a, n_select=n_select,
            log_prior=None if log_prior is None else log_prior[a:b], **kwargs,
        )
        for a, b in shards
    ]
    # merged in a tree, in two orders: the merge is associative
    merged = merge_partials([merge_partials(parts[:2]), merge_partials(parts[2:])])
    other = merge_partials(parts[::-1])
    return merged, other


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=1.5),
        dict(temperature=np.inf),
        dict(temperature=0.7, radius=1.2),
        dict(temperature=0.0),
        dict(temperature=np.inf, n_neighbors=5),
        dict(temperature=1.0, n_neighbors=7),
        dict(temperature=1.0, n_neighbors=4, radius=1.5),
    ],
)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("metric", ["sqeuclidean", "euclidean"])
def test_merged_shards_equal_one_call(data, dtype, kwargs, weighted, metric):
    queries, keys, values, weights = data
    log_prior = np.log(weights) if weighted else None
    expected = attention(queries, keys, values, log_prior=log_prior, dtype=dtype,
                         on_empty="zero", metric=metric, **kwargs)
    merged, other = sharded(queries, keys, values, log_prior=log_prior, dtype=dtype,
                            metric=metric, **kwargs)
    for partial in (merged, other):
        got = finish_partial(partial, temperature=kwargs["temperature"],
                             n_neighbors=kwargs.get("n_neighbors"), on_empty="zero")
        votes = kwargs["temperature"] == np.inf and not weighted
        if "n_neighbors" in kwargs or kwargs["temperature"] == 0.0 or votes:
            # the same keys selected, the same arithmetic; unweighted votes add up exactly
            np.testing.assert_array_equal(got, expected)
        else:
            rtol = 1e-5 if dtype == "float32" else 1e-12
            if metric == "euclidean":
                # a square root amplifies the rounding of distances near 0 (duplicated rows,
                # centred differently in each shard): about sqrt(eps) ||q|| in the score
                rtol = 1e-3 if dtype == "float32" else 1e-8
            np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol)
        assert got.dtype == expected.dtype


def test_merged_selection_gives_kneighbors(data):
    queries, keys, values, _ = data
    merged, _ = sharded(queries, keys, values, temperature=1.0, n_neighbors=6,
                        dtype="float64")
    dist, idx = partial_neighbors(merged, 6)
    expected = kneighbors(queries, keys, 6, dtype="float64")
    np.testing.assert_array_equal(dist, expected[0])
    np.testing.assert_array_equal(idx, expected[1])


def test_empty_rows_after_the_merge(data):
    queries, keys, values, _ = data
    far = queries + 100.0
    merged, _ = sharded(far, keys, values, temperature=1.0, radius=1.0)
    with pytest.raises(ValueError, match="no unmasked key"):
        finish_partial(merged, temperature=1.0, radius=1.0)
    np.testing.assert_array_equal(
        finish_partial(merged, temperature=1.0, on_empty="zero"), np.zeros((50, 3))
    )


def test_merge_rejects_mixed_kinds(data):
    queries, keys, values, _ = data
    dense = shard_attention(queries, keys, values, temperature=1.0)
    knn = shard_attention(queries, keys, values, temperature=1.0, n_neighbors=3)
    with pytest.raises(ValueError, match="different kinds"):
        merge_partials([dense, knn])
    with pytest.raises(ValueError, match="at least one"):
        merge_partials([])
