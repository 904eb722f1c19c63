"""Prototype of the tabular recipe of issue 15 (a ModernNCA-style retrieval model), for
``bench_tabular.py``. Phase 2 moves the winning pieces into ``skattention._engine`` and the
estimators; see ``model.py``'s docstring for what goes where."""

from .model import RECIPE, TabularAttentionClassifier, TabularAttentionRegressor

__all__ = ["RECIPE", "TabularAttentionClassifier", "TabularAttentionRegressor"]
