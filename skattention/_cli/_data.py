"""The data of every subcommand: scikit-learn's digits, or the user's CSV read by pandas.

The arguments and the file are checked here before anything imports torch or scikit-learn's
estimators (pandas comes in to read the CSV, scikit-learn's loader only for the digits).
"""

import csv
import os
import re
import shlex
import warnings

import numpy as np

from ._common import CLIError, note, progress

# the missing-value markers of pandas.read_csv, plus the spellings people type
_MISSING = ["null", "NULL", "none", "None", "?"]
# a cell of a column written with decimal commas: integers, or digits with one comma
_DECIMAL_COMMA_CELL = r"[-+]?(\d+(,\d*)?|,\d+)([eE][-+]?\d+)?"
# names that say "identifier" (whole names, compared in lower case), and suffixes that do
_ID_NAMES = {"id", "index", "idx", "rowid", "row_id", "row id", "row", "unnamed: 0"}
_ID_SUFFIXES = ("_id", " id", "-id", ".id")
# a distinct integer in every row says "identifier" only when there are enough rows
_ID_MIN_ROWS = 20


def load_data(args, tabular=False):
    """``X, y, dataset``: digits by default, else the user's CSV; ``y`` is None without a
    target. ``dataset`` is ``{"name", "n_samples", "n_features"}``.

    ``tabular``: text columns and missing values stay in a DataFrame, for estimators that encode
    them; otherwise the features must be numbers without missing values."""
    check_data_arguments(args)
    if args.data is None:
        from sklearn.datasets import load_digits

        X, y = load_digits(return_X_y=True)
        name = "digits (scikit-learn)"
    else:
        X, y = read_csv(args, tabular)
        name = args.data
    if args.max_samples is not None and args.max_samples < X.shape[0]:
        keep = np.sort(np.random.default_rng(0).choice(X.shape[0], args.max_samples, replace=False))
        X = X.iloc[keep] if hasattr(X, "iloc") else X[keep]
        y = None if y is None else y[keep]
    progress(args, f"data: {name}, {X.shape[0]} samples x {X.shape[1]} features")
    return X, y, {"name": name, "n_samples": int(X.shape[0]), "n_features": int(X.shape[1])}


def check_data_arguments(args):
    """The data options that contradict each other, without reading anything."""
    if args.max_samples is not None and args.max_samples < 2:
        raise CLIError(f"--max-samples must be at least 2, got {args.max_samples}")
    if args.data is None:
        for option, given in (("--target", args.target), ("--drop", args.drop),
                              ("--sep", args.sep), ("--decimal", args.decimal)):
            if given:
                raise CLIError(f"{option} needs --data")
    elif args.command == "compare" and args.target is None:
        raise CLIError("--data needs --target COLUMN")
    elif not os.path.exists(args.data):  # before pandas is imported (pandas says so too)
        raise CLIError(f"cannot read {args.data!r}: no such file")


def read_csv(args, tabular):
    """``(X, y)`` from ``args.data`` read by pandas: the features (an array of numbers, or a
    DataFrame when ``tabular`` and a column holds text or missing values) and the target."""
    try:
        import pandas as pd
    except ImportError:
        raise CLIError("reading a CSV needs pandas: pip install \"skattention[csv]\"") from None
    frame = _read_table(args, pd)
    columns = ", ".join(frame.columns)
    for name in [*args.drop, *([args.target] if args.target is not None else [])]:
        if name not in frame.columns:
            kind = "target column" if name == args.target else "--drop column"
            raise CLIError(f"{kind} {name!r} not found in {args.data!r}; columns are: {columns}")
    if args.target is not None and args.target in args.drop:
        raise CLIError(f"the target column {args.target!r} cannot be dropped")
    y = None if args.target is None else _target(frame[args.target], args.target, pd)
    X = frame.drop(columns=[*args.drop, *([args.target] if args.target else [])])
    if X.shape[1] == 0:
        raise CLIError(f"{args.data!r} has no feature columns left (columns: {columns})")
    values = features(X, tabular)  # an error here names its column and --drop already
    for column, reason in id_like_columns(X):
        note(args, f"hint: column {column!r} looks like an identifier ({reason}) and is used as "
             f"a feature; leave it out with --drop {shlex.quote(column)}")
    return values, y


def _read_table(args, pd):
    """The CSV as a DataFrame with stripped column names; decimal commas read as numbers when
    ``--decimal ,`` says so, or when a ';' file has a column written that way."""
    path, encoding = args.data, args.encoding
    sep = separator(args.sep) if args.sep else sniff_separator(path, encoding)
    if args.decimal == sep:
        raise CLIError(f"--decimal {args.decimal!r} is also the separator; give another --sep")
    frame = _read_frame(pd, path, sep, args.decimal or ".", encoding)
    if args.decimal is None and sep == ";" and _has_decimal_commas(frame, pd):
        commas = _read_frame(pd, path, sep, ",", encoding)
        # a column read as numbers with points stays numbers, else the guess was wrong
        if _numeric_columns(frame, pd) < _numeric_columns(commas, pd):
            frame = commas
            progress(args, "numbers with decimal commas detected (--decimal . keeps them as text)")
    frame.columns = [str(c).strip() for c in frame.columns]
    if frame.shape[0] < 1:
        raise CLIError(f"{path!r} needs a header row and at least one data row")
    return frame


def _read_frame(pd, path, sep, decimal, encoding):
    """``pandas.read_csv`` with its failures as one-line errors."""
    try:
        with warnings.catch_warnings():
            # index_col=False: a first data row longer than the header is an error (pandas
            # would otherwise take its first column as the index, or drop its extra fields)
            warnings.simplefilter("error", pd.errors.ParserWarning)
            return pd.read_csv(path, sep=sep, decimal=decimal, encoding=encoding,
                               na_values=_MISSING, skipinitialspace=True, index_col=False)
    except pd.errors.ParserWarning:
        raise CLIError(f"{path!r} has rows with more fields than its header (separator "
                       f"{sep!r}; give another with --sep)") from None
    except FileNotFoundError:
        raise CLIError(f"cannot read {path!r}: no such file") from None
    except OSError as exc:
        raise CLIError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    except LookupError:
        raise CLIError(f"unknown --encoding {encoding!r}") from None
    except UnicodeDecodeError:
        raise CLIError(f"{path!r} is not {encoding} text; give its encoding with --encoding "
                       "(e.g. latin-1 or cp1252)") from None
    except pd.errors.EmptyDataError:
        raise CLIError(f"{path!r} needs a header row and at least one data row") from None
    except pd.errors.ParserError as exc:
        reason = str(exc).strip().splitlines()[-1]
        raise CLIError(f"{path!r} is not valid CSV with separator {sep!r}: {reason}") from None


def _has_decimal_commas(frame, pd):
    """Whether a column read as text holds only numbers, some with a decimal comma."""
    for column in frame.columns:
        if pd.api.types.is_numeric_dtype(frame[column]):
            continue
        cells = frame[column].dropna().astype(str).str.strip()
        if (cells.size and cells.str.fullmatch(_DECIMAL_COMMA_CELL).all()
                and cells.str.contains(",", regex=False).any()):
            return True
    return False


def _numeric_columns(frame, pd):
    return {c for c in frame.columns if pd.api.types.is_numeric_dtype(frame[c])}


def _target(target, name, pd):
    """The target column as floats when it holds numbers, else as strings."""
    missing = np.flatnonzero(target.isna().to_numpy())
    if missing.size:
        raise CLIError(f"target column {name!r} has {missing.size} missing values "
                       f"(data rows {', '.join(str(i + 1) for i in missing[:5])}); "
                       "drop those rows first")
    return target.to_numpy(dtype=np.float64 if pd.api.types.is_numeric_dtype(target) else str)


def separator(sep):
    """``--sep`` as typed: ``\\t`` or ``tab`` mean a tab."""
    return "\t" if sep in ("\\t", "tab", "TAB") else sep


def sniff_separator(path, encoding):
    """The separator among , ; tab | that makes the first lines consistent (else a comma)."""
    try:
        with open(path, encoding=encoding, newline="") as handle:
            sample = handle.read(65536)
    except (OSError, LookupError, UnicodeDecodeError):
        return ","  # pandas reports the problem
    lines = sample.splitlines()
    sample = "\n".join(lines[:-1] if len(lines) > 2 else lines)  # the last line may be cut
    try:
        return csv.Sniffer().sniff(sample, delimiters=",;\t|").delimiter
    except csv.Error:
        return ","


def id_like_columns(X):
    """``[(column, reason)]``: the columns of ``X`` with a distinct value in every row and a
    name such as ``id``, or a distinct integer in every row of a table with enough rows."""
    import pandas as pd

    found = []
    for column in X.columns:
        values = X[column]
        if len(values) < 2 or values.isna().any() or not values.is_unique:
            continue
        lower = str(column).lower()
        if lower in _ID_NAMES or lower.endswith(_ID_SUFFIXES) or re.search(r"[a-z]ID$", column):
            found.append((column, "its name, and a different value in every row"))
        elif (len(values) >= _ID_MIN_ROWS and pd.api.types.is_integer_dtype(values)
              and not pd.api.types.is_bool_dtype(values)):
            found.append((column, "a different integer in every row"))
    return found


def features(X, tabular):
    """The feature columns as a float array when they are numbers without missing values; else
    the DataFrame (``tabular``) or a one-line error naming the first column at fault."""
    import pandas as pd

    numeric = all(pd.api.types.is_numeric_dtype(X[c]) or pd.api.types.is_bool_dtype(X[c])
                  for c in X.columns)
    if numeric:
        values = X.to_numpy(dtype=np.float64, na_value=np.nan)
        if np.isinf(values).any():
            raise CLIError("features contain infinite values")
        if not np.isnan(values).any():
            return values
    if tabular:
        return X
    for column in X.columns:
        if not pd.api.types.is_numeric_dtype(X[column]):
            cells = X[column].dropna()
            bad = pd.to_numeric(cells, errors="coerce").isna()
            row = cells.index[bad.to_numpy()][0] if bad.any() else cells.index[0]
            raise CLIError(
                f"column {column!r} is not numeric (data row {row + 1}: {X[column][row]!r}); "
                f"encode it first or leave it out with --drop {column}"
            )
        missing = np.flatnonzero(X[column].isna().to_numpy())
        if missing.size:
            raise CLIError(
                f"column {column!r} has a missing value (data row {missing[0] + 1}); impute it "
                f"or leave the column out with --drop {column}"
            )
    raise CLIError("the features are not numbers")  # not reached: a column is at fault


def task_of(y, requested):
    """``"classification"`` or ``"regression"``: as ``--task`` asks, or guessed from ``y``."""
    try:
        numeric = y.astype(np.float64)
    except ValueError:
        numeric = None
    if requested == "regression":
        if numeric is None:
            raise CLIError("--task regression needs a numeric target")
        return "regression"
    if requested == "classification":
        return "classification"
    if numeric is None:
        return "classification"
    # numeric targets: integer-valued with few distinct values are labels
    distinct = np.unique(numeric).size
    integer = np.all(np.mod(numeric, 1) == 0)
    return "classification" if integer and distinct <= max(20, int(0.05 * y.size)) else "regression"


def labels(y):
    """The target as class labels, or None when there is none or it is continuous."""
    if y is None or task_of(y, "auto") == "regression":
        return None
    return y


def scaled(X, scale):
    """``X`` standardised when ``scale``."""
    if not scale:
        return X
    from sklearn.preprocessing import StandardScaler

    return StandardScaler().fit_transform(X)
