"""Plots of what attention does: scikit-learn style Display objects (needs the ``plot`` extra).

Each display is built by a ``from_estimator`` (or ``from_data``) class method that computes what
to draw and calls :meth:`plot`; the figure's artists are kept as attributes ending in ``_``
(``ax_``, ``figure_``, ...), as in :mod:`sklearn.metrics` displays. matplotlib is imported only
when a display draws, so ``import skattention.plotting`` works without it.

- :class:`AttentionWeightsDisplay`: the training points one query attends to.
- :class:`TrainingCurveDisplay`: training loss, validation loss and score per epoch.
- :class:`DiffusionSpectrumDisplay`: the spectrum of ``I - S``, near-zero eigenvalues (clusters)
  highlighted.
- :class:`EmbeddingDisplay`: a 2-D embedding coloured by label.
"""

from ._attention_weights import AttentionWeightsDisplay
from ._embedding import EmbeddingDisplay
from ._spectrum import DiffusionSpectrumDisplay
from ._training import TrainingCurveDisplay

__all__ = [
    "AttentionWeightsDisplay",
    "DiffusionSpectrumDisplay",
    "EmbeddingDisplay",
    "TrainingCurveDisplay",
]
