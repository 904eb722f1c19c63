"""
Metric attention, k-NN and NCA + k-NN in one GridSearchCV
=========================================================

Metric attention contains k-NN as an exact special case (``metric="euclidean", n_neighbors=k,
temperature=inf``) and NCA's idea (a metric learned from labels by leave-one-out soft neighbours)
as its training rule. One grid search compares, on the same folds of scikit-learn's digits:

* ``KNeighborsClassifier`` on standardised features;
* ``NeighborhoodComponentsAnalysis`` followed by ``KNeighborsClassifier``;
* ``MetricAttentionClassifier`` over ``metric`` (fixed Euclidean, learned linear, learned MLP),
  ``temperature`` (learned / chosen, or the k-NN limit ``inf``) and ``n_neighbors``.
"""

import numpy as np
import pandas as pd
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV, StratifiedKFold
from sklearn.neighbors import KNeighborsClassifier, NeighborhoodComponentsAnalysis
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from skattention import MetricAttentionClassifier

X, y = load_digits(return_X_y=True)
pipe = Pipeline(
    [("scale", StandardScaler()), ("metric", "passthrough"), ("model", KNeighborsClassifier())]
)
param_grid = [
    {"model": [KNeighborsClassifier()], "model__n_neighbors": [1, 5]},
    {
        "metric": [NeighborhoodComponentsAnalysis(max_iter=30, random_state=0)],
        "model": [KNeighborsClassifier(5)],
    },
    {
        "model": [MetricAttentionClassifier(random_state=0)],
        "model__metric": ["euclidean", "linear", "mlp"],
        "model__temperature": ["auto", np.inf],
        "model__n_neighbors": [None, 5],
    },
]
search = GridSearchCV(
    pipe, param_grid, cv=StratifiedKFold(3, shuffle=True, random_state=0), n_jobs=1
)
search.fit(X, y)

results = pd.DataFrame(search.cv_results_)
results["pipeline"] = [
    ("NCA + " if not isinstance(p.get("metric", "passthrough"), str) else "")
    + type(p["model"]).__name__
    for p in results["params"]
]
columns = [
    "pipeline",
    "param_model__metric",
    "param_model__temperature",
    "param_model__n_neighbors",
    "mean_test_score",
    "std_test_score",
    "mean_fit_time",
]
print(results[columns].sort_values("mean_test_score", ascending=False).to_string(index=False))
print("best:", search.best_params_)
