"""What the metric-attention estimators read: inputs of any column types checked as
scikit-learn checks them and encoded into the one dense float matrix the engine takes.

``TabularInput`` holds the fitted column encoding (the tabular encoder and a layout of its
blocks); ``PrecomputedInput`` checks distance matrices instead. Both are held by the estimator's
metric strategy (``_strategy.py``).
"""

import numpy as np
from scipy import sparse
from sklearn.utils.validation import validate_data

from .._engine import budget_bytes, plan_rows
from ._layouts import CodesLayout, DenseLayout
from ._table import pd, reject_infinity
from ._tabular import _TabularEncoder

# What validate_data checks of X before the tabular encoder reads it: any column types, missing
# values and sparse matrices pass; infinities, complex numbers and bad shapes do not.
_X_CHECKS = dict(dtype=None, accept_sparse=("csr", "csc"), ensure_all_finite="allow-nan")
# Query arrays of at most this many rows are checked and encoded as one block, directly.
FEW_ROWS = 16


class TabularInput:
    """Inputs of any column types (numbers, booleans, categories, strings, missing values,
    sparse matrices) checked against the fit and encoded into dense float blocks.

    Parameters
    ----------
    scaled : bool
        Robust-scale the numbers (learned metrics: the map learns the rest); the fixed metric
        sees them as given, so that its distances are those of the input.
    codes : bool
        Categorical columns as codes (the tabular map looks them up) instead of one-hot.
    rare_levels : tuple (rows, count) or None
        On a table of more than ``rows`` rows, categorical levels seen fewer than ``count``
        times share the "unseen" code (the encoder's ``min_frequency``); ``None``: every level
        keeps its own code.
    target_statistics : tuple (rows, levels) or None
        On a table of more than ``rows`` rows, the categorical columns of at least ``levels``
        levels add their levels' target statistics to the numbers (the encoder's
        ``fit_statistics``); ``None``: none.
    learned : bool
        A learned map reads the encoding: the columns that never varied at fit are held at
        their fitted encoding (the map learned nothing from them; a fixed metric's distances
        stay those of the input).
    """

    def __init__(self, scaled, codes, rare_levels=None, target_statistics=None, learned=False):
        self.learned = learned
        self.scaled = scaled
        self.codes = codes
        self.rare_levels = rare_levels
        self.target_statistics = target_statistics
        self.encoder = None
        self.layout = None

    @property
    def width(self):
        """Columns of the encoded matrix."""
        return self.layout.width

    def fit(self, X, categorical_features, targets=None, sample_weight=None,
            random_state=None):
        """Fit the column encoding on the checked training inputs ``X``; ``targets``: a
        function giving the (n, n_targets) numbers of the rows' targets for their statistics,
        if this input takes them. Returns the training rows' cross-fitted statistics (the
        numbers :meth:`blocks` then gives them), or ``None``."""
        min_frequency = 1
        if self.rare_levels is not None and X.shape[0] > self.rare_levels[0]:
            min_frequency = self.rare_levels[1]
        self.encoder = _TabularEncoder(
            categorical_features=categorical_features,
            numeric_scaling="robust" if self.scaled else None,
            min_frequency=min_frequency,
            dtype=np.float64,
            hold_constant=self.learned,
        ).fit(X)
        statistics = numbers = None
        if (self.target_statistics is not None and targets is not None
                and X.shape[0] > self.target_statistics[0]
                and (sample_weight is None or np.any(sample_weight > 0))):
            numbers = targets()  # None: too many columns (classes, outputs) for statistics
        if numbers is not None:
            statistics = self.encoder.fit_statistics(X, numbers, self.target_statistics[1],
                                                     sample_weight, random_state,
                                                     budget_bytes())
        self.layout = (CodesLayout if self.codes else DenseLayout)(self.encoder)
        return statistics

    def check(self, estimator, X, reset):
        """scikit-learn's checks of ``X`` (shape, feature names, infinities, complex numbers)
        against ``estimator``'s fit; returns what the encoder reads: a DataFrame as given (its
        column dtypes are the encoding's information), else the checked array or matrix."""
        if (not reset and type(X) is np.ndarray and X.ndim == 2 and X.shape[0] > 0
                and X.dtype in (np.float64, np.float32)
                and X.shape[1] == getattr(estimator, "n_features_in_", None)
                and not hasattr(estimator, "feature_names_in_")):
            # What validate_data returns for a float array of the fitted width, without its
            # probes for DataFrame libraries.
            reject_infinity(X)
            return X
        if pd is None or not isinstance(X, pd.DataFrame):
            return validate_data(estimator, X, reset=reset, **_X_CHECKS)
        if not reset and 0 < X.shape[0] <= FEW_ROWS:
            rows = self.numeric_frame_rows(estimator, X)
            if rows is not None:
                return rows
        _check_frame_columns(estimator, X)
        # names and width through an empty object-typed copy: converting the frame itself
        # would cast its category columns to float when another column is a nullable dtype
        validate_data(estimator, X.iloc[:0].astype(object), reset=reset, ensure_min_samples=0,
                      **_X_CHECKS)
        numbers = X.select_dtypes("number")
        if numbers.shape[1]:
            reject_infinity(numbers.to_numpy(np.float64, na_value=0))
        return X

    def numeric_frame_rows(self, estimator, X, dtypes=None):
        """A few rows of a DataFrame whose columns are NumPy numbers named as at fit time,
        checked, as the array the encoder reads the same way (float32 when every column is,
        else float64: what the column-by-column conversion gives); ``None`` for any other
        frame (converting and checking column by column dominates a single row's predict) and
        where a column held datetimes or durations at fit (numbers there are an error).
        ``dtypes``: the frame's column dtypes, if the caller has them (a frame builds them
        anew on every access)."""
        dtypes = list(X.dtypes) if dtypes is None else dtypes
        if (not _named_as_fitted(estimator, X) or not _numbers_only(dtypes)
                or self.encoder.reads_times):
            return None
        rows = X.to_numpy(np.float32 if all(d == np.float32 for d in dtypes) else np.float64)
        reject_infinity(rows)
        return rows

    def check_dense_fits(self, X):
        """Raise before densifying a sparse training matrix that would exceed the budget."""
        if sparse.issparse(X):
            plan_rows(None, row_bytes=0, budget=budget_bytes(), per="",
                      fixed_bytes=X.shape[0] * self.layout.width * 8,
                      what="The dense form of the sparse training matrix",
                      hint="select or reduce columns (the engine stores the training points "
                           "densely)")

    def blocks(self, X, statistics=None):
        """Dense encoded blocks of the checked inputs ``X``, each within the memory budget;
        float32 input stays float32 (as validate_data's dtype=[float64, float32] keeps it).
        ``statistics``: the rows' target statistics to take instead of the encoder's (the
        training rows' cross-fitted ones, from :meth:`fit`)."""
        dtypes = X.dtypes if pd is not None and isinstance(X, pd.DataFrame) else [X.dtype]
        dtype = np.float32 if all(d == np.float32 for d in dtypes) else np.float64
        # per row: the densified input row, the encoder's numbers and codes, the dense output
        row_bytes = 8 * (2 * X.shape[1] + self.layout.width)
        rows = plan_rows(X.shape[0], row_bytes=row_bytes, budget=budget_bytes())
        for block in self.encoder.transform_blocks(X, rows, statistics):
            yield self.layout.dense(block, dtype)

    def few_rows(self, estimator, X):
        """A few query rows (a web service's single row) of an array, or of a DataFrame of
        NumPy number (and string) columns, checked and encoded as one block directly (no block
        planning);
        the same numbers as :meth:`blocks`. ``None`` for other inputs."""
        frame = pd is not None and isinstance(X, pd.DataFrame)
        if not ((frame or (type(X) is np.ndarray and X.ndim == 2)) and 0 < X.shape[0] <= FEW_ROWS):
            return None
        if frame:
            dtypes = list(X.dtypes)
            if not _numbers_only(dtypes):
                # numbers and strings: encoded at once where the encoder can
                # (``_tabular.encode_mixed_rows``); other frames go the general way
                block = (self.encoder.encode_mixed_rows(X, dtypes)
                         if _named_as_fitted(estimator, X) else None)
                return None if block is None else self.layout.dense(block, np.float64)
            X = self.numeric_frame_rows(estimator, X, dtypes)
        else:
            X = self.check(estimator, X, False)
        if X is None:
            return None
        encoded = self.encoder.encode_float_rows(X)
        return self.layout.dense(self.encoder.transform(X) if encoded is None else encoded,
                                 np.float32 if X.dtype == np.float32 else np.float64)

    def linear_features(self, X, max_width):
        """Features of a linear model of encoded rows ``X`` (see the layouts)."""
        return self.layout.linear_features(X, max_width)


def _check_frame_columns(estimator, X):
    """check_array's errors for a frame without columns (its dtype probe of no column fails
    first) or rows (validate_data checks an empty copy: an array of no rows is its error too)
    and for complex columns (the object-typed copy that validate_data checks hides them; a
    float conversion would drop their imaginary parts)."""
    for axis, what in ((1, "feature"), (0, "sample")):
        if X.shape[axis] == 0:
            raise ValueError(f"Found array with 0 {what}(s) (shape={X.shape}) while a minimum "
                             f"of 1 is required by {type(estimator).__name__}.")
    complex_columns = [str(c) for c, d in X.dtypes.items() if pd.api.types.is_complex_dtype(d)]
    if complex_columns:
        raise ValueError(f"Complex data not supported: column(s) {complex_columns} of X.")


def _numbers_only(dtypes):
    """Whether every column dtype is a NumPy number (bool excluded)."""
    return all(isinstance(d, np.dtype) and d.kind in "iuf" for d in dtypes)


def _named_as_fitted(estimator, X):
    """Whether the columns of the frame ``X`` are the string names seen at fit, in order."""
    names = getattr(estimator, "feature_names_in_", None)
    columns = X.columns
    return (names is not None and len(columns) == len(names)
            and all(isinstance(c, str) for c in columns)
            and all(a == b for a, b in zip(columns, names, strict=True)))


class PrecomputedInput(TabularInput):
    """Distance matrices (``metric="precomputed"``): square at fit, one column per training
    point at prediction, non-negative, dense; encoded as the numbers they are."""

    def __init__(self):
        super().__init__(scaled=False, codes=False)

    def check(self, estimator, X, reset):
        if sparse.issparse(X):
            raise TypeError(
                "metric='precomputed' takes a dense distance matrix; a sparse one (a graph of "
                "some of the distances) is not supported: use X.toarray() with every distance."
            )
        X = validate_data(estimator, X, reset=reset, dtype=[np.float64, np.float32])
        if reset and X.shape[0] != X.shape[1]:
            raise ValueError(
                f"Precomputed matrix must be square. Input is a {X.shape[0]}x{X.shape[1]} "
                "matrix."
            )
        if np.any(X < 0):
            raise ValueError("Negative values in data passed to precomputed distance matrix.")
        return X

    def few_rows(self, estimator, X):
        """Distances always take the checks of :meth:`check`."""
        return None
