"""Parameter constraints of the estimators: scikit-learn's (through the compat module) and Count."""

from ._sklearn_compat import HasMethods, Hidden, Interval, StrOptions, validate_params

__all__ = ["Count", "HasMethods", "Hidden", "Interval", "StrOptions", "validate_params"]


class Count(Interval):
    """``Interval(Integral, ...)`` that rejects ``True``/``False``.

    ``bool`` is an ``Integral``, so scikit-learn's interval accepts ``hidden_size=True`` or
    ``batch_size=True``; such a value is a mistake, and reached torch as a bool size.
    """

    def is_satisfied_by(self, val):
        return not isinstance(val, bool) and super().is_satisfied_by(val)
