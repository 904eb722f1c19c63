"""The rows a learned metric trains on and the held-out rows that stop its training and
calibrate its temperature."""

import math

import numpy as np
import torch
from sklearn.model_selection import train_test_split

from ..utils._warnings import warn_user
from ._training_settings import _CALIBRATION_ROWS, MAX_VALIDATION_ROWS


def validation_split(estimator, n, stratify, rng):
    """Sorted (train, validation) row indices, or ``None`` without early stopping."""
    if not estimator.early_stopping:
        return None
    n_val = min(int(math.ceil(estimator.validation_fraction * n)), MAX_VALIDATION_ROWS)
    if n_val < 1 or n - n_val < 2:
        return None
    strat = stratify
    if strat is not None:
        counts = np.bincount(strat)
        if counts[counts > 0].min() < 2 or n_val < np.count_nonzero(counts):
            strat = None  # too small to stratify
    train_idx, val_idx = train_test_split(np.arange(n), test_size=n_val, random_state=rng,
                                          stratify=strat)
    return torch.as_tensor(np.sort(train_idx)), torch.as_tensor(np.sort(val_idx))


# sample weights whose largest is outside this range are trained divided by it
_WEIGHT_SCALES = (1e-10, 1e10)


class TrainingRows:
    """The training rows, values and weights as tensors, less the validation rows."""

    def __init__(self, X, values, weight, dtype, device):
        self.X = torch.as_tensor(X, dtype=dtype, device=device)
        self.values = torch.as_tensor(values, dtype=dtype, device=device)
        weight = np.asarray(weight, dtype=np.float64)
        peak = float(weight.max()) if weight.size else 0.0
        if peak > 0 and not _WEIGHT_SCALES[0] <= peak <= _WEIGHT_SCALES[1]:
            # their scale changes no softmax (a constant log-prior) and no weighted mean loss;
            # weights of 1e-60 or 1e60 would underflow or overflow the training dtype
            weight = weight / peak
        self.weight = torch.as_tensor(weight, dtype=dtype, device=device)

    def split(self, indices):
        """Keep the training rows; return the validation ``(X, values, weight)`` or ``None``."""
        if indices is None:
            return None
        train_idx, val_idx = indices
        if not bool((self.weight[val_idx] > 0).any()):
            # its loss is 0/0: it can neither stop the training nor calibrate the temperature
            warn_user(
                "The validation split holds only rows of zero sample weight: it cannot judge "
                "the training, so this fit trains on every row as early_stopping=False does "
                "(stopping on the training loss, keeping the trained temperature).")
            return None
        validation = (self.X[val_idx], self.values[val_idx], self.weight[val_idx])
        self.X, self.values, self.weight = (self.X[train_idx], self.values[train_idx],
                                            self.weight[train_idx])
        if not bool((self.weight > 0).any()):
            raise ValueError("All training sample weights are zero after the validation split.")
        return validation


def calibration_rows(validation, generator):
    """The validation ``(X, values, weight)`` that the temperature is calibrated on: all of
    them, or ``_CALIBRATION_ROWS`` drawn at random among those of positive weight (the others
    add nothing to the loss; a draw of them alone would calibrate nothing)."""
    n = validation[0].shape[0]
    if n <= _CALIBRATION_ROWS:
        return validation
    weighted = (validation[2] > 0).nonzero().squeeze(1).cpu()
    if weighted.numel() < n:
        validation = tuple(part[weighted.to(part.device)] for part in validation)
        n = weighted.numel()
        if n <= _CALIBRATION_ROWS:
            return validation
    rows = torch.randperm(n, generator=generator)[:_CALIBRATION_ROWS].sort().values
    return tuple(part[rows.to(part.device)] for part in validation)
