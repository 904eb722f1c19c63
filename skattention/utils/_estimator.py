"""What every skattention estimator shares with scikit-learn's own: callbacks and the link
of its HTML representation to its API page."""

from ._sklearn_compat import CallbackSupportMixin

# The API pages of the documentation (docs/api.rst: autosummary pages named after the
# top-level names, skattention.<Name>); "latest" for development versions. The same address
# is the project's Documentation URL in pyproject.toml (a test keeps them together).
DOCS_URL = "https://skattention.readthedocs.io/en/latest/"


class EstimatorMixin(CallbackSupportMixin):
    """scikit-learn's callbacks (``set_callbacks``, scikit-learn >= 1.9) and the "?" link of
    the notebook HTML representation to the estimator's API page."""

    _doc_link_module = "skattention"
    _doc_link_template = DOCS_URL + "generated/skattention.{estimator_name}.html"
