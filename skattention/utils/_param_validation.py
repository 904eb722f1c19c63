"""Parameter constraints shared by the estimators."""

from sklearn.utils._param_validation import Interval


class Count(Interval):
    """``Interval(Integral, ...)`` that rejects ``True``/``False``.

    ``bool`` is an ``Integral``, so scikit-learn's interval accepts ``hidden_size=True`` or
    ``batch_size=True``; such a value is a mistake, and reached torch as a bool size.
    """

    def is_satisfied_by(self, val):
        return not isinstance(val, bool) and super().is_satisfied_by(val)
