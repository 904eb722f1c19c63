"""Uniform column access to what the tabular encoder reads: a DataFrame, an array or a sparse
matrix, checked against the fitted columns (``Table``), and the input checks it shares with the
estimators (``reject_infinity``)."""

import datetime
import math
from decimal import Decimal
from numbers import Integral, Real

import numpy as np
from scipy import sparse
from sklearn.utils.validation import check_array

try:  # optional: numeric arrays and sparse matrices are encoded without it
    import pandas as pd
except ImportError:  # pragma: no cover - the test environment has pandas
    pd = None

# what a column of datetimes or durations becomes: float64 seconds since the Unix epoch or
# seconds (numbers: one level per distinct time would make the column useless)
TIME_KINDS = ("datetime", "timedelta")
_KIND_NAMES = {"datetime": "datetimes", "timedelta": "durations", "number": "numbers"}


def reject_infinity(values):
    """scikit-learn's error for infinity in ``X`` (NaN is a missing value here)."""
    if np.isinf(values).any():
        dtype = values.dtype if values.dtype.kind == "f" else np.dtype(np.float64)
        raise ValueError(f"Input X contains infinity or a value too large for {dtype!r}.")

def isna(values):
    return np.isnan(values) if values.dtype.kind == "f" else pd.isna(values)

class Table:
    """Uniform column access to a DataFrame, an array or a sparse matrix.

    With ``reset=True`` the encoder's ``n_features_in_`` / ``feature_names_in_`` are set;
    otherwise the input is checked against them (a clear error on a mismatch).
    """

    def __init__(self, X, encoder, reset):
        self._encoder = encoder
        self.is_frame = pd is not None and isinstance(X, pd.DataFrame)
        self.array = None
        self.is_sparse = sparse.issparse(X)
        if self.is_frame:
            self.frame = X
            # once per table: a frame builds a Series of its dtypes on every access
            self.dtypes = list(X.dtypes)
            names = np.asarray([str(c) for c in X.columns], dtype=object)
            string_names = all(isinstance(c, str) for c in X.columns)
            self.n_rows, self.n_features = X.shape
        elif self.is_sparse:
            self.matrix = check_array(X, accept_sparse=("csr", "csc"), dtype=np.float64,
                                      ensure_all_finite="allow-nan", ensure_min_samples=0)
            # fit reads whole columns, transform reads row blocks: one conversion each
            self.matrix = self.matrix.tocsc() if reset else self.matrix.tocsr()
            self.n_rows, self.n_features = self.matrix.shape
            string_names = False
        else:
            if pd is not None and isinstance(X, pd.Series):
                raise ValueError("X must be 2-D (a DataFrame, an array or a sparse matrix); "
                                 "got a Series.")
            array = np.asarray(X)
            if array.ndim != 2:
                raise ValueError(f"X must be 2-D; got an array of shape {array.shape}.")
            self.array = None
            if array.dtype == np.float64:
                # what check_array would check of a float64 array (the estimators' queries,
                # already validated: a single-row predict paid for a second full check)
                reject_infinity(array)
                self.array = array
            elif array.dtype.kind in "biuf":
                self.array = check_array(array, dtype=np.float64, ensure_all_finite="allow-nan",
                                         ensure_min_samples=0)
            elif pd is None:
                raise ImportError(f"an array of dtype {array.dtype} (strings or objects) needs "
                                  "pandas to be encoded: pip install pandas.")
            else:
                self.frame = pd.DataFrame(array)
                self.dtypes = list(self.frame.dtypes)
            self.n_rows, self.n_features = array.shape
            string_names = False
        if reset:
            encoder.n_features_in_ = self.n_features
            if string_names:
                encoder.feature_names_in_ = names
            elif hasattr(encoder, "feature_names_in_"):
                del encoder.feature_names_in_
            if self.n_rows < 1:
                raise ValueError("Found array with 0 sample(s) while a minimum of 1 is required.")
            return
        if self.n_features != encoder.n_features_in_:
            raise ValueError(f"X has {self.n_features} features, but the encoder was fitted with "
                             f"{encoder.n_features_in_} features.")
        fitted_names = getattr(encoder, "feature_names_in_", None)
        if fitted_names is not None and string_names and not np.array_equal(names, fitted_names):
            raise ValueError("The feature names should match those that were passed during fit "
                             f"(in order); got {list(names)}, expected {list(fitted_names)}.")

    def rows(self, rows):
        """The table of a row slice; a sparse slice is densified here, one block at a time."""
        out = object.__new__(Table)
        out.__dict__.update(self.__dict__)
        if self.is_sparse:
            out.dense = self.matrix[rows].toarray()
            out.matrix = None
        elif self.array is not None:
            out.array = self.array[rows]
        else:
            out.frame = self.frame.iloc[rows]
        out.n_rows = len(range(*rows.indices(self.n_rows)))
        return out

    def name(self, j):
        """Column ``j``'s name: the frame's, else the fitted one (an array of a frame's rows,
        as predict's few-rows path passes it), else ``x<j>``."""
        if self.is_frame:
            return str(self.frame.columns[j])
        names = getattr(self._encoder, "feature_names_in_", None)
        return str(names[j]) if names is not None else f"x{j}"

    def kind(self, j):
        """'category' (category / string / object / period / interval), 'bool', 'number',
        'datetime' (naive or time-zone aware) or 'timedelta', by the column's dtype."""
        if self.is_sparse or self.array is not None:
            return "number"
        dtype = self.dtypes[j]
        if isinstance(dtype, pd.CategoricalDtype):
            return "category"
        if pd.api.types.is_datetime64_any_dtype(dtype):
            return "datetime"
        if pd.api.types.is_timedelta64_dtype(dtype):
            return "timedelta"
        if pd.api.types.is_bool_dtype(dtype):
            return "bool"
        if pd.api.types.is_numeric_dtype(dtype):
            return "number"
        return "category"

    def held_kind(self, j):
        """What the ``object`` column ``j`` holds where its values present (one at least) are
        all of one kind: ``"number"`` (real numbers, ``Decimal`` included, not booleans or
        strings: numbers that lost their dtype, as in an object array of a mixed frame or a
        ColumnTransformer's passthrough), ``"datetime"`` (``datetime.date`` / ``datetime`` /
        ``pd.Timestamp`` / ``np.datetime64``) or ``"timedelta"``; else ``None``."""
        if self.array is not None or self.is_sparse or self.dtypes[j] != np.dtype(object):
            return None
        values = self.frame.iloc[:, j].to_numpy(dtype=object)
        present = values[~pd.isna(values)]
        if not present.size:
            return None
        types = pd.unique(_TYPE_OF(present))  # each distinct type tested once
        return next((kind for kind, test in _CELL_TESTS.items() if all(map(test, types))), None)

    def numeric_column(self, j, fitted_kind):
        """Column ``j`` as float64 with NaN for missing values; a clear error for text."""
        if self.is_sparse:
            if getattr(self, "dense", None) is not None:
                return self.dense[:, j]
            # the whole (CSC) matrix at fit: one dense column at a time, never all columns
            column = np.zeros(self.n_rows)
            start, stop = self.matrix.indptr[j], self.matrix.indptr[j + 1]
            column[self.matrix.indices[start:stop]] = self.matrix.data[start:stop]
            return column
        if self.array is not None:
            return self.array[:, j]
        series = self.frame.iloc[:, j]
        kind = self.kind(j)
        if fitted_kind in TIME_KINDS or kind in TIME_KINDS:
            # times read as they were at fit; a column of numbers at fit takes no times
            expected = (kind if fitted_kind is None
                        else fitted_kind if fitted_kind in TIME_KINDS else "number")
            return self._seconds(j, series, expected)
        if kind == "category" or (fitted_kind not in (None, kind) and fitted_kind != "bool"):
            if isinstance(series.dtype, pd.CategoricalDtype):
                series = series.astype(object)
            converted = pd.to_numeric(series, errors="coerce")
            bad = converted.isna() & series.notna()
            if bad.any():
                example = series[bad].iloc[0]
                when = "now" if fitted_kind is not None else "at fit time"
                raise ValueError(
                    f"column {self.name(j)!r} is numeric for this encoder but holds text {when} "
                    f"(e.g. {example!r}); declare it in categorical_features or fix its dtype."
                )
            values = converted.astype("float64").to_numpy(na_value=np.nan)
            reject_infinity(values)  # "inf" or np.inf in an object column, as in a float one
            return values
        return series.astype("float64").to_numpy(na_value=np.nan)

    def _seconds(self, j, series, fitted_kind):
        """Column ``j`` (``series``) read as ``fitted_kind`` (:data:`TIME_KINDS`): float64
        seconds since the Unix epoch (naive datetimes read as UTC) or seconds of the durations,
        NaN where missing; a clear error where it holds anything else (``fitted_kind="number"``:
        a column of numbers at fit, which takes missing values only here)."""
        kind = self.kind(j)
        if kind != fitted_kind:  # an object column (or other values at prediction)
            values = series.to_numpy(dtype=object, na_value=None)
            present = values[~pd.isna(values)]
            if not present.size:  # all missing: no evidence either way
                return np.full(values.shape[0], np.nan)
            wrong = ~_cells_of(present, _CELL_TESTS[fitted_kind])[0]
            if kind in TIME_KINDS or wrong.any():
                example = present[np.argmax(wrong)]
                raise ValueError(
                    f"column {self.name(j)!r} held {_KIND_NAMES[fitted_kind]} at fit time but "
                    f"holds {example!r} now; pass {_KIND_NAMES[fitted_kind]} (or declare it in "
                    "categorical_features)."
                )
            series = pd.Series(values)
        try:
            if fitted_kind == "datetime":
                seconds = pd.to_datetime(series, utc=True) - pd.Timestamp(0, tz="UTC")
            else:
                seconds = pd.to_timedelta(series)
        except (pd.errors.OutOfBoundsDatetime, pd.errors.OutOfBoundsTimedelta) as error:
            raise ValueError(f"column {self.name(j)!r} holds {_KIND_NAMES[fitted_kind]} "
                             f"beyond pandas' range: {error}") from error
        seconds = seconds / pd.Timedelta(seconds=1)
        return seconds.to_numpy(dtype=np.float64, na_value=np.nan)

    def category_column(self, j, as_text=False):
        """``(values, kind)`` of column ``j`` read as categorical. ``kind``: ``"numbers"``
        (values a float array, NaN missing), ``"text"`` (an object array of strings, None
        missing), ``"mixed"`` (numbers and strings, all as text: :func:`level_text`) or
        ``None`` when every value is missing (no evidence either way). ``as_text``: numbers as
        text too (a column whose levels were mixed at fit)."""
        if self.is_sparse:  # unreachable: categorical columns of sparse input are refused
            raise ValueError("sparse matrices have no categorical columns.")
        if self.array is not None:  # numbers declared categorical, or an array of a frame
            values = self.array[:, j]
            if not as_text:
                return values, _numbers_kind(values)
            values = values.astype(object)
        else:
            series = self.frame.iloc[:, j]
            if isinstance(series.dtype, pd.CategoricalDtype):
                series = series.astype(object)
            if (not as_text and pd.api.types.is_numeric_dtype(series.dtype)
                    and not pd.api.types.is_bool_dtype(series.dtype)):
                values = series.astype("float64").to_numpy(na_value=np.nan)
                reject_infinity(values)
                return values, _numbers_kind(values)
            values = series.to_numpy(dtype=object, na_value=None)
        present = ~pd.isna(values)
        out = np.empty(values.shape[0], dtype=object)
        out[:] = None
        if not present.any():
            return out, None
        cells = values[present]
        numbers, strings = _cells_of(cells, _is_number_type, lambda kind: kind is str)
        if numbers.any():  # an infinite number is no level (a float column's error)
            reject_infinity(np.asarray([_as_float(v) for v in cells[numbers]]))
        if numbers.all() and not as_text:
            out = np.full(values.shape[0], np.nan)
            out[present] = [float(v) for v in cells]
            return out, "numbers"
        text = cells.copy()
        others = ~strings
        if others.any():
            text[others] = [level_text(v) for v in cells[others]]
        out[present] = text
        return out, "mixed" if numbers.any() else "text"


def _is_number_type(kind):
    """Whether cells of the type ``kind`` are real numbers (booleans and durations, which
    NumPy counts as integers, are not)."""
    return (issubclass(kind, (Real, Decimal, np.number))
            and not issubclass(kind, (bool, np.timedelta64)))


_CELL_TESTS = {
    "number": _is_number_type,
    "datetime": lambda kind: issubclass(kind, (datetime.date, np.datetime64)),
    "timedelta": lambda kind: issubclass(kind, (datetime.timedelta, np.timedelta64)),
}


_TYPE_OF = np.frompyfunc(type, 1, 1)


def _cells_of(cells, *tests):
    """Which cells of an object array pass each of ``tests`` (functions of a cell's type), one
    mask per test. The cells' types are factorised and each distinct type tested once: a Python
    call per cell (isinstance, str) was most of the encoding of a table of text columns."""
    codes, types = pd.factorize(_TYPE_OF(cells))
    return [np.isin(codes, [i for i, kind in enumerate(types) if test(kind)]) for test in tests]


def _as_float(value):
    """A number cell as a float; ``inf`` for an integer beyond float64 (as the error says)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _numbers_kind(values):
    """``category_column``'s kind of a float column: ``None`` when every value is NaN."""
    return "numbers" if not np.isnan(values).all() else None


def level_text(value):
    """A categorical cell as text: a number by its value (``1``, ``1.0`` and ``np.int64(1)``
    are the level ``"1"``, whatever column dtype carried it), anything else as ``str``."""
    if isinstance(value, Decimal):  # Decimal("1.50") is the level of 1.5
        value = float(value)
    if isinstance(value, Integral) and not isinstance(value, bool):
        return str(int(value))
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value)
