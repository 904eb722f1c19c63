"""Warnings reported at the user's line (standard library only)."""

import os
import sys
import warnings


def _package_dir(module_file, levels):
    path = os.path.abspath(module_file)
    for _ in range(levels):
        path = os.path.dirname(path)
    return path + os.sep


# The frames skipped: this package's, and scikit-learn's (its _fit_context and set_output
# wrappers sit between the user and every fit and transform, and a Pipeline or a search calls
# the estimator on the user's behalf).
_SKIPPED = (_package_dir(__file__, 2),)
try:
    import sklearn

    _SKIPPED += (_package_dir(sklearn.__file__, 1),)
except ImportError:  # pragma: no cover - scikit-learn is a dependency
    pass


def warn_user(message, category=UserWarning):
    """``warnings.warn`` reported at the first frame outside skattention and scikit-learn.

    A fixed ``stacklevel`` cannot reach the user's call: the number of wrappers in between
    depends on the method (``fit`` under ``_fit_context``, ``fit_predict``, ``set_output``) and
    the caller (a Pipeline). Python 3.12's ``skip_file_prefixes`` does this; 3.11 is supported.
    """
    frame, level = sys._getframe(1), 2
    while frame is not None and frame.f_code.co_filename.startswith(_SKIPPED):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
