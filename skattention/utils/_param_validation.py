"""Parameter constraints of the estimators: scikit-learn's (through the compat module), Count and
DtypeOptions."""

from .._engine import dtype_name
from ._sklearn_compat import HasMethods, Hidden, Interval, StrOptions, validate_params

__all__ = [
    "Count",
    "DtypeOptions",
    "HasMethods",
    "Hidden",
    "Interval",
    "StrOptions",
    "dtype_name",
    "validate_params",
]


class Count(Interval):
    """``Interval(Integral, ...)`` that rejects ``True``/``False``.

    ``bool`` is an ``Integral``, so scikit-learn's interval accepts ``hidden_size=True`` or
    ``batch_size=True``; such a value is a mistake, and reached torch as a bool size.
    """

    def is_satisfied_by(self, val):
        return not isinstance(val, bool) and super().is_satisfied_by(val)


class DtypeOptions(StrOptions):
    """``StrOptions`` of dtype names that also takes the NumPy and torch dtypes they name.

    NumPy and torch users pass ``dtype=np.float64``, ``np.dtype("float64")`` or
    ``torch.float64``; each names the option ``"float64"``. Strings must be the options
    themselves, as before. The estimator keeps the value as passed (``get_params``) and reads it
    with :func:`dtype_name` where it is used.
    """

    def is_satisfied_by(self, val):
        if isinstance(val, str):
            return super().is_satisfied_by(val)
        return dtype_name(val) in self.options

    def __str__(self):
        return f"{super().__str__()} or a NumPy or torch dtype of one of them"
