"""
Attention next to k-NN in one GridSearchCV
==========================================

Metric attention contains k-NN as an exact special case (``n_neighbors=k, temperature=inf``).
One grid search therefore compares, on scikit-learn's digits, the classical estimator with its
attention generalisations: a Gaussian kernel over all training points (``n_neighbors=None``,
temperature chosen by leave-one-out) and a k-NN prior with a finite temperature.
"""

import numpy as np
import pandas as pd
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV, StratifiedKFold
from sklearn.neighbors import KNeighborsClassifier
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from skattention import MetricAttentionClassifier

X, y = load_digits(return_X_y=True)
pipe = Pipeline([("scale", StandardScaler()), ("model", KNeighborsClassifier())])
param_grid = [
    {"model": [KNeighborsClassifier()], "model__n_neighbors": [1, 5, 15]},
    {
        "model": [MetricAttentionClassifier()],
        "model__n_neighbors": [None, 5, 15],
        "model__temperature": ["auto", np.inf],
    },
]
search = GridSearchCV(pipe, param_grid, cv=StratifiedKFold(5, shuffle=True, random_state=0))
search.fit(X, y)

results = pd.DataFrame(search.cv_results_)
results["model"] = [type(p["model"]).__name__ for p in results["params"]]
columns = ["model", "param_model__n_neighbors", "param_model__temperature", "mean_test_score", "std_test_score", "mean_fit_time"]
print(results[columns].sort_values("mean_test_score", ascending=False).to_string(index=False))
print("best:", search.best_params_)
