"""Mixed-type tabular input: the encoder the metric-attention estimators call in fit and predict.

``_TabularEncoder`` turns what a user has -- a pandas DataFrame with numeric, boolean,
``category`` and string/object columns and missing values (NaN, ``pd.NA``, nullable dtypes), a
NumPy array, or a SciPy sparse CSR/CSC matrix -- into what the learned metric needs:

* ``numeric``: ``(n, n_numeric + n_indicators)`` floats of ``dtype``, each numeric column scaled
  (by default RealMLP's robust scaling: ``(x - median) / IQR`` smoothly clipped to about +-3;
  the tabular benchmark's DEV sets chose it over quantile-normal scaling; ``None``: unscaled)
  with missing values at the (scaled) median and, for every column that had missing values at
  fit time, a 0/1 missing indicator appended, then (after :meth:`fit_statistics`) the scaled
  target statistics of the categorical columns of many levels (``_target_statistics``);
* ``categories``: int64 ``(n, n_categorical)`` codes, 0 for a missing value, 1 for a level unseen
  at fit time or rarer than ``min_frequency`` ("other"), and 2, 3, ... for the training levels
  (``cardinalities_`` holds each column's number of codes), ready for an embedding lookup.

Sparse input is never densified whole: ``transform_blocks`` yields dense row blocks of a bounded
size (``transform`` is the one-block case for inputs that fit the memory budget).

What happens with awkward input (each a documented handling or a clear ``ValueError``):

* a column that never varied at fit (all NaN, one number, one level): a constant; for a learned
  map (``hold_constant``) the same constant whatever later rows hold;
* unseen categories or missing values at predict time: the "other" / missing codes, and the
  scaled median for numbers (no error);
* a sparse matrix with explicit NaN: missing values as above; implicit entries are zeros;
* datetimes (``datetime64``, time-zone aware, or an object column of ``datetime.date`` /
  ``datetime`` / ``pd.Timestamp``) and durations: numbers, seconds since the Unix epoch
  (naive times read as UTC) and seconds, NaT missing; such a column takes only times (or
  missing values) at predict time;
* a DataFrame whose columns differ from the fit (names, order): ``ValueError`` naming the
  column. A numeric column that arrives as strings of numbers is converted; one that holds text
  raises. A categorical column that changed between numbers and strings is read as its levels
  (``1``, ``1.0`` and ``"1"`` are one level); it raises where no level could match.
"""


import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from ._held_columns import HeldColumns
from ._levels import _FIRST_LEVEL, MISSING_CODE, OTHER_CODE, as_numbers, level_codes, level_counts
from ._scaling import column_scaling, scaled
from ._table import TIME_KINDS, Table, isna, pd, reject_infinity
from ._target_statistics import LevelStatistics


class _TabularEncoder(TransformerMixin, BaseEstimator):
    """Encode a mixed-type table into scaled numbers, missing indicators and category codes.

    Parameters
    ----------
    categorical_features : "from_dtype", array-like of bool, int or str, or None, \
            default="from_dtype"
        Which columns are categorical. ``"from_dtype"``: pandas ``category``, string and object
        columns (booleans are numbers 0/1; an object column of numbers alone is numeric, and
        so are datetimes and durations, as seconds, whatever their dtype). A
        boolean mask, column indices or (for DataFrames) column names select them explicitly;
        ``None``: every column is numeric.
    numeric_scaling : {"robust", "quantile", "standard"} or None, default="robust"
        ``"robust"``: ``(x - median) / IQR`` (half the range when the IQR is 0) smoothly clipped,
        ``z / sqrt(1 + (z / 3)^2)`` (RealMLP's preprocessing); ``"quantile"``: through the
        training quantiles to a standard normal (ModernNCA / TabR); ``"standard"``: mean and
        standard deviation; ``None``: the numbers as they are (missing values at the training
        median), which keeps a fixed metric's distances those of the input.
    missing_indicators : bool, default=True
        Append a 0/1 indicator for each numeric column with missing values at fit time.
    min_frequency : int, default=1
        Training levels seen fewer times share the "other" code with unseen levels.
    dtype : numpy float dtype, default=np.float32
        Dtype of the numeric block.
    hold_constant : bool, default=False
        Columns that never varied at fit keep their encoding (:class:`~._held_columns.HeldColumns`).

    Attributes
    ----------
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Present when ``X`` was a DataFrame with string column names.
    categorical_ : ndarray of bool of shape (n_features_in_,)
    numeric_columns_ : ndarray of int
        Input columns of the numeric block, in order.
    categorical_columns_ : ndarray of int
    indicator_columns_ : ndarray of int
        Numeric input columns that get a missing indicator.
    categories_ : list of ndarray
        Training levels of each categorical column (code ``2 + i`` for ``categories_[j][i]``).
    cardinalities_ : ndarray of int
        Number of codes of each categorical column (levels + missing + other).
    categories_missing_ : ndarray of bool
        Whether each categorical column had missing values at fit time.
    n_numeric_out_ : int
        Width of the numeric block (scaled columns, indicators and target statistics).
    statistic_columns_ : ndarray of int
        Positions (among the categorical columns) of the columns with target statistics, set
        by :meth:`fit_statistics` (none after :meth:`fit` alone).

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> from skattention.neighbors._tabular import _TabularEncoder
    >>> X = pd.DataFrame({"age": [30.0, np.nan, 50.0], "city": ["Oslo", "Rome", None]})
    >>> enc = _TabularEncoder().fit(X)
    >>> block = enc.transform(pd.DataFrame({"age": [40.0, 20.0], "city": ["Rome", "Paris"]}))
    >>> block.categories.ravel().tolist()  # Rome -> its level code, Paris (unseen) -> other
    [3, 1]
    >>> block.numeric.shape  # age scaled, plus its missing indicator
    (2, 2)
    """

    _statistics = None  # the fitted LevelStatistics, if any (also of encoders pickled before)

    def __init__(self, categorical_features="from_dtype", numeric_scaling="robust",
                 missing_indicators=True, min_frequency=1, dtype=np.float32,
                 hold_constant=False):
        self.hold_constant = hold_constant
        self.categorical_features = categorical_features
        self.numeric_scaling = numeric_scaling
        self.missing_indicators = missing_indicators
        self.min_frequency = min_frequency
        self.dtype = dtype

    # ------------------------------------------------------------------ fit

    def fit(self, X, y=None):
        """Learn column kinds, numeric scaling, indicators and category levels."""
        if self.numeric_scaling not in ("quantile", "robust", "standard", None):
            raise ValueError(
                f"numeric_scaling must be 'quantile', 'robust', 'standard' or None; "
                f"got {self.numeric_scaling!r}."
            )
        table = Table(X, self, reset=True)
        self.categorical_ = self._categorical_mask(table)
        if table.is_sparse and self.categorical_.any():
            raise ValueError("categorical_features cannot select columns of a sparse matrix; "
                             "pass a dense array or a DataFrame for categorical columns.")
        self.numeric_columns_ = np.flatnonzero(~self.categorical_)
        self.categorical_columns_ = np.flatnonzero(self.categorical_)
        self._numeric_kind = [table.kind(j) for j in range(table.n_features)]
        for j in self.numeric_columns_:
            held = table.held_kind(j) if self._numeric_kind[j] == "category" else None
            if held in TIME_KINDS:  # an object column of datetimes or durations
                self._numeric_kind[j] = held
        centre, scale, quantiles, has_missing = [], [], [], []
        constant_numbers, constant_levels = [], []  # (HeldColumns)
        for k, j in enumerate(self.numeric_columns_):
            kind = self._numeric_kind[j]
            values = table.numeric_column(j, fitted_kind=kind if kind in TIME_KINDS else None)
            finite = values[~np.isnan(values)]
            has_missing.append(finite.size < values.size)
            if not finite.size or (finite.size == values.size and finite.min() == finite.max()):
                constant_numbers.append((k, finite[0] if finite.size else np.nan))
            c, s, q = column_scaling(finite, self.numeric_scaling)
            centre.append(c), scale.append(s), quantiles.append(q)
        self._centre = np.asarray(centre, dtype=np.float64)
        self._scale = np.asarray(scale, dtype=np.float64)
        self._quantiles = quantiles
        missing = np.asarray(has_missing, dtype=bool)
        self.indicator_columns_ = (
            self.numeric_columns_[missing] if self.missing_indicators
            else np.zeros(0, dtype=int)
        )
        self._indicator_positions = np.flatnonzero(missing) if self.missing_indicators else []
        self.categories_ = []
        # per categorical column: levels that are numbers; levels of numbers and strings
        # (kept as text, so a number finds its level whatever carries it at prediction)
        self._level_is_numeric, self._level_is_mixed = [], []
        categories_missing, other_share = [], []
        for k, j in enumerate(self.categorical_columns_):
            values, kind = table.category_column(j)
            present = values[~isna(values)]
            categories_missing.append(present.size < values.size)
            levels, counts = level_counts(present)
            if not present.size or (levels.size == 1 and present.size == values.size):
                constant_levels.append((k, levels[0] if levels.size else None))
            kept = counts >= self.min_frequency
            self.categories_.append(levels[kept])
            other_share.append(counts[~kept].sum() / max(present.size, 1))
            self._level_is_numeric.append(kind == "numbers")
            self._level_is_mixed.append(kind == "mixed")
        self.categories_missing_ = np.asarray(categories_missing, dtype=bool)
        self._other_share = np.asarray(other_share, dtype=np.float64)
        self.cardinalities_ = np.asarray([lv.size + _FIRST_LEVEL for lv in self.categories_],
                                         dtype=int)
        self.n_numeric_out_ = int(self.numeric_columns_.size + self.indicator_columns_.size)
        self.statistic_columns_ = np.zeros(0, dtype=int)
        self._statistics = None
        self._held = (HeldColumns.of_encoder(self, constant_numbers, constant_levels)
                      if self.hold_constant else None)
        return self

    def _hold(self, block, hold=True):
        held = getattr(self, "_held", None) if hold else None  # (none pickled before)
        if held is not None:
            held.hold(block.numeric, block.categories)
        return block

    @property
    def _statistic_positions(self):
        """``statistic_columns_``, or none (an encoder pickled before the statistics)."""
        return () if self._statistics is None else self.statistic_columns_

    def fit_statistics(self, X, targets, min_levels, sample_weight=None, random_state=None,
                       max_bytes=None):
        """Add the target statistics of the categorical columns with at least ``min_levels``
        levels present at fit (those whose statistics predict better than the mean:
        ``TargetStatistics.kept``) to the numeric block (``_target_statistics``), robust-scaled;
        ``X`` the training rows of :meth:`fit` and ``targets`` their (n, n_targets) numbers.
        Returns the training rows' cross-fitted statistics, scaled, for
        :meth:`transform_blocks` to give them instead of those of every training row (``None``
        where no column has statistics); ``max_bytes`` as ``TargetStatistics.fit_transform``
        takes it."""
        check_is_fitted(self, "categorical_")
        table = Table(X, self, reset=False)
        columns, levels, values = [], [], []
        for k, j in enumerate(self.categorical_columns_):
            column = self._category_values(table, k, j)
            present, _ = level_counts(column[~isna(column)])  # every level, the rare ones too
            if present.size >= min_levels:
                columns.append(k)
                levels.append(present)
                values.append(column)
        statistics = LevelStatistics()
        rows = statistics.fit_transform(values, levels, np.asarray(targets, dtype=np.float64),
                                        sample_weight, check_random_state(random_state),
                                        max_bytes)
        if not statistics.kept:
            return None
        self.statistic_columns_ = np.asarray(columns, dtype=int)[statistics.kept]
        self._statistics = statistics
        self.n_numeric_out_ += statistics.width
        return rows

    def unseen_columns(self, X, share=0.5, max_rows=10_000):
        """Names of the categorical columns where more than ``share`` of the values present in
        ``X`` (evenly spaced rows, at most ``max_rows``) are levels this encoding does not
        keep, and more than twice their share at fit (the rare levels it merged): data that a
        warm start's kept encoding reads as one "unseen" level."""
        if not self.categorical_columns_.size or not X.shape[0]:
            return []
        rows = np.unique(np.linspace(0, X.shape[0] - 1, min(X.shape[0], max_rows)).astype(int))
        table = Table(X.iloc[rows] if hasattr(X, "iloc") else X[rows], self, reset=False)
        codes = self._encode(table.rows(slice(0, table.n_rows)), hold=False).categories
        present = (codes != MISSING_CODE).sum(0)
        unseen = (codes == OTHER_CODE).sum(0) / np.maximum(present, 1)
        at_fit = getattr(self, "_other_share", np.zeros(unseen.size))
        names = self.get_feature_names_out()[-self.categorical_columns_.size:]
        return [str(names[k]) for k in np.flatnonzero((unseen > share) & (unseen > 2 * at_fit))]

    @property
    def reads_times(self):
        """Whether a numeric column held datetimes or durations at fit (read as seconds)."""
        return any(self._numeric_kind[j] in TIME_KINDS for j in self.numeric_columns_)

    def _categorical_mask(self, table):
        n = table.n_features
        spec = self.categorical_features
        if spec is None:
            return np.zeros(n, dtype=bool)
        if isinstance(spec, str):
            if spec != "from_dtype":
                raise ValueError(
                    f"categorical_features must be 'from_dtype', None, a boolean mask, indices or "
                    f"column names; got {spec!r}."
                )
            return np.array([table.kind(j) == "category" and table.held_kind(j) is None
                             for j in range(n)], dtype=bool)
        spec = np.asarray(spec)
        mask = np.zeros(n, dtype=bool)
        if spec.size == 0 and spec.dtype.kind != "b":
            return mask  # an empty list (float64 to NumPy): no categorical column, as in HGB
        if spec.dtype.kind == "b":
            if spec.shape != (n,):
                raise ValueError(f"categorical_features mask has {spec.size} entries but X has "
                                 f"{n} features.")
            return spec.copy()
        if spec.dtype.kind in "UO":
            names = getattr(self, "feature_names_in_", None)
            if names is None:
                raise ValueError("categorical_features given as names needs X as a DataFrame "
                                 "with string column names.")
            index = {name: i for i, name in enumerate(names)}
            unknown = [s for s in spec if s not in index]
            if unknown:
                raise ValueError(f"categorical_features names not in X's columns: {unknown}.")
            mask[[index[s] for s in spec]] = True
            return mask
        if spec.dtype.kind in "iu":
            if spec.size and (spec.min() < 0 or spec.max() >= n):  # as HistGradientBoosting
                raise ValueError(f"categorical_features indices must be in [0, {n}); "
                                 f"got {spec.tolist()}.")
            mask[spec] = True
            return mask
        raise ValueError(f"categorical_features has an unsupported type: {spec.dtype}.")

    # ------------------------------------------------------------------ transform

    def transform(self, X):
        """Encode ``X`` in one block: a ``TabularBlock(numeric, categories)``."""
        check_is_fitted(self, "categorical_")
        table = Table(X, self, reset=False)
        return self._encode(table.rows(slice(0, table.n_rows)))

    def encode_float_rows(self, array):
        """:meth:`transform` of a float64 array that the estimator has checked (its fitted
        width, no infinity) when every column is a number without quantile scaling, else
        ``None``: a single-row predict's encoding without the output wrapper, the fitted check
        and the column access of :meth:`transform`, which took most of its time (the same
        arithmetic, :meth:`_encode_numeric_array`)."""
        if (array.dtype != np.float64 or self.categorical_columns_.size
                or any(grid is not None for grid in self._quantiles)):
            return None
        numeric = np.zeros((array.shape[0], self.n_numeric_out_), dtype=self.dtype)
        self._encode_numeric_array(array, numeric)
        return self._hold(TabularBlock(numeric, np.zeros((array.shape[0], 0), dtype=np.int64)))

    def encode_mixed_rows(self, frame, dtypes):
        """:meth:`transform` of a few rows of a checked DataFrame (fitted names, no infinity):
        NumPy numbers in its numeric columns, strings (or missing values) in its categorical
        ones with string levels at fit, no quantile scaling; else ``None``. The same numbers
        without :meth:`transform`'s column-by-column conversions, which dominate a single
        row's predict. ``dtypes``: the frame's column dtypes."""
        if any(grid is not None for grid in self._quantiles):
            return None
        for j in self.numeric_columns_:
            if not (isinstance(dtypes[j], np.dtype) and dtypes[j].kind in "iuf"
                    and self._numeric_kind[j] == "number"):
                return None
        # the rows as one object array: one conversion, not one per column
        cells = frame.to_numpy(dtype=object)
        columns = []
        for k, j in enumerate(self.categorical_columns_):
            text = dtypes[j] == np.dtype(object) or isinstance(dtypes[j], pd.StringDtype)
            if not text or (self._level_is_numeric[k] and self._read_levels(k).size):
                return None
            values = cells[:, j].copy()
            missing = isna(values)
            if not all(isinstance(v, str) for v in values[~missing]):
                return None
            values[missing] = None
            columns.append(values)
        numbers = np.full((len(frame), self.n_features_in_), np.nan)
        if self.numeric_columns_.size:
            numbers[:, self.numeric_columns_] = cells[:, self.numeric_columns_].astype(np.float64)
            reject_infinity(numbers[:, self.numeric_columns_])  # as the estimators' check does
        numeric = np.zeros((len(frame), self.n_numeric_out_), dtype=self.dtype)
        self._encode_numeric_array(numbers, numeric)
        codes = np.zeros((len(frame), self.categorical_columns_.size), dtype=np.int64)
        for k, values in enumerate(columns):
            codes[:, k] = level_codes(values, self.categories_[k])
        self._write_statistics([columns[k] for k in self._statistic_positions], numeric)
        return self._hold(TabularBlock(numeric, codes))

    def transform_blocks(self, X, block_rows, statistics=None):
        """Yield ``TabularBlock`` s of at most ``block_rows`` rows (``None``: one block).

        A sparse matrix is densified one row block at a time, so a caller that bounds
        ``block_rows`` by its memory budget never holds the dense matrix. ``statistics``: the
        rows' scaled target statistics to give them (the training rows' cross-fitted ones,
        from :meth:`fit_statistics`) instead of computing those of every training row.
        """
        check_is_fitted(self, "categorical_")
        table = Table(X, self, reset=False)
        n = table.n_rows
        step = n if block_rows is None else max(1, int(block_rows))
        for start in range(0, max(n, 1), max(step, 1)):
            rows = slice(start, min(n, start + step))
            yield self._encode(table.rows(rows),
                               None if statistics is None else statistics[rows])
            if n == 0:
                return

    def _encode(self, table, statistics=None, hold=True):
        n = table.n_rows
        numeric = np.zeros((n, self.n_numeric_out_), dtype=self.dtype)
        n_num = self.numeric_columns_.size
        if table.array is not None and all(grid is None for grid in self._quantiles):
            # a numeric array: every column at once (the same arithmetic as column by column;
            # a single-row predict spent more time in the loop than in its attention)
            self._encode_numeric_array(table.array, numeric)
        else:
            for k, j in enumerate(self.numeric_columns_):
                values = table.numeric_column(j, fitted_kind=self._numeric_kind[j])
                missing = np.isnan(values)
                numeric[:, k] = self._scale_column(k, values)
                # at the (scaled) centre: the median, or the mean for "standard"
                numeric[missing, k] = self._centre[k] if self.numeric_scaling is None else 0.0
            for i, k in enumerate(self._indicator_positions):
                j = self.numeric_columns_[k]
                numeric[:, n_num + i] = np.isnan(table.numeric_column(j, self._numeric_kind[j]))
        codes = np.zeros((n, self.categorical_columns_.size), dtype=np.int64)
        statistic_values = []
        for k, j in enumerate(self.categorical_columns_):
            values = self._category_values(table, k, j)
            codes[:, k] = level_codes(values, self.categories_[k])
            if k in self._statistic_positions and statistics is None:
                statistic_values.append(values)
        self._write_statistics(statistic_values, numeric, statistics)
        return self._hold(TabularBlock(numeric, codes), hold)

    def _write_statistics(self, values, numeric, statistics=None):
        """The scaled target statistics of rows whose statistic columns hold ``values`` (a
        list), or the given ``statistics`` of the rows, into the last columns of their
        ``numeric`` block."""
        if self._statistics is None:
            return
        if statistics is None:
            statistics = self._statistics.transform(values)
        numeric[:, numeric.shape[1] - statistics.shape[1]:] = statistics

    def _category_values(self, table, k, j):
        """Input column ``j`` (categorical column ``k``) as its fitted levels read it: numbers,
        or text (every value as text where the levels mixed numbers and strings). A column
        whose values are all missing has the missing code whatever its dtype. One that held
        numbers at fit and strings now, or the reverse, is read as the levels are: ``1``,
        ``1.0`` and ``"1"`` are one level (:func:`~._table.level_text`), as in a column whose
        levels mixed numbers and strings; it is an error only where no value of the new kind
        could match a level (words for levels of numbers, numbers for levels of words): the
        codes would silently not match."""
        # (an encoder pickled before mixed levels were kept as text has no such flags)
        mixed = bool(getattr(self, "_level_is_mixed", [False] * (k + 1))[k])
        values, kind = table.category_column(j, as_text=mixed)
        fitted = self._level_is_numeric[k]
        levels = self._read_levels(k)
        if kind is None or mixed or not levels.size or (kind == "numbers") == fitted:
            return values
        if fitted:  # strings now ("text", or "mixed" with numbers): the numbers they write
            numbers = as_numbers(values)
            words = np.isnan(numbers) & ~isna(values)
            if not words.any():
                return numbers
            now = f"strings now that are no numbers (e.g. {values[words][0]!r}), which no level"
            fix = "pass numbers or strings of numbers ('1' for the level 1)"
        else:  # numbers now: their text, the levels' where those are strings of numbers
            text, _ = table.category_column(j, as_text=True)
            if not np.isnan(as_numbers(levels)).all():
                return text
            now = f"numbers now (e.g. {text[~isna(text)][0]}), and no level is a number: none"
            fix = "pass the strings it held at fit"
        raise ValueError(
            f"categorical column {table.name(j)!r} held {'numbers' if fitted else 'strings'} "
            f"at fit time but holds {now} can match; {fix}."
        )

    def _read_levels(self, k):
        """The levels that categorical column ``k``'s values must match: its codes' levels, or
        where every level is rare (no code of its own), its target statistics' levels."""
        columns = list(self._statistic_positions)
        if self.categories_[k].size or k not in columns:
            return self.categories_[k]
        return self._statistics.levels[columns.index(k)]

    def _encode_numeric_array(self, array, numeric):
        """The numeric block of a float array's rows (no quantile scaling) into ``numeric``."""
        n_num = self.numeric_columns_.size
        # every column a number, in order (the common case): no gathered copy
        values = array if n_num == array.shape[1] else array[:, self.numeric_columns_]
        missing = np.isnan(values)
        scaled = self._scale_column(slice(None), values)
        if missing.any():
            centre = np.broadcast_to(self._centre, values.shape)
            scaled = np.where(missing, centre if self.numeric_scaling is None else 0.0, scaled)
        numeric[:, :n_num] = scaled
        numeric[:, n_num:n_num + len(self._indicator_positions)] = (
            missing[:, self._indicator_positions])

    def _scale_column(self, k, values):
        """Column ``k``'s scaled ``values`` (``k`` a slice and ``values`` those columns: the
        linear scalings of several columns at once)."""
        grid = None if isinstance(k, slice) else self._quantiles[k]
        return scaled(values, self.numeric_scaling, self._centre[k], self._scale[k], grid)

    def get_feature_names_out(self, input_features=None):
        """Names of the numeric block's columns then of the categorical codes."""
        check_is_fitted(self, "categorical_")
        names = getattr(self, "feature_names_in_", None)
        if names is None:
            names = np.array([f"x{i}" for i in range(self.n_features_in_)], dtype=object)
        out = [names[j] for j in self.numeric_columns_]
        out += [f"missing_{names[j]}" for j in self.indicator_columns_]
        targets = 0 if self._statistics is None else self._statistics.n_targets
        for k in self._statistic_positions:
            name = names[self.categorical_columns_[k]]
            out += [f"{name}_target"] if targets == 1 else [f"{name}_target{t}"
                                                              for t in range(targets)]
        out += [names[j] for j in self.categorical_columns_]
        return np.asarray(out, dtype=object)

class TabularBlock:
    """One encoded row block: ``numeric`` (n, n_numeric_out_), ``categories`` int64."""

    __slots__ = ("categories", "numeric")

    def __init__(self, numeric, categories):
        self.numeric, self.categories = numeric, categories

    def __len__(self):
        return self.numeric.shape[0]
