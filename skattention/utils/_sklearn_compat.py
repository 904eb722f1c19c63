"""The one module that imports private scikit-learn names (as imbalanced-learn's module of the
same name does): when scikit-learn moves or changes them, this file alone changes.

Supported: scikit-learn >= 1.6 (``validate_data`` and ``__sklearn_tags__`` first appear in 1.6).
Tested: 1.6.1 and 1.9.1. There is no upper bound: an upstream change to these names breaks this
module's imports at once, in CI, rather than silently.

Private torch names: none are needed. The engine (torch only, which must not import this module
since it imports scikit-learn) tells dropout modules apart by their public classes.
"""

from sklearn.base import _fit_context
from sklearn.utils._param_validation import (
    HasMethods,
    Hidden,
    Interval,
    StrOptions,
    validate_params,
)
from sklearn.utils.validation import _check_sample_weight

__all__ = [
    "HasMethods",
    "Hidden",
    "Interval",
    "StrOptions",
    "_check_sample_weight",
    "_fit_context",
    "validate_params",
]
