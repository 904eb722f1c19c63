"""Mixed-type tabular input: the encoder the metric-attention estimators call in fit and predict.

``_TabularEncoder`` turns what a user has -- a pandas DataFrame with numeric, boolean,
``category`` and string/object columns and missing values (NaN, ``pd.NA``, nullable dtypes), a
NumPy array, or a SciPy sparse CSR/CSC matrix -- into what the learned metric needs:

* ``numeric``: ``(n, n_numeric + n_indicators)`` floats of ``dtype``, each numeric column scaled
  (by default RealMLP's robust scaling: ``(x - median) / IQR`` smoothly clipped to about +-3;
  the tabular benchmark's DEV sets chose it over quantile-normal scaling; ``None``: unscaled)
  with missing values at the (scaled) median and, for every column that had missing values at
  fit time, a 0/1 missing indicator appended;
* ``categories``: int64 ``(n, n_categorical)`` codes, 0 for a missing value, 1 for a level unseen
  at fit time or rarer than ``min_frequency`` ("other"), and 2, 3, ... for the training levels
  (``cardinalities_`` holds each column's number of codes), ready for an embedding lookup.

Sparse input is never densified whole: ``transform_blocks`` yields dense row blocks of a bounded
size (``transform`` is the one-block case for inputs that fit the memory budget).

What happens with awkward input (each a documented handling or a clear ``ValueError``):

* a column that is all NaN at fit time: kept, encoded as a constant (it carries no information
  and does not move distances); missing values there get no indicator;
* a category column with a single level: one level code (plus the missing / other codes);
* unseen categories or missing values at predict time: the "other" / missing codes, and the
  scaled median for numbers (no error);
* a sparse matrix with explicit NaN: missing values as above; implicit entries are zeros;
* a DataFrame whose columns differ from the fit (names, order) or whose column changed between
  numbers and strings: ``ValueError`` naming the column. A numeric column that arrives as strings
  of numbers is converted; one that holds text raises.
"""

from numbers import Integral

import numpy as np
from scipy import sparse
from scipy.special import ndtri
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_array, check_is_fitted

try:  # optional: numeric arrays and sparse matrices are encoded without it
    import pandas as pd
except ImportError:  # pragma: no cover - the test environment has pandas
    pd = None

MISSING_CODE = 0
OTHER_CODE = 1
_FIRST_LEVEL = 2
# quantile scaling: n_quantiles = clip(n // 30, 10, 1000), as TALENT's QuantileTransformer
_QUANTILES = (10, 1000, 30)
# the normal output is clipped where a training value can land (sklearn's BOUNDS_THRESHOLD idea)
_NORMAL_CLIP = 5.2
_ROBUST_CLIP = 3.0


class _TabularEncoder(TransformerMixin, BaseEstimator):
    """Encode a mixed-type table into scaled numbers, missing indicators and category codes.

    Parameters
    ----------
    categorical_features : "from_dtype", array-like of bool, int or str, or None, \
            default="from_dtype"
        Which columns are categorical. ``"from_dtype"``: pandas ``category``, string and object
        columns (booleans are numbers 0/1). A boolean mask, column indices or (for DataFrames)
        column names select them explicitly; ``None``: every column is numeric.
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
        Width of the numeric block (scaled columns and indicators).

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

    def __init__(self, categorical_features="from_dtype", numeric_scaling="robust",
                 missing_indicators=True, min_frequency=1, dtype=np.float32):
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
        table = _Table(X, self, reset=True)
        self.categorical_ = self._categorical_mask(table)
        if table.is_sparse and self.categorical_.any():
            raise ValueError("categorical_features cannot select columns of a sparse matrix; "
                             "pass a dense array or a DataFrame for categorical columns.")
        self.numeric_columns_ = np.flatnonzero(~self.categorical_)
        self.categorical_columns_ = np.flatnonzero(self.categorical_)
        self._numeric_kind = [table.kind(j) for j in range(table.n_features)]
        centre, scale, quantiles, has_missing = [], [], [], []
        for j in self.numeric_columns_:
            values = table.numeric_column(j, fitted_kind=None)
            finite = values[~np.isnan(values)]
            has_missing.append(finite.size < values.size)
            c, s, q = self._scaling(finite)
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
        self._level_is_numeric = []
        categories_missing = []
        for j in self.categorical_columns_:
            values, is_numeric = table.category_column(j)
            present = values[~_isna(values)]
            categories_missing.append(present.size < values.size)
            levels, counts = np.unique(present, return_counts=True) if present.size else (
                np.zeros(0, dtype=present.dtype), np.zeros(0, dtype=int))
            self.categories_.append(levels[counts >= self.min_frequency])
            self._level_is_numeric.append(is_numeric)
        self.categories_missing_ = np.asarray(categories_missing, dtype=bool)
        self.cardinalities_ = np.asarray([lv.size + _FIRST_LEVEL for lv in self.categories_],
                                         dtype=int)
        self.n_numeric_out_ = int(self.numeric_columns_.size + self.indicator_columns_.size)
        return self

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
            return np.array([table.kind(j) == "category" for j in range(n)], dtype=bool)
        spec = np.asarray(spec)
        mask = np.zeros(n, dtype=bool)
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
            if spec.size and (spec.min() < -n or spec.max() >= n):
                raise ValueError(f"categorical_features indices must be in [0, {n}); "
                                 f"got {spec.tolist()}.")
            mask[spec] = True
            return mask
        raise ValueError(f"categorical_features has an unsupported type: {spec.dtype}.")

    def _scaling(self, finite):
        """(centre, scale, quantile grid or None) of one numeric column's finite values."""
        if finite.size == 0:  # all missing: a constant column
            return 0.0, 1.0, None
        if self.numeric_scaling is None:  # the centre is only where missing values go
            return float(np.median(finite)), 1.0, None
        if self.numeric_scaling == "standard":
            scale = finite.std()
            return finite.mean(), scale if scale > 0 else 1.0, None
        median = float(np.median(finite))
        if self.numeric_scaling == "robust":
            q25, q75 = np.percentile(finite, [25, 75])
            scale = q75 - q25
            if scale <= 0:  # RealMLP: fall back to the range when the IQR is zero
                scale = 0.5 * (finite.max() - finite.min())
            return median, scale if scale > 0 else 1.0, None
        low, high, per = _QUANTILES
        n_quantiles = int(np.clip(finite.size // per, low, high))
        grid = np.percentile(finite, np.linspace(0, 100, n_quantiles))
        return median, 1.0, grid

    # ------------------------------------------------------------------ transform

    def transform(self, X):
        """Encode ``X`` in one block: a ``TabularBlock(numeric, categories)``."""
        check_is_fitted(self, "categorical_")
        table = _Table(X, self, reset=False)
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
        return TabularBlock(numeric, np.zeros((array.shape[0], 0), dtype=np.int64))

    def transform_blocks(self, X, block_rows):
        """Yield ``TabularBlock`` s of at most ``block_rows`` rows (``None``: one block).

        A sparse matrix is densified one row block at a time, so a caller that bounds
        ``block_rows`` by its memory budget never holds the dense matrix.
        """
        check_is_fitted(self, "categorical_")
        table = _Table(X, self, reset=False)
        n = table.n_rows
        step = n if block_rows is None else max(1, int(block_rows))
        for start in range(0, max(n, 1), max(step, 1)):
            rows = slice(start, min(n, start + step))
            yield self._encode(table.rows(rows))
            if n == 0:
                return

    def _encode(self, table):
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
        for k, j in enumerate(self.categorical_columns_):
            values, is_numeric = table.category_column(j)
            if is_numeric != self._level_is_numeric[k] and self.categories_[k].size:
                raise ValueError(
                    f"categorical column {table.name(j)!r} held "
                    f"{'numbers' if self._level_is_numeric[k] else 'strings'} at fit time but "
                    f"holds {'numbers' if is_numeric else 'strings'} now."
                )
            codes[:, k] = _codes(values, self.categories_[k])
        return TabularBlock(numeric, codes)

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
        numeric[:, n_num:] = missing[:, self._indicator_positions]

    def _scale_column(self, k, values):
        """Column ``k``'s scaled ``values`` (``k`` a slice and ``values`` those columns: the
        linear scalings of several columns at once)."""
        if self.numeric_scaling is None:
            return values
        if isinstance(k, slice) or self._quantiles[k] is None:
            out = (values - self._centre[k]) / self._scale[k]
            if self.numeric_scaling == "robust":  # smooth clipping to about +-_ROBUST_CLIP
                out = out / np.sqrt(1.0 + (out / _ROBUST_CLIP) ** 2)
            return out
        grid = self._quantiles[k]
        levels = np.linspace(0.0, 1.0, grid.size)
        # average of the forward and backward interpolation: ties (repeated quantiles, as in a
        # binary column) map to the middle of their probability range, as in scikit-learn
        u = 0.5 * (np.interp(values, grid, levels)
                   - np.interp(-values, -grid[::-1], -levels[::-1]))
        z = ndtri(np.clip(u, 1e-7, 1 - 1e-7))
        return np.clip(z, -_NORMAL_CLIP, _NORMAL_CLIP)

    def get_feature_names_out(self, input_features=None):
        """Names of the numeric block's columns then of the categorical codes."""
        check_is_fitted(self, "categorical_")
        names = getattr(self, "feature_names_in_", None)
        if names is None:
            names = np.array([f"x{i}" for i in range(self.n_features_in_)], dtype=object)
        out = [names[j] for j in self.numeric_columns_]
        out += [f"missing_{names[j]}" for j in self.indicator_columns_]
        out += [names[j] for j in self.categorical_columns_]
        return np.asarray(out, dtype=object)


class TabularBlock:
    """One encoded row block: ``numeric`` (n, n_numeric_out_), ``categories`` int64."""

    __slots__ = ("categories", "numeric")

    def __init__(self, numeric, categories):
        self.numeric, self.categories = numeric, categories

    def __len__(self):
        return self.numeric.shape[0]


class _DenseLayout:
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


class _CodesLayout:
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


def reject_infinity(values):
    """scikit-learn's error for infinity in ``X`` (NaN is a missing value here)."""
    if np.isinf(values).any():
        dtype = values.dtype if values.dtype.kind == "f" else np.dtype(np.float64)
        raise ValueError(f"Input X contains infinity or a value too large for {dtype!r}.")


def _isna(values):
    return np.isnan(values) if values.dtype.kind == "f" else pd.isna(values)


def _codes(values, levels):
    codes = np.full(values.shape[0], OTHER_CODE, dtype=np.int64)
    missing = _isna(values)
    codes[missing] = MISSING_CODE
    if levels.size:
        present = ~missing
        found = np.searchsorted(levels, values[present].astype(levels.dtype, copy=False))
        found = np.minimum(found, levels.size - 1)
        hit = levels[found] == values[present]
        idx = np.flatnonzero(present)
        codes[idx[hit]] = found[hit] + _FIRST_LEVEL
    return codes


class _Table:
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
        out = object.__new__(_Table)
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
        return str(self.frame.columns[j]) if self.is_frame else f"x{j}"

    def kind(self, j):
        """'category' (category / string / object), 'bool' or 'number'."""
        if self.is_sparse or self.array is not None:
            return "number"
        dtype = self.frame.dtypes.iloc[j]
        if isinstance(dtype, pd.CategoricalDtype):
            return "category"
        if pd.api.types.is_bool_dtype(dtype):
            return "bool"
        if pd.api.types.is_numeric_dtype(dtype):
            return "number"
        return "category"

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
            series = converted
        return series.astype("float64").to_numpy(na_value=np.nan)

    def category_column(self, j):
        """(values as an object or float array with NaN/None missing, holds-numbers flag)."""
        if self.is_sparse:  # unreachable: categorical columns of sparse input are refused
            raise ValueError("sparse matrices have no categorical columns.")
        if self.array is not None:  # numbers declared categorical in categorical_features
            return self.array[:, j], True
        series = self.frame.iloc[:, j]
        if isinstance(series.dtype, pd.CategoricalDtype):
            series = series.astype(object)
        if pd.api.types.is_numeric_dtype(series.dtype) and not pd.api.types.is_bool_dtype(
                series.dtype):
            return series.astype("float64").to_numpy(na_value=np.nan), True
        values = series.to_numpy(dtype=object, na_value=None)
        present = ~pd.isna(values)
        if present.any() and all(isinstance(v, (Integral, float, np.number))
                                 and not isinstance(v, bool) for v in values[present]):
            return np.array([np.nan if v is None else float(v) for v in values]), True
        out = np.empty(values.shape[0], dtype=object)
        out[:] = None
        out[present] = [str(v) for v in values[present]]
        return out, False
