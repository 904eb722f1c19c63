"""Columns that never varied in the training rows (all missing, one number, one level), held
at their fitted encoding when rows are encoded later.

Such a column carries no information, and the map learned nothing from it: its weights keep
their initial values, which no gradient moved (every training row had the same input there).
A query whose value there differed from the training rows' (a feature filled in after
deployment, a new level) was moved by those untrained weights, by up to 0.7 in a probability.
Holding the column at what every training row had makes it move no distance, as
docs/tabular.md states.
"""

import numpy as np

from ._levels import MISSING_CODE, level_codes


class HeldColumns:
    """The numeric block's positions and the code columns to hold, with their values."""

    def __init__(self, numeric_positions, numeric_values, code_columns, codes):
        self.numeric_positions = np.asarray(numeric_positions, dtype=np.intp)
        self.numeric_values = np.asarray(numeric_values, dtype=np.float64)
        self.code_columns = np.asarray(code_columns, dtype=np.intp)
        self.codes = np.asarray(codes, dtype=np.int64)

    @classmethod
    def of_encoder(cls, encoder, numeric, categories):
        """The held columns of a fitted ``encoder``: ``numeric`` holds ``(k, value)`` for each
        numeric column ``k`` (its place among the numeric columns) whose training values were
        all ``value`` (NaN: all missing); ``categories`` ``(k, level)`` for each categorical
        column whose training values were all ``level`` (``None``: all missing)."""
        positions, values = [], []
        indicators = list(encoder._indicator_positions)
        n_numeric = encoder.numeric_columns_.size
        for k, value in numeric:
            positions.append(k)
            if np.isnan(value):  # the missing values' fill, and an indicator of 1
                values.append(encoder._centre[k] if encoder.numeric_scaling is None else 0.0)
                if k in indicators:
                    positions.append(n_numeric + indicators.index(k))
                    values.append(1.0)
            else:
                values.append(float(encoder._scale_column(k, np.array([value]))[0]))
        columns, codes = [], []
        for k, level in categories:
            columns.append(k)
            codes.append(MISSING_CODE if level is None
                         else int(level_codes(np.asarray([level]), encoder.categories_[k])[0]))
        return cls(positions, values, columns, codes)

    def hold(self, numeric, codes):
        """Write the held values into an encoded block's ``numeric`` and ``codes`` (in place)."""
        if self.numeric_positions.size:
            numeric[:, self.numeric_positions] = self.numeric_values.astype(numeric.dtype)
        if self.code_columns.size:
            codes[:, self.code_columns] = self.codes
