"""A categorical column's codes among its fitted levels (``neighbors/_levels.py``)."""

import numpy as np
import pytest

from skattention.neighbors._levels import MISSING_CODE, OTHER_CODE, level_codes, level_counts


def _expected(values, levels):
    position = {level: i for i, level in enumerate(levels.tolist())}
    return np.array([MISSING_CODE if v is None or v != v
                     else OTHER_CODE if v not in position else position[v] + 2
                     for v in values.tolist()])


@pytest.mark.parametrize("values", [
    np.array(["b", "a", None, "zz", "b", "c", np.nan, "a", "", "a"] * 50, dtype=object),
    np.array(["b", "a", None, "zz", "c"] * 4, dtype=object),
    np.array([3.0, 1.0, np.nan, 7.5, 3.0, -2.0] * 40),
    np.array([10, 2, 2, 5, 11, 10] * 30),
])
def test_codes_of_levels_missing_and_unseen_values(values):
    present = values[[not (v is None or v != v) for v in values.tolist()]]
    levels, _ = level_counts(present[: len(present) // 2])  # some values left unseen
    codes = level_codes(values, levels)
    np.testing.assert_array_equal(codes, _expected(values, levels))
    assert codes.dtype == np.int64


def test_no_levels_and_every_value_missing():
    values = np.array(["x", None, "y"], dtype=object)
    np.testing.assert_array_equal(level_codes(values, np.array([], dtype=object)),
                                  [OTHER_CODE, MISSING_CODE, OTHER_CODE])
    np.testing.assert_array_equal(
        level_codes(np.array([None, np.nan], dtype=object), np.array(["a"], dtype=object)),
        [MISSING_CODE, MISSING_CODE])
