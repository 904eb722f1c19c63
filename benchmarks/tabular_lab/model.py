"""A ModernNCA-style attention model over mixed-type tables (torch; prototype of issue 15).

Pipeline (every step a recipe key, ``RECIPE`` holds the defaults under test):

1. ``skattention.neighbors._tabular._TabularEncoder``: numeric columns scaled (``scaling``) with
   missing indicators, categorical columns as integer codes (rare levels grouped by
   ``min_frequency``).
2. Map ``phi``: numeric features through periodic embeddings (``num_embedding="plr"``: PLR-lite,
   ``n_frequencies`` frequencies ~ N(0, ``frequency_scale``), one shared linear layer to
   ``d_embedding`` and a ReLU) or as they are (``"none"``); categorical codes through learned
   embeddings summed into the output (the same as one-hot codes times a linear layer); a linear
   layer to ``dim``; optionally ``n_blocks`` MLP blocks.
3. Attention: ``p(y | x) = sum_j softmax_j(-d(phi(x), phi(x_j)) / T) y_j`` with ``d`` the
   Euclidean (``distance="euclidean"``, ModernNCA) or squared Euclidean distance.
4. Training: leave-one-out likelihood (squared error for regression) of minibatches of
   ``batch_size`` attending to themselves (self excluded) and to a ``sample_rate`` share of the
   other training points, AdamW; early stopping on a ``val_fraction`` validation split with
   ``patience`` epochs, at most ``max_epochs`` (and ``max_steps`` steps).
5. Calibration (``calibrate``): the temperature T that minimises the validation log-loss (squared
   error) given the trained map, by a 1-D search. Prediction attends to the training and the
   validation rows.
6. ``n_members`` independent members (different seeds) average their predictions.
"""

import copy
import math
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from skattention.neighbors._tabular import _TabularEncoder

RECIPE = {
    "scaling": "robust",
    "min_frequency": 1,
    "missing_indicators": True,
    "num_embedding": "plr",
    "n_frequencies": 24,
    "frequency_scale": 0.04,
    "d_embedding": 12,
    "dim": 128,
    "n_blocks": 0,
    "d_block": 256,
    "dropout": 0.1,
    "distance": "euclidean",
    "lr": 0.01,
    "weight_decay": 2e-4,
    "batch_size": 1024,
    "sample_rate": 0.5,
    "max_candidates": 1024,
    "val_fraction": 0.15,
    "max_epochs": 100,
    "patience": 8,
    "max_steps": 2000,
    "calibrate": True,
    # validation pass of each epoch against at most this many training rows as keys (a fixed
    # random subsample; 0: all of them); calibration and prediction still use all keys
    "val_keys": 0,
    "n_members": 1,
    "categorical_features": "from_dtype",
    # size rules for the numeric embedding (n = training rows): below ``none_below`` the numbers
    # enter the linear layer as they are; below ``mix_below`` two members, one with PLR and one
    # without, are averaged (``n_members`` then does not apply)
    "none_below": 1500,
    "mix_below": 0,
}

_EPS = 1e-7


class _Map(nn.Module):
    def __init__(self, n_num, cardinalities, r, generator):
        super().__init__()
        self.n_num, self.r = n_num, r
        d_in = 0
        if n_num and r["num_embedding"] == "plr":
            self.freq = nn.Parameter(torch.randn(n_num, r["n_frequencies"], generator=generator)
                                     * r["frequency_scale"])
            self.plr = nn.Linear(2 * r["n_frequencies"], r["d_embedding"])
            d_in += n_num * r["d_embedding"]
        else:
            d_in += n_num
        n_codes = int(np.sum(cardinalities)) if len(cardinalities) else 0
        d_total = d_in + n_codes
        self.encoder = nn.Linear(max(d_in, 1), r["dim"])
        if n_codes:
            self.register_buffer("offsets", torch.as_tensor(
                np.concatenate([[0], np.cumsum(cardinalities)[:-1]]), dtype=torch.long))
            self.cat = nn.Embedding(n_codes, r["dim"])
            bound = 1.0 / math.sqrt(max(d_total, 1))  # as nn.Linear over the one-hot codes
            nn.init.uniform_(self.cat.weight, -bound, bound)
        else:
            self.cat = None
        blocks = []
        for _ in range(r["n_blocks"]):
            blocks.append(nn.Sequential(
                nn.BatchNorm1d(r["dim"]), nn.Linear(r["dim"], r["d_block"]), nn.ReLU(),
                nn.Dropout(r["dropout"]), nn.Linear(r["d_block"], r["dim"])))
        self.blocks = nn.ModuleList(blocks)

    def forward(self, num, cat):
        if self.n_num and self.r["num_embedding"] == "plr":
            z = 2 * math.pi * self.freq[None] * num[..., None]
            z = F.relu(self.plr(torch.cat([torch.cos(z), torch.sin(z)], -1))).flatten(1)
        else:
            z = num
        out = self.encoder(z) if z.shape[1] else self.encoder.bias.expand(num.shape[0], -1)
        if self.cat is not None:
            out = out + self.cat(cat + self.offsets).sum(1)
        for block in self.blocks:
            out = block(out)
        return out


def _distance(q, k, kind):
    if kind == "euclidean":
        return torch.cdist(q, k)
    return torch.cdist(q, k).square()


class _Member:
    """One trained map plus its keys (training + validation embeddings) and temperature."""

    def __init__(self, r, classification):
        self.r, self.classification = r, classification

    def fit(self, num, cat, values, card, seed, stratify):
        r = self.r
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        n = num.shape[0]
        rng = np.random.default_rng(seed)
        val = _val_split(n, r["val_fraction"], stratify, rng)
        train = np.setdiff1d(np.arange(n), val)
        net = _Map(num.shape[1], card, r, gen)
        opt = torch.optim.AdamW(net.parameters(), lr=r["lr"], weight_decay=r["weight_decay"])
        tn, tc, tv = num[train], cat[train], values[train]
        vn, vc, vv = num[val], cat[val], values[val]
        n_tr = train.size
        bs = min(r["batch_size"], n_tr)
        best, best_state, stall, steps, epochs = math.inf, None, 0, 0, 0
        history = []
        val_keys = np.arange(n_tr)
        if 0 < r["val_keys"] < n_tr:
            val_keys = np.sort(rng.permutation(n_tr)[: r["val_keys"]])
        for _ in range(r["max_epochs"]):
            net.train()
            order = torch.randperm(n_tr, generator=gen)
            for batch in order.split(bs):
                if batch.numel() < 2:
                    continue
                others = torch.ones(n_tr, dtype=torch.bool)
                others[batch] = False
                pool = torch.nonzero(others).ravel()
                m = min(int(r["sample_rate"] * pool.numel()), r["max_candidates"])
                cand = pool[torch.randperm(pool.numel(), generator=gen)[:m]]
                idx = torch.cat([batch, cand])
                z = net(tn[idx], tc[idx])
                zq = z[: batch.numel()]
                d = _distance(zq, z, r["distance"])
                own = torch.arange(batch.numel())
                d = d.index_put((own, own), torch.tensor(math.inf))  # self is no neighbour
                w = torch.softmax(-d, dim=1)
                pred = w @ tv[idx]
                loss = _loss(pred, tv[batch], self.classification)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                steps += 1
            epochs += 1
            if val.size:
                vloss = self._val_loss(net, tn[val_keys], tc[val_keys], tv[val_keys],
                                       vn, vc, vv, 1.0)
            else:
                vloss = float(loss)
            history.append(vloss)
            if vloss < best - 1e-4:
                best, stall = vloss, 0
                best_state = copy.deepcopy(net.state_dict())
            else:
                stall += 1
            if stall >= r["patience"] or steps >= r["max_steps"]:
                break
        if best_state is not None:
            net.load_state_dict(best_state)
        net.eval()
        self.net = net
        self.temperature = 1.0
        if r["calibrate"] and val.size:
            self.temperature = self._calibrate(net, tn, tc, tv, vn, vc, vv)
        with torch.no_grad():
            self.keys = _embed(net, num, cat)
        self.values = values
        self.info = {"epochs": epochs, "steps": steps, "best_val": best,
                     "temperature": self.temperature}
        return self

    @torch.no_grad()
    def _val_loss(self, net, tn, tc, tv, vn, vc, vv, temperature):
        net.eval()
        keys = _embed(net, tn, tc)
        q = _embed(net, vn, vc)
        pred = _attend(q, keys, tv, temperature, self.r["distance"])
        return float(_loss(pred, vv, self.classification))

    @torch.no_grad()
    def _calibrate(self, net, tn, tc, tv, vn, vc, vv):
        keys = _embed(net, tn, tc)
        q = _embed(net, vn, vc)
        d = _distance(q, keys, self.r["distance"])

        def loss_at(log_t):
            w = torch.softmax(-d / math.exp(log_t), dim=1)
            return float(_loss(w @ tv, vv, self.classification))

        grid = np.linspace(-2.5, 2.5, 21)
        losses = [loss_at(g) for g in grid]
        best = grid[int(np.argmin(losses))]
        lo, hi = best - 0.25, best + 0.25
        for _ in range(12):  # golden-section refinement around the best grid point
            a, b = lo + 0.382 * (hi - lo), lo + 0.618 * (hi - lo)
            if loss_at(a) < loss_at(b):
                hi = b
            else:
                lo = a
        return math.exp(0.5 * (lo + hi))

    @torch.no_grad()
    def predict(self, num, cat):
        q = _embed(self.net, num, cat)
        return _attend(q, self.keys, self.values, self.temperature, self.r["distance"])


def _embed(net, num, cat, block=4096):
    return torch.cat([net(num[s:s + block], cat[s:s + block])
                      for s in range(0, num.shape[0], block)]) if num.shape[0] else \
        torch.zeros(0, net.r["dim"])


def _attend(q, keys, values, temperature, distance, block=1024):
    out = []
    for s in range(0, q.shape[0], block):
        d = _distance(q[s:s + block], keys, distance)
        out.append(torch.softmax(-d / temperature, dim=1) @ values)
    return torch.cat(out)


def _loss(pred, target, classification):
    if classification:
        return -torch.log((pred * target).sum(1) + _EPS).mean()
    return ((pred - target) ** 2).sum(1).mean()


def _val_split(n, fraction, stratify, rng):
    n_val = round(fraction * n)
    if n_val < 1 or n - n_val < 4:
        return np.zeros(0, dtype=int)
    if stratify is None:
        return np.sort(rng.permutation(n)[:n_val])
    val = []
    for c in np.unique(stratify):  # proportional per class, at least one of each if possible
        idx = rng.permutation(np.flatnonzero(stratify == c))
        k = round(fraction * idx.size)
        val.append(idx[: min(k, idx.size - 1)])
    return np.sort(np.concatenate(val))


class _Base:
    _classification = True

    def __init__(self, random_state=0, threads=None, **recipe):
        unknown = set(recipe) - set(RECIPE)
        if unknown:
            raise ValueError(f"unknown recipe keys {sorted(unknown)}")
        self.recipe = {**RECIPE, **recipe}
        self.random_state = random_state

    def _fit(self, X, values, stratify):
        r = self.recipe
        start = time.perf_counter()
        self.encoder_ = _TabularEncoder(
            categorical_features=r["categorical_features"], numeric_scaling=r["scaling"],
            missing_indicators=r["missing_indicators"], min_frequency=r["min_frequency"])
        block = self.encoder_.fit(X).transform(X)
        num = torch.as_tensor(block.numeric)
        cat = torch.as_tensor(block.categories)
        vals = torch.as_tensor(values, dtype=torch.float32)
        n = num.shape[0]
        if n < r["none_below"]:
            recipes = [{**r, "num_embedding": "none"}] * r["n_members"]
        elif n < r["mix_below"]:
            recipes = [r, {**r, "num_embedding": "none"}]
        else:
            recipes = [r] * r["n_members"]
        self.members_ = [
            _Member(ri, self._classification).fit(num, cat, vals, self.encoder_.cardinalities_,
                                                  self.random_state * 1000 + i, stratify)
            for i, ri in enumerate(recipes)
        ]
        self.fit_info_ = {"members": [m.info for m in self.members_],
                          "fit_s": time.perf_counter() - start}
        return self

    def _predict_values(self, X):
        block = self.encoder_.transform(X)
        num, cat = torch.as_tensor(block.numeric), torch.as_tensor(block.categories)
        return torch.stack([m.predict(num, cat) for m in self.members_]).mean(0).numpy()


class TabularAttentionClassifier(_Base):
    def fit(self, X, y):
        self.classes_, y_enc = np.unique(np.asarray(y), return_inverse=True)
        values = np.eye(self.classes_.size, dtype=np.float32)[y_enc]
        return self._fit(X, values, y_enc)

    def predict_proba(self, X):
        p = self._predict_values(X).astype(np.float64)
        return p / p.sum(1, keepdims=True)

    def predict(self, X):
        return self.classes_[self.predict_proba(X).argmax(1)]


class TabularAttentionRegressor(_Base):
    _classification = False

    def fit(self, X, y):
        y = np.asarray(y, dtype=np.float64)
        self.y_mean_, self.y_scale_ = y.mean(), y.std() or 1.0
        values = ((y - self.y_mean_) / self.y_scale_)[:, None].astype(np.float32)
        return self._fit(X, values, None)

    def predict(self, X):
        return self._predict_values(X)[:, 0] * self.y_scale_ + self.y_mean_
