"""The distinct rows of a table: which rows repeat (the settings for many rows pool them)."""

import numpy as np
import torch

# rows hashed and compared at once (a cache-sized block of a few columns)
_HASH_ROWS = 8192


def distinct_row_ids(X, max_share):
    """The distinct row of each row of ``X`` (a tensor), ``torch.unique(X, dim=0)``'s inverse
    (the rank of its row in lexicographic order), where at most ``max_share`` of the rows are
    distinct, else ``None``.

    The rows are told apart by a hash of their bits first, which is most of the answer in a few
    passes over the columns (``torch.unique`` compares the sorted rows one call per row, a
    noticeable part of a fit at scale); only the distinct rows are then sorted. A hash shared
    by different rows, NaN (never equal to itself), an empty shape or another dtype than
    float32 and float64 take ``torch.unique``.
    """
    n = X.shape[0]
    if X.dtype not in (torch.float32, torch.float64) or n == 0 or X.shape[1] == 0:
        return unique_row_ids(X, max_share)
    x = X.detach().cpu().numpy()
    if np.isnan(x).any():
        return unique_row_ids(X, max_share)
    x = np.ascontiguousarray(x + x.dtype.type(0))  # -0.0 -> 0.0: equal rows, equal bits
    _, first, inverse = np.unique(_row_hashes(x), return_index=True, return_inverse=True)
    if first.shape[0] > max_share * n:
        return None  # (a shared hash only merges rows: the rows are at least this distinct)
    inverse = inverse.reshape(-1)
    distinct = x[first]
    if not all(np.array_equal(distinct[inverse[start:start + _HASH_ROWS]],
                              x[start:start + _HASH_ROWS]) for start in range(0, n, _HASH_ROWS)):
        return unique_row_ids(X, max_share)
    order = np.lexsort(distinct.T[::-1])  # the first column the primary key
    rank = np.empty(first.shape[0], dtype=np.int64)
    rank[order] = np.arange(first.shape[0])
    return torch.from_numpy(rank[inverse]).to(X.device)


def _row_hashes(x):
    """A 64-bit hash of the bits of each row of the float32/float64 array ``x``: equal rows
    hash equal."""
    bits = x.view(np.uint32 if x.itemsize == 4 else np.uint64)
    hashed = np.zeros(x.shape[0], dtype=np.uint64)
    for start in range(0, x.shape[0], _HASH_ROWS):
        part = hashed[start:start + _HASH_ROWS]
        for column in bits[start:start + _HASH_ROWS].T:  # modulo 2^64
            part ^= column
            part *= np.uint64(0x9E3779B97F4A7C15)
            part ^= part >> np.uint64(29)  # the high bits mixed down (a product only moves up)
    return hashed


def unique_row_ids(X, max_share):
    """:func:`distinct_row_ids` by ``torch.unique`` alone."""
    distinct, inverse = torch.unique(X, dim=0, return_inverse=True)
    return inverse if distinct.shape[0] <= max_share * X.shape[0] else None
