"""Before/after identity of every estimator: outputs and fitted attributes, bit for bit.

A refactoring that must not change behaviour is checked by running this script on the code
before (``save``) and after (``compare``) it::

    python benchmarks/check_identity.py save /tmp/before.pkl      # on the old commit
    python benchmarks/check_identity.py compare /tmp/before.pkl   # on the new one

It fits every public estimator in many configurations (each metric of the metric-attention
estimators with its special cases, sample and class weights, several outputs, a DataFrame with
categories and missing values, a warm start, float32 and float64 inputs, a Dask fit), records
what the public methods return, the public fitted attributes (names ending in ``_``; a torch
module by its state dict), the predictions of a pickled and loaded copy, and the engine's
``attention`` / ``kneighbors`` on their own, then compares two such records for exact equality
(NaN equal to NaN). Not a test: it takes a minute or two and needs the code before the change.
"""

import argparse
import math
import pickle
import sys
import warnings

import numpy as np
import torch

_ESTIMATOR_SEED = 0


def _flat(value, prefix, out):
    """``value`` as name -> array entries (nested containers and torch modules flattened)."""
    if isinstance(value, torch.nn.Module):
        for name, tensor in value.state_dict().items():
            out[f"{prefix}.{name}"] = tensor.detach().cpu().numpy().copy()
    elif isinstance(value, torch.Tensor):
        out[prefix] = value.detach().cpu().numpy().copy()
    elif isinstance(value, dict):
        for key, item in value.items():
            _flat(item, f"{prefix}[{key!r}]", out)
    elif isinstance(value, (list, tuple)):
        out[f"{prefix}.len"] = np.array(len(value))
        for i, item in enumerate(value):
            _flat(item, f"{prefix}[{i}]", out)
    elif isinstance(value, np.ndarray) and value.dtype == object:
        out[f"{prefix}.len"] = np.array(len(value))
        for i, item in enumerate(value.ravel()):
            _flat(item, f"{prefix}[{i}]", out)
    elif hasattr(value, "get_params") and hasattr(value, "__dict__"):  # a fitted sub-estimator
        for name, item in vars(value).items():
            if name.endswith("_") and not name.startswith("_"):
                _flat(item, f"{prefix}.{name}", out)
    elif value is None or isinstance(value, (bool, int, float, str, np.generic, np.ndarray)):
        out[prefix] = np.asarray(value) if value is not None else np.array("None")
    else:
        out[prefix] = np.array(repr(type(value)))


def _fitted(estimator, prefix, out):
    for name, value in sorted(vars(estimator).items()):
        if name.endswith("_") and not name.startswith("_") and name != "n_features_in_":
            _flat(value, f"{prefix}.{name}", out)
    for name in ("n_features_in_", "feature_names_in_"):
        if hasattr(estimator, name):
            _flat(getattr(estimator, name), f"{prefix}.{name}", out)


def _call(out, name, function, *args, **kwargs):
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = function(*args, **kwargs)
        _flat(result, name, out)
        for i, w in enumerate(caught):
            out[f"{name}.warning[{i}]"] = np.array(f"{w.category.__name__}: {w.message}")
    except Exception as exc:  # noqa: BLE001 - the error is part of the behaviour
        out[f"{name}.error"] = np.array(f"{type(exc).__name__}: {exc}")


def _data(seed, n=120, d=5, dtype=np.float64):
    rng = np.random.RandomState(seed)
    X = rng.normal(size=(n, d)).astype(dtype)
    y = (X[:, 0] + 0.5 * X[:, 1] ** 2 > 0.3).astype(int) + (X[:, 2] > 1)
    t = X[:, 0] * 2 + np.sin(X[:, 1]) + 0.1 * rng.normal(size=n)
    return X, y, t


def _frame(seed, n=150):
    import pandas as pd

    rng = np.random.RandomState(seed)
    a = rng.normal(size=n)
    a[rng.rand(n) < 0.1] = np.nan
    frame = pd.DataFrame({
        "a": a,
        "b": rng.randint(0, 5, size=n),
        "c": pd.Categorical(rng.choice(["x", "y", "z"], size=n)),
        "d": rng.choice(["p", "q"], size=n).astype(object),
    })
    y = ((np.nan_to_num(a) > 0) ^ (frame["c"] == "x")).astype(int).to_numpy()
    return frame, y


def neighbors_cases():
    from skattention import (
        MetricAttentionClassifier,
        MetricAttentionRegressor,
        MetricAttentionTransformer,
    )

    learned = dict(max_iter=3, hidden_size=8, random_state=_ESTIMATOR_SEED)
    for dtype in (np.float64, np.float32):
        tag = np.dtype(dtype).name
        X, y, t = _data(1, dtype=dtype)
        Xq = _data(2, n=40, dtype=dtype)[0]
        w = np.random.RandomState(3).randint(0, 3, size=len(X)).astype(float)
        configs = []
        for metric in ("euclidean", "tabular", "mlp", "linear", "dot"):
            extra = {} if metric == "euclidean" else learned
            configs += [
                (metric, dict(metric=metric, **extra)),
                (f"{metric}-knn", dict(metric=metric, n_neighbors=5, temperature=math.inf,
                                       **extra)),
                (f"{metric}-T0", dict(metric=metric, temperature=0, **extra)),
                (f"{metric}-T0.7", dict(metric=metric, temperature=0.7, **extra)),
            ]
            if metric != "dot":
                configs.append((f"{metric}-radius", dict(metric=metric, radius=2.5,
                                                         temperature=math.inf, **extra)))
        configs += [
            ("euclidean-knn-T1", dict(metric="euclidean", n_neighbors=4, temperature=1.0)),
            ("tabular-nocs", dict(metric="tabular", early_stopping=False, **learned)),
            ("mlp-ncomp3", dict(metric="mlp", n_components=3, n_blocks=2, dropout=0.1,
                                **learned)),
            ("tabular-plr", dict(metric="tabular", numeric_embedding="plr", **learned)),
            ("tabular-f64", dict(metric="tabular", dtype="float64", **learned)),
            ("euclidean-f32", dict(metric="euclidean", dtype="float32")),
        ]
        for name, params in configs:
            yield (f"clf-{name}-{tag}", MetricAttentionClassifier, params, X, y, Xq, None)
            yield (f"reg-{name}-{tag}", MetricAttentionRegressor, params, X, t, Xq, None)
        yield (f"clf-weights-{tag}", MetricAttentionClassifier,
               dict(metric="euclidean", n_neighbors=5, temperature=math.inf), X, y, Xq, w)
        yield (f"clf-weights-auto-{tag}", MetricAttentionClassifier,
               dict(metric="euclidean", class_weight="balanced"), X, y, Xq, w)
        yield (f"clf-weights-learned-{tag}", MetricAttentionClassifier,
               dict(metric="tabular", class_weight="balanced", **learned), X, y, Xq, w)
        yield (f"reg-weights-{tag}", MetricAttentionRegressor,
               dict(metric="mlp", **learned), X, t, Xq, w)
        yield (f"reg-trend-{tag}", MetricAttentionRegressor,
               dict(metric="euclidean", trend="linear"), X, t, Xq, None)
        yield (f"clf-multi-{tag}", MetricAttentionClassifier,
               dict(metric="euclidean", n_neighbors=3, temperature=math.inf), X,
               np.column_stack([y, (t > 0).astype(int)]), Xq, None)
        yield (f"clf-multi-learned-{tag}", MetricAttentionClassifier, dict(metric="mlp", **learned),
               X, np.column_stack([y, (t > 0).astype(int)]), Xq, None)
        yield (f"reg-multi-{tag}", MetricAttentionRegressor, dict(metric="tabular", **learned), X,
               np.column_stack([t, -t]), Xq, None)
        yield (f"clf-radius-outlier-{tag}", MetricAttentionClassifier,
               dict(metric="euclidean", radius=0.8, temperature=math.inf,
                    outlier_label="most_frequent"), X, y, Xq * 3, None)
        yield (f"trans-tabular-{tag}", MetricAttentionTransformer, learned, X, y, Xq, None)
        yield (f"trans-linear-{tag}", MetricAttentionTransformer,
               dict(metric="linear", n_components=2, **learned), X, y, Xq, None)
        # precomputed distances
        D = np.sqrt(((X[:, None, :].astype(np.float64) - X[None]) ** 2).sum(-1)).astype(dtype)
        Dq = np.sqrt(((Xq[:, None, :].astype(np.float64) - X[None]) ** 2).sum(-1)).astype(dtype)
        for name, params in [("knn", dict(n_neighbors=5, temperature=math.inf)),
                             ("T1", dict(temperature=1.0)), ("T0", dict(temperature=0)),
                             ("radius", dict(radius=2.5, temperature=math.inf))]:
            yield (f"clf-pre-{name}-{tag}", MetricAttentionClassifier,
                   dict(metric="precomputed", **params), D, y, Dq, None)
            yield (f"reg-pre-{name}-{tag}", MetricAttentionRegressor,
                   dict(metric="precomputed", **params), D, t, Dq, None)
    frame, yf = _frame(4)
    for metric in ("tabular", "mlp", "euclidean"):
        extra = {} if metric == "euclidean" else learned
        yield (f"clf-frame-{metric}", MetricAttentionClassifier, dict(metric=metric, **extra),
               frame, yf, frame.iloc[:30], None)
        yield (f"reg-frame-{metric}", MetricAttentionRegressor, dict(metric=metric, **extra),
               frame, frame["b"].to_numpy() * 1.5 + yf, frame.iloc[:30], None)


def run_neighbors(out):
    for name, cls, params, X, y, Xq, w in neighbors_cases():
        est = cls(**params)
        _call(out, f"{name}.fit", lambda e=est: e.fit(X, y, sample_weight=w) and None)
        if f"{name}.fit.error" in out:
            continue
        _fitted(est, name, out)
        methods = ["predict", "predict_proba", "transform"]
        for method in methods:
            if hasattr(est, method):
                _call(out, f"{name}.{method}", getattr(est, method), Xq)
                _call(out, f"{name}.{method}.row", getattr(est, method), Xq[:1])
        if hasattr(est, "kneighbors"):
            _call(out, f"{name}.kneighbors", est.kneighbors, Xq, 3)
            _call(out, f"{name}.kneighbors.self", est.kneighbors, None, 2)
            _call(out, f"{name}.radius_neighbors", est.radius_neighbors, Xq, 1.2, True, True)
        _call(out, f"{name}.attention_weights", est.attention_weights, Xq, 4)
        _call(out, f"{name}.attention_weights.self", est.attention_weights, None, 3)
        if hasattr(est, "score") and not name.startswith("trans"):
            _call(out, f"{name}.score", est.score, X, y)
        loaded = pickle.loads(pickle.dumps(est))
        method = "predict" if hasattr(loaded, "predict") else "transform"
        _call(out, f"{name}.pickled.{method}", getattr(loaded, method), Xq)
        warm = params.get("metric") in ("mlp", "tabular") and "frame" not in name
        if warm:
            est.set_params(warm_start=True, max_iter=2)
            _call(out, f"{name}.warm.fit", lambda e=est: e.fit(X, y, sample_weight=w) and None)
            _fitted(est, f"{name}.warm", out)
            _call(out, f"{name}.warm.{method}", getattr(est, method), Xq)


def run_others(out):
    from skattention import (
        AttentionDiffusionEmbedding,
        AttentionKMeans,
        AttentionMeanShift,
        AttentionNetworkClassifier,
    )

    for dtype in (np.float64, np.float32):
        tag = np.dtype(dtype).name
        X, y, _ = _data(5, n=200, d=4, dtype=dtype)
        Xq = _data(6, n=30, d=4, dtype=dtype)[0]
        cases = [
            ("kmeans", AttentionKMeans(n_clusters=3, random_state=0, n_init=2)),
            ("kmeans-T", AttentionKMeans(n_clusters=3, temperature=0.5, random_state=0)),
            ("kmeans-anneal", AttentionKMeans(n_clusters=3, temperature="anneal",
                                              random_state=0)),
            ("meanshift", AttentionMeanShift()),
            ("meanshift-bw", AttentionMeanShift(bandwidth=1.0, max_iter=30)),
            ("diffusion", AttentionDiffusionEmbedding(n_components=2, random_state=0)),
            ("diffusion-knn", AttentionDiffusionEmbedding(n_components=2, n_neighbors=10,
                                                          random_state=0)),
        ]
        for name, est in cases:
            name = f"{name}-{tag}"
            _call(out, f"{name}.fit", lambda e=est: e.fit(X) and None)
            if f"{name}.fit.error" in out:
                continue
            _fitted(est, name, out)
            for method in ("predict", "transform"):
                if hasattr(est, method):
                    _call(out, f"{name}.{method}", getattr(est, method), Xq)
            loaded = pickle.loads(pickle.dumps(est))
            if hasattr(loaded, "transform"):
                _call(out, f"{name}.pickled.transform", loaded.transform, Xq)
        net = AttentionNetworkClassifier(width=8, max_iter=5, random_state=0)
        _call(out, f"net-{tag}.fit", lambda: net.fit(X, y) and None)
        _fitted(net, f"net-{tag}", out)
        _call(out, f"net-{tag}.predict_proba", net.predict_proba, Xq)


def run_engine(out):
    from skattention import attention, kneighbors

    rng = np.random.RandomState(7)
    for dtype in (torch.float64, torch.float32):
        tag = str(dtype)
        Q = rng.normal(size=(70, 6))
        K = rng.normal(size=(3000, 6))
        V = rng.normal(size=(3000, 2))
        prior = np.log(rng.rand(3000))
        for metric in ("sqeuclidean", "euclidean", "dot"):
            for name, kwargs in [("T1", dict(temperature=1.0)),
                                 ("knn", dict(n_neighbors=7, temperature=math.inf)),
                                 ("T0", dict(temperature=0)),
                                 ("prior", dict(temperature=0.5, log_prior=prior)),
                                 ("weights", dict(temperature=2.0, return_weights=True,
                                                  n_weights=5)),
                                 ("small", dict(temperature=1.0, working_memory=0.05))]:
                if name == "small":
                    from skattention import config_context

                    with config_context(working_memory=0.05):
                        _call(out, f"attention-{metric}-{name}-{tag}", attention, Q, K, V,
                              metric=metric, dtype=dtype, temperature=1.0)
                    continue
                _call(out, f"attention-{metric}-{name}-{tag}", attention, Q, K, V,
                      metric=metric, dtype=dtype, **kwargs)
            if metric != "dot":
                _call(out, f"attention-{metric}-radius-{tag}", attention, Q, K, V,
                      metric=metric, dtype=dtype, radius=2.5, temperature=math.inf,
                      on_empty="zero")
            _call(out, f"kneighbors-{metric}-{tag}", kneighbors, Q, K, 5, metric=metric,
                  dtype=dtype)
        _call(out, f"kneighbors-big-{tag}", kneighbors, rng.normal(size=(3000, 8)),
              rng.normal(size=(20000, 8)), 5, dtype=dtype)


def run_dask(out):
    import dask.array as da

    from skattention import MetricAttentionClassifier, MetricAttentionRegressor

    X, y, t = _data(8, n=300)
    Xd, yd, td = da.from_array(X, chunks=100), da.from_array(y, chunks=100), \
        da.from_array(t, chunks=100)
    Xq = _data(9, n=20)[0]
    for name, cls, target in [("clf", MetricAttentionClassifier, yd),
                              ("reg", MetricAttentionRegressor, td)]:
        for cfg, params in [("knn", dict(metric="euclidean", n_neighbors=5,
                                         temperature=math.inf)),
                            ("T", dict(metric="euclidean", temperature=1.0)),
                            ("learned", dict(metric="mlp", max_iter=2, hidden_size=8,
                                             random_state=0))]:
            est = cls(**params)
            key = f"dask-{name}-{cfg}"
            _call(out, f"{key}.fit", lambda e=est, target=target: e.fit(Xd, target) and None)
            if f"{key}.fit.error" in out:
                continue
            _fitted(est, key, out)
            _call(out, f"{key}.predict", est.predict, Xq)
            _call(out, f"{key}.predict.dask", lambda e=est: e.predict(da.from_array(Xq, 10))
                  .compute())
            _call(out, f"{key}.kneighbors", est.kneighbors, Xq, 3)
            loaded = pickle.loads(pickle.dumps(est))
            _call(out, f"{key}.pickled.predict", loaded.predict, Xq)


def record():
    import dask

    torch.manual_seed(0)
    out = {}
    run_engine(out)
    run_neighbors(out)
    run_others(out)
    with dask.config.set(scheduler="synchronous"):
        run_dask(out)
    return out


def _equal(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind in "fc":
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b))


def compare(before, after):
    missing = sorted(set(before) - set(after))
    added = sorted(set(after) - set(before))
    differ = [k for k in sorted(set(before) & set(after)) if not _equal(before[k], after[k])]
    for k in missing:
        print("missing after:", k)
    for k in added:
        print("new after:", k)
    for k in differ:
        a, b = before[k], after[k]
        detail = ""
        if a.dtype.kind in "f" and a.shape == b.shape and b.dtype.kind == "f":
            detail = f" max abs diff {np.nanmax(np.abs(a.astype(float) - b)):.3g}"
        print(f"differs: {k} ({a.dtype}{a.shape} vs {b.dtype}{b.shape}){detail}")
        if a.size < 4 and a.dtype.kind in "UO":
            print("   before:", a, "\n   after: ", b)
    print(f"{len(before)} entries before, {len(after)} after: {len(differ)} differ, "
          f"{len(missing)} missing, {len(added)} new")
    return not (differ or missing)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=["save", "compare"])
    parser.add_argument("path")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    out = record()
    if args.action == "save":
        with open(args.path, "wb") as f:
            pickle.dump(out, f)
        print(f"{len(out)} entries saved to {args.path}")
        return 0
    with open(args.path, "rb") as f:
        before = pickle.load(f)
    return 0 if compare(before, out) else 1


if __name__ == "__main__":
    sys.exit(main())
