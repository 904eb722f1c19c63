"""Warnings reported at the user's line."""

import os
import sys
import warnings


def _package_dir(module_file, levels):
    path = os.path.abspath(module_file)
    for _ in range(levels):
        path = os.path.dirname(path)
    return path + os.sep


# The frames skipped: this package's, scikit-learn's (its _fit_context and set_output
# wrappers sit between the user and every fit and transform, and a Pipeline or a search calls
# the estimator on the user's behalf) and torch's (its no_grad decorators wrap the engine's
# functions; a module's __call__ sits between a training loop and the nn layer).
_SKIPPED = (_package_dir(__file__, 2),)
for _name in ("sklearn", "torch"):
    try:
        _SKIPPED += (_package_dir(__import__(_name).__file__, 1),)
    except ImportError:  # pragma: no cover - both are dependencies
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
