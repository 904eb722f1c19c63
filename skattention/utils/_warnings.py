"""Warnings reported at the user's line, not at the library's."""

import os
import sys
import warnings

import sklearn

# Frames in these folders are skipped: skattention's own, and scikit-learn's (its ``_fit_context``
# wrapper sits between a user's ``fit`` call and the estimator's code; its meta-estimators
# between the user and the estimator).
_INTERNAL = tuple(os.path.dirname(os.path.abspath(module.__file__)) + os.sep
                  for module in (sys.modules[__name__.split(".")[0]], sklearn))


def warn_user(message, category=UserWarning):
    """``warnings.warn`` reported at the first caller outside skattention and scikit-learn
    (the user's line): a fixed ``stacklevel`` cannot know how many decorators and helpers lie
    between a public method and the warning."""
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_INTERNAL):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level + 1)
