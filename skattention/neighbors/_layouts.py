"""The tabular encoder's row blocks as the one float matrix the engine and the maps take:
one-hot categories (``DenseLayout``, the metrics that take numbers) or category codes
(``CodesLayout``, the tabular map, which looks the codes up in its embeddings)."""

import numpy as np
from scipy import sparse

from ._levels import _FIRST_LEVEL, MISSING_CODE


class DenseLayout:
    """The encoder's blocks as one dense float matrix, for estimators that take numbers only.

    Columns: the numeric block (numbers and missing indicators), then for each categorical
    column one 0/1 column per training level and, where the column had missing values at fit
    time, one for "missing". A level unseen at fit time (or grouped as rare) has no column: its
    row is all zeros there, at the same distance from every training level.
    """

    def __init__(self, encoder):
        self.n_numeric = encoder.n_numeric_out_
        self.lookup = []  # per categorical column: code -> output column, -1 for none
        width = self.n_numeric
        for cardinality, has_missing in zip(encoder.cardinalities_,
                                            encoder.categories_missing_, strict=True):
            columns = np.full(cardinality, -1, dtype=np.int64)
            levels = np.arange(_FIRST_LEVEL, cardinality)
            kept = np.concatenate([[MISSING_CODE], levels]) if has_missing else levels
            columns[kept] = width + np.arange(kept.size)
            width += kept.size
            self.lookup.append(columns)
        self.width = width

    def linear_features(self, X, max_width):
        """Features of a linear model of the rows ``X`` (this layout's output): the numeric
        block and the 0/1 columns of the categorical columns :func:`_narrowest_first` keeps
        within ``max_width`` columns in all."""
        kept = _narrowest_first([np.count_nonzero(c >= 0) for c in self.lookup],
                                max_width - self.n_numeric)
        columns = [np.arange(self.n_numeric)]
        columns += [np.sort(self.lookup[k][self.lookup[k] >= 0]) for k in kept]
        return X[:, np.concatenate(columns)]

    def dense(self, block, dtype):
        """``(len(block), width)`` array of ``dtype``."""
        out = np.zeros((len(block), self.width), dtype=dtype)
        out[:, : self.n_numeric] = block.numeric
        for k, columns in enumerate(self.lookup):
            target = columns[block.categories[:, k]]
            rows = np.flatnonzero(target >= 0)
            out[rows, target[rows]] = 1
        return out


class CodesLayout:
    """The encoder's blocks as one float matrix for the tabular map (``metric="tabular"``):
    the numeric block, then each categorical column's integer code (0 missing, 1 unseen or
    rare, 2.. the training levels) as a float, which the map looks up in its embeddings."""

    def __init__(self, encoder):
        self.n_numeric = encoder.n_numeric_out_
        self.cardinalities = encoder.cardinalities_
        self.width = self.n_numeric + encoder.cardinalities_.size

    def dense(self, block, dtype):
        """``(len(block), width)`` array of ``dtype``."""
        if not block.categories.shape[1]:  # numbers only: one conversion, not three
            return block.numeric.astype(dtype)
        return np.hstack([block.numeric.astype(dtype, copy=False),
                          block.categories.astype(dtype)])

    def linear_features(self, X, max_width):
        """Features of a linear model of the rows ``X`` (this layout's output): the numeric
        block and one 0/1 column per code of the categorical columns :func:`_narrowest_first`
        keeps within ``max_width`` columns in all (sparse)."""
        numeric = sparse.csr_matrix(X[:, : self.n_numeric])
        kept = _narrowest_first(self.cardinalities, max_width - self.n_numeric)
        if not kept.size:
            return numeric
        cardinalities = self.cardinalities[kept]
        codes = X[:, self.n_numeric + kept].astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(cardinalities)[:-1]])
        rows = np.repeat(np.arange(X.shape[0]), codes.shape[1])
        one_hot = sparse.csr_matrix(
            (np.ones(codes.size), (rows, (codes + starts).ravel())),
            shape=(X.shape[0], int(cardinalities.sum())),
        )
        return sparse.hstack([numeric, one_hot], format="csr")

def _narrowest_first(widths, room):
    """Indices of the columns of ``widths`` that fit in ``room`` taken narrowest first (ties by
    position), in their original order: the widest categorical columns are the ones left out
    of a linear model's one-hot features (their levels are the map's embeddings anyway)."""
    widths = np.asarray(widths, dtype=np.int64)
    order = np.argsort(widths, kind="stable")
    fits = np.cumsum(widths[order]) <= room
    return np.sort(order[fits])
