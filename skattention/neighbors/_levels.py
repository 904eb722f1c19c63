"""A categorical column's levels and their codes: 0 for a missing value, 1 for a level unseen
at fit (or coded as rare), 2, 3, ... for the levels (the tabular encoder's codes, which the
tabular map and the target statistics look up)."""

import numpy as np

from ._table import isna, pd

MISSING_CODE = 0
OTHER_CODE = 1
_FIRST_LEVEL = 2


def level_counts(present):
    """``np.unique(present, return_counts=True)`` of a column's present values; text sorted
    as its distinct values only (sorting every cell of an object array was slow)."""
    if present.dtype != object:
        return np.unique(present, return_counts=True)
    codes, distinct = pd.factorize(present)
    order = np.argsort(distinct)
    return distinct[order], np.bincount(codes, minlength=distinct.size)[order]


def as_numbers(values):
    """A categorical column's values (or levels) as float64, NaN where a value is missing or
    is no number: the strings ``"1"`` and ``"1.0"`` are the number 1."""
    numbers = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce")
    return numbers.to_numpy(dtype=np.float64, na_value=np.nan)


def level_codes(values, levels):
    """The codes of ``values`` among the sorted ``levels``; text of many cells looked up as its
    distinct values only (a binary search of every cell of an object array compares strings
    cell by cell; a few rows, a prediction's, are searched as they are)."""
    codes = np.full(values.shape[0], OTHER_CODE, dtype=np.int64)
    missing = isna(values)
    codes[missing] = MISSING_CODE
    if levels.size:
        present = ~missing
        cells = values[present]
        if cells.dtype == object and cells.shape[0] >= _FACTORIZED_CELLS:
            inverse, distinct = pd.factorize(cells)
            codes[present] = _codes_among(distinct, levels)[inverse]
        else:
            codes[present] = _codes_among(cells, levels)
    return codes


# text cells from which level_codes looks up their distinct values (pandas' factorize costs
# a few dozen microseconds a call)
_FACTORIZED_CELLS = 256


def _codes_among(values, levels):
    """The codes of present ``values`` among the sorted ``levels`` (``OTHER_CODE`` where not
    one of them)."""
    found = np.searchsorted(levels, values.astype(levels.dtype, copy=False))
    found = np.minimum(found, levels.size - 1)
    return np.where(levels[found] == values, found + _FIRST_LEVEL, OTHER_CODE)
