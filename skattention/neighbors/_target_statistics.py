"""Target statistics of categorical levels: numbers the tabular map reads beside its embeddings.

On many rows the tabular map codes the levels seen fewer than a few times as one "rare" level
(its embedding would memorise their rows' labels), and the embeddings of many levels learn
slowly: a column such as a film's title, a business's name or an institution then tells the
map little. Its levels' target statistics tell it at once: for each level the mean target
(regression, standardised) or the class frequencies (one column for two classes), shrunk
towards the overall mean by empirical Bayes, as scikit-learn's ``TargetEncoder`` with
``smooth="auto"`` does (Micci-Barreca, 2001). A training row's statistics are computed from
the other folds of a 5-fold split (cross fitting), so that its own target never enters them;
other rows (prediction, a warm start's data) get the statistics of every training row.
Missing values are a level of their own; unseen levels get the overall mean. A column whose
cross-fitted statistics predict the training rows' targets no better than the overall mean
adds none (``TargetStatistics.kept``).
"""

import numpy as np
import pandas as pd

from ._levels import _FIRST_LEVEL, OTHER_CODE, level_codes
from ._scaling import robust_scaling, smooth_clip

_FOLDS = 5
# per-fold tables of a column's codes alive at once while its statistics are computed
_SCRATCH_TABLES = 8


class TargetStatistics:
    """Fitted target statistics of some categorical columns.

    Attributes
    ----------
    skills : list of float
        Per column given to :meth:`fit_transform`, the share of the targets' variance its
        cross-fitted statistics explain: 1 - their weighted squared error over the overall
        mean's (of the other folds), negative where they predict worse than the mean.
    kept : list of int
        The columns (positions in the ``codes`` given to :meth:`fit_transform`) of positive
        skill: a statistic that predicts no better than the mean is noise to the map (a column
        of a few rows per level that carry little of the target), and the column keeps its
        embedding alone.
    tables : list of ndarray of shape (n_codes, n_targets)
        Per kept column, the statistics of each code (0 missing, 1 unseen, 2.. every level
        present at fit, also those the map codes as rare).
    width : int
        Output columns: ``n_targets`` per kept column.
    """

    def __init__(self):
        self.skills = []
        self.kept = []
        self.tables = []
        self.width = 0

    def fit_transform(self, codes, sizes, targets, sample_weight, rng, max_bytes=None):
        """Fit on the training rows' ``codes`` (a list: per column, its codes, of ``sizes``
        codes in all) and ``targets`` (n, n_targets); return the training rows' cross-fitted
        statistics of the kept columns, (n, width). A column whose per-fold tables would take
        more than ``max_bytes`` of scratch memory (an id of a million levels and many classes)
        is not kept (its skill NaN)."""
        n, m = targets.shape
        weight = np.ones(n) if sample_weight is None else np.asarray(sample_weight, float)
        folds = rng.permutation(n) % _FOLDS
        # the overall mean and variance: of every row, and of the rows of the other folds
        per_fold = _sums(folds, weight, targets, _FOLDS)
        whole_moments = _moments(*(s.sum(0) for s in per_fold))
        other_moments = _moments(*(s.sum(0)[None] - s for s in per_fold))
        # (a fold whose other folds weigh nothing: the overall mean)
        baseline = np.where(np.isfinite(other_moments[0][folds, 0]), other_moments[0][folds, 0],
                            whole_moments[0])
        baseline_error = weight @ ((targets - baseline) ** 2).sum(1)
        self.skills, self.kept, self.tables, out = [], [], [], []
        for position, (column, size) in enumerate(zip(codes, sizes, strict=True)):
            if max_bytes is not None and _SCRATCH_TABLES * _FOLDS * size * m * 8 > max_bytes:
                self.skills.append(float("nan"))
                continue
            sums = _sums(folds * size + column, weight, targets, _FOLDS * size)
            # a row's statistics: every fold but its own
            whole = [s.sum(0) for s in sums]
            others = [w[None] - s for w, s in zip(whole, sums, strict=True)]
            rows = _shrunk(*others, *other_moments)[folds, column]
            rows = np.where(np.isfinite(rows), rows, baseline)
            with np.errstate(invalid="ignore", divide="ignore"):
                self.skills.append(float(1 - weight @ ((targets - rows) ** 2).sum(1)
                                         / baseline_error))
            if not self.skills[-1] > 0:
                continue
            self.kept.append(position)
            self.tables.append(_shrunk(*whole, *whole_moments))  # every fold: for new rows
            out.append(rows)
        self.width = len(self.tables) * m
        return np.hstack(out) if out else np.zeros((n, 0))

    def transform(self, codes):
        """The statistics of rows of ``codes`` (per column) from every training row,
        (n, width)."""
        return np.hstack([table[column] for column, table in zip(codes, self.tables,
                                                                 strict=True)])


class LevelStatistics:
    """The scaled target statistics of some categorical columns, read from their values.

    Attributes
    ----------
    kept : list of int
        The columns given to :meth:`fit_transform` that have statistics (positions in its
        ``values``).
    levels : list of ndarray
        Per kept column, its levels present at fit (the rare ones too).
    target_statistics : TargetStatistics
        Their statistics per code.
    scaling : list of (float, float)
        Per output column, the (median, interquartile range) it is robust-scaled by.
    """

    def fit_transform(self, values, levels, targets, sample_weight, rng, max_bytes=None):
        """Fit on the training rows' ``values`` of some columns (a list) and each column's
        ``levels`` present; return the training rows' cross-fitted statistics, scaled, (n,
        width)."""
        codes = [level_codes(v, lv) for v, lv in zip(values, levels, strict=True)]
        statistics = TargetStatistics()
        raw = statistics.fit_transform(codes, [lv.size + _FIRST_LEVEL for lv in levels],
                                       targets, sample_weight, rng, max_bytes)
        self.kept, self.target_statistics = statistics.kept, statistics
        self.levels = [levels[k] for k in statistics.kept]
        if not self.kept:
            self.scaling = []
            return raw
        # scaled as rows at predict read them (every training row's statistics): the
        # cross-fitted values of a level seen in one fold alone are their folds' means, a
        # hair apart, whose quartiles would blow that hair up to the clipping range
        full = statistics.transform([codes[k] for k in statistics.kept])
        self.scaling = [robust_scaling(column) for column in full.T]
        return self._scaled(raw)

    @property
    def width(self):
        return self.target_statistics.width

    @property
    def n_targets(self):
        """Statistics per column (a target's, or a class's)."""
        return self.width // max(len(self.levels), 1)

    def transform(self, values):
        """The scaled statistics of rows whose kept columns hold ``values`` (a list), from
        every training row."""
        codes = [level_codes(v, lv) for v, lv in zip(values, self.levels, strict=True)]
        return self._scaled(self.target_statistics.transform(codes))

    def _scaled(self, raw):
        centre, scale = np.asarray(self.scaling).T
        return smooth_clip((raw - centre) / scale)


def target_numbers(y, classes, max_width):
    """The targets of ``y`` as the numbers their statistics average, (n, n_targets): each
    output's class indicators (one column where it has two classes), or each output
    standardised; ``None`` where that takes more than ``max_width`` columns."""
    columns = np.asarray(y).reshape(len(y), -1)
    if not classes:
        if columns.shape[1] > max_width:
            return None
        out = []
        for column in columns.T.astype(np.float64):
            scale = column.std()
            out.append((column - column.mean()) / (scale if scale > 0 else 1.0))
        return np.column_stack(out)
    factorized = [pd.factorize(column) for column in columns.T]
    # the width first: the n x n_classes indicators of many classes take gigabytes
    if sum(1 if levels.size == 2 else levels.size for _, levels in factorized) > max_width:
        return None
    out = []
    for codes, levels in factorized:
        indicators = codes[:, None] == np.arange(levels.size)
        out.append(indicators[:, 1:] if levels.size == 2 else indicators)
    return np.hstack(out).astype(np.float64)


def _sums(index, weight, targets, length):
    """Weighted count, sum and sum of squares of ``targets`` per ``index`` (fold x code), each
    reshaped to (folds, codes[, targets])."""
    count = np.bincount(index, weight, minlength=length)
    first = np.stack([np.bincount(index, weight * t, minlength=length) for t in targets.T], 1)
    second = np.stack([np.bincount(index, weight * t * t, minlength=length)
                       for t in targets.T], 1)
    shape = (_FOLDS, length // _FOLDS)
    return count.reshape(shape), first.reshape(*shape, -1), second.reshape(*shape, -1)


def _moments(count, first, second):
    """(mean, variance) of the rows summed in ``count``, ``first``, ``second``; NaN where
    ``count`` is 0."""
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = first / count[..., None]
        return mean, np.maximum(second / count[..., None] - mean * mean, 0.0)


def _shrunk(count, first, second, mean, variance):
    """Each code's mean shrunk towards ``mean`` by empirical Bayes: the weight of its own mean
    is ``variance n / (variance n + its variance)`` (scikit-learn's ``smooth="auto"``)."""
    own, spread = _moments(count, first, second)
    count = count[..., None]
    with np.errstate(invalid="ignore", divide="ignore"):
        weight = variance * count / (variance * count + spread)
    shrunk = np.where(count > 0, weight * own + (1 - weight) * mean, mean)
    shrunk = np.where(np.isfinite(shrunk), shrunk, mean)
    # unseen levels: the overall mean
    shrunk[..., OTHER_CODE, :] = np.broadcast_to(mean, shrunk.shape)[..., OTHER_CODE, :]
    return shrunk

