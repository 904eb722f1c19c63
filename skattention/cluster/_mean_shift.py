"""AttentionMeanShift: mean shift as repeated attention of the modes over the data."""

import math
from numbers import Integral, Real

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClusterMixin
from sklearn.cluster import estimate_bandwidth, get_bin_seeds
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from .._engine import (
    ComputeOverflowError,
    MeasuredThreads,
    attention,
    ball_sums,
    gaussian_kernel_log_sums,
    kneighbors,
    mean_kth_distance,
    overflow_message,
    progress_bar,
    resolve_device,
)
from ..utils._callbacks import report_subtask
from ..utils._device import DevicePortableMixin
from ..utils._estimator import EstimatorMixin
from ..utils._param_validation import Count, Interval, StrOptions
from ..utils._sklearn_compat import _fit_context

# bandwidth=None: scikit-learn's estimate_bandwidth (quantile 0.3) on at most this many points.
_BANDWIDTH_MAX_SAMPLES = 10000


def _estimated_bandwidth(X, kernel, device):
    """``bandwidth=None``: scikit-learn's ``estimate_bandwidth`` (quantile 0.3) on at most
    :data:`_BANDWIDTH_MAX_SAMPLES` points, its own for the flat kernel (the fit equals
    MeanShift's), the engine's for the Gaussian one (the same sample and value up to rounding,
    several times faster: ``mean_kth_distance``), divided by ``sqrt(n_features + 2)``. 0 when
    most points coincide: each point is then its own mode (as in MeanShift)."""
    n = X.shape[0]
    n_samples = None if n <= _BANDWIDTH_MAX_SAMPLES else _BANDWIDTH_MAX_SAMPLES
    if kernel == "flat":
        return estimate_bandwidth(X, n_samples=n_samples, random_state=0)
    sample = X if n_samples is None else X[np.random.RandomState(0).permutation(n)[:n_samples]]
    r = mean_kth_distance(sample, max(1, int(sample.shape[0] * 0.3)), device=device)
    # the Gaussian with the per-coordinate variance of the uniform ball of that radius
    return r / math.sqrt(X.shape[1] + 2)


class AttentionMeanShift(ClusterMixin, EstimatorMixin, DevicePortableMixin, BaseEstimator):
    """Mean shift as repeated attention: the modes attend over the data and move to the output.

    Each iteration is one attention step with the seeds (modes) as queries and the training
    points as keys and values, ``m <- sum_j a_j x_j`` with
    ``a_j = softmax_j(-||m - x_j||^2 / (2 h^2))`` for the Gaussian kernel of bandwidth ``h``
    (or the mean of the points within distance ``h`` for the flat kernel, i.e. a radius prior at
    infinite temperature, which is scikit-learn's :class:`~sklearn.cluster.MeanShift`). Modes
    that converged are merged greedily by decreasing kernel density; each point gets the
    nearest remaining centre.

    With ``blurring=True`` the points attend to *themselves* and move (Gaussian blurring mean
    shift): ``X <- S(X) X``, the self-attention flow of :doc:`/theory`, which is a drift-diffusion
    that collapses the points into clusters; the collapsed groups are the clusters.

    Parameters
    ----------
    bandwidth : float, default=None
        Kernel bandwidth ``h`` (the standard deviation of the Gaussian kernel, the radius of the
        flat one). ``None``: :func:`sklearn.cluster.estimate_bandwidth` (quantile 0.3, on at
        most 10,000 points), the radius of scikit-learn's flat kernel; the Gaussian kernel then
        uses ``h = r / sqrt(n_features + 2)``, which gives it the per-coordinate variance of the
        uniform ball of radius ``r``. An estimate of 0 (most points coincide) makes every
        distinct point its own mode, as in MeanShift. The value used is ``bandwidth_``.
    kernel : {"gaussian", "flat"}, default="gaussian"
        ``"gaussian"``: attention at temperature ``T = 2 h^2``. ``"flat"``: uniform attention
        over the points within distance ``h``, ``h`` included (scikit-learn's MeanShift kernel;
        the whole fit then equals MeanShift's).
    blurring : bool, default=False
        Move the points themselves (self-attention flow) instead of separate modes. The
        blurring flow keeps contracting after the clusters have formed, and clusters a few
        bandwidths apart can merge before the ``tol`` rule stops it (a known property of
        blurring mean shift); ``max_iter`` bounds it.
    seeds : array-like of shape (n_seeds, n_features), default=None
        Starting modes; ``None``: every point, or the binned points with ``bin_seeding``.
        Ignored with ``blurring``.
    bin_seeding : bool, default=False
        Seed from a grid of cell size ``h`` (:func:`sklearn.cluster.get_bin_seeds`).
    min_bin_freq : int, default=1
        Keep only grid cells with at least this many points as seeds.
    cluster_all : bool, default=True
        ``False`` labels ``-1`` the points farther than ``h`` from every centre.
    cluster_merge : float, default=None
        Modes closer than this to a denser kept mode are merged into it; ``None``: ``h`` (as
        scikit-learn's MeanShift).
    max_iter : int, default=300
        Maximum iterations per seed, counted as MeanShift does: a seed that has not converged
        stops after ``max_iter`` completed iterations, i.e. at most ``max_iter + 1`` attention
        steps. With ``blurring``: maximum steps of the flow.
    tol : float, default=1e-3
        A mode (with ``blurring``: the whole flow) has converged when it moves less than
        ``tol * h`` in one step (scikit-learn's MeanShift uses ``1e-3 h``).
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"
        Where the attention steps run; fitted attributes are NumPy arrays.
    verbose : int, default=0
        ``0``: silent. ``1``: a progress bar on standard error over the attention steps, with
        the number of seeds still moving (with ``blurring``: the largest shift); tqdm when
        installed, else plain lines (``pip install skattention[progress]``).

    Attributes
    ----------
    cluster_centers_ : ndarray of shape (n_clusters, n_features)
        Merged modes, densest first.
    labels_ : ndarray of shape (n_samples,)
        Cluster of each training point (with ``blurring``: of its collapsed position).
    bandwidth_ : float
        Bandwidth used.
    n_iter_ : int
        As MeanShift's: the most iterations a seed completed before the step that stopped it
        (with ``blurring``: the steps of the flow).
    stopped_by_callback_ : bool
        Whether one of scikit-learn's callbacks (``set_callbacks``, scikit-learn >= 1.9) stopped
        the fit by returning ``True`` at the end of a step (each step is a subtask of the fit):
        the seeds (or, with ``blurring``, the points) still moving stopped where they were, and
        the modes are merged from there as at convergence.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Names of features seen during fit, when ``X`` has string column names.

    See Also
    --------
    sklearn.cluster.MeanShift : Flat-kernel mean shift.
    AttentionKMeans : k-means as alternating cross-attention.

    Examples
    --------
    >>> import numpy as np
    >>> from skattention.cluster import AttentionMeanShift
    >>> X = np.array([[1, 1], [2, 1], [1, 0], [4, 7], [3, 5], [3, 6]])
    >>> ms = AttentionMeanShift(bandwidth=2).fit(X)
    >>> ms.labels_
    array([0, 0, 0, 1, 1, 1])
    >>> ms.predict([[0, 0], [5, 5]])
    array([0, 1])
    >>> len(ms.cluster_centers_)
    2
    """

    _parameter_constraints: dict = {
        "bandwidth": [Interval(Real, 0, None, closed="neither"), None],
        "kernel": [StrOptions({"gaussian", "flat"})],
        "blurring": ["boolean"],
        "seeds": ["array-like", None],
        "bin_seeding": ["boolean"],
        "min_bin_freq": [Count(Integral, 1, None, closed="left")],
        "cluster_all": ["boolean"],
        "cluster_merge": [Interval(Real, 0, None, closed="left"), None],
        "max_iter": [Count(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "device": [str, torch.device],
        "verbose": ["verbose"],
    }

    def __init__(
        self,
        *,
        bandwidth=None,
        kernel="gaussian",
        blurring=False,
        seeds=None,
        bin_seeding=False,
        min_bin_freq=1,
        cluster_all=True,
        cluster_merge=None,
        max_iter=300,
        tol=1e-3,
        device="auto",
        verbose=0,
    ):
        self.bandwidth = bandwidth
        self.kernel = kernel
        self.blurring = blurring
        self.seeds = seeds
        self.bin_seeding = bin_seeding
        self.min_bin_freq = min_bin_freq
        self.cluster_all = cluster_all
        self.cluster_merge = cluster_merge
        self.max_iter = max_iter
        self.tol = tol
        self.device = device
        self.verbose = verbose

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Find the modes and label the points.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training points.
        y : Ignored
            Not used, present for API consistency.

        Returns
        -------
        self : AttentionMeanShift
            Fitted estimator.
        """
        X = validate_data(self, X, dtype=[np.float64, np.float32], order="C")
        try:
            return self._fit(X)
        except ComputeOverflowError as exc:  # the engine's advice names options not here
            advice = ["rescale the data"]
            if exc.by_temperature:
                advice.append("increase the bandwidth (the temperature is 2 * bandwidth**2)")
            if X.dtype != np.float64:
                advice.append("pass X as float64 (the fit computes in X's precision)")
            # the engine's frames kept, its message (whose advice misleads here) not
            raise ValueError(overflow_message(exc.cause, advice)).with_traceback(
                exc.__traceback__) from None

    def _fit(self, X):
        """:meth:`fit` on the validated ``X``."""
        device = resolve_device(self.device)
        h = self.bandwidth
        if h is None:
            h = _estimated_bandwidth(X, self.kernel, device)
            if not math.isfinite(h):  # the engine would name its own parameter, the radius
                raise ValueError(
                    "The estimated bandwidth is infinite: the squared distances between the "
                    "points overflow; rescale the data."
                )
        # the bin size as given: MeanShift's bins come out float64 for a NumPy float (the
        # estimate) and float32 for a Python float, and end at different modes
        bin_size, h = h, float(h)
        self.bandwidth_ = h
        dtype = torch.float64 if X.dtype == np.float64 else torch.float32
        # A zero bandwidth is the flat kernel's limit for either kernel: only coincident points.
        flat = self.kernel == "flat" or h == 0.0
        # The Gaussian steps move the modes by less and less: far from the origin a float32 mode
        # cannot move by less than its coordinates' spacing, and never converged (offsets of
        # 1e5). They run on the points centred at their mean (taken in float64); the flat
        # kernel keeps the points as given (scikit-learn's exact balls).
        offset = None if flat else X.mean(0, dtype=np.float64)
        Xt = torch.from_numpy(X if flat else (X - offset).astype(X.dtype)).to(device)
        if flat:
            kernel = _FlatKernel(Xt, h)
        else:
            if not 0.0 < 2.0 * h * h < math.inf:
                raise ValueError(
                    f"bandwidth={h:.6g} is out of range for the Gaussian kernel: its temperature "
                    f"2 * bandwidth**2 = {2.0 * h * h:.6g} must be positive and finite; rescale "
                    "the data or choose another bandwidth."
                )
            kernel = _GaussianKernel(Xt, h, device, dtype)
        stop = self.tol * h

        if self.blurring:
            Y, n_iter, stopped = Xt.clone(), 0, False
            # each step on the thread count that does it soonest on this machine now (the
            # same results on any)
            threads = MeasuredThreads(device)
            with self._progress() as bar:
                for _ in range(self.max_iter):
                    with threads.step(Y.shape[0] ** 2):
                        Y_new, _ = kernel.step(Y, Y)
                        shift = float(((Y_new - Y) ** 2).sum(1).max().sqrt())
                    Y, n_iter = Y_new, n_iter + 1
                    bar.set_postfix(shift=f"{shift:.3g}", refresh=False)
                    bar.update()
                    stopped = report_subtask(self, "step") and shift > stop
                    if shift <= stop or stopped:
                        break
            modes, point_positions = Y, Y
            with threads.chosen():
                intensity = kernel.intensity(modes, None)
        else:
            threads = MeasuredThreads(device)
            modes, counts, n_iter, stopped = self._shift_seeds(X, kernel, h, stop, device,
                                                               threads, offset, bin_size)
            point_positions = None  # the points themselves
            with threads.chosen():
                intensity = kernel.intensity(modes, counts)
        self.n_iter_ = n_iter
        self.stopped_by_callback_ = stopped
        centers = _merge_modes(modes.cpu().numpy(), intensity.cpu().numpy(),
                               h if self.cluster_merge is None else float(self.cluster_merge))
        self.cluster_centers_ = np.ascontiguousarray(
            centers if offset is None else centers + offset, dtype=X.dtype)
        if point_positions is None:  # as predict labels them
            labels, sq_dist = _nearest_centres(torch.from_numpy(X).to(device),
                                               self.cluster_centers_)
        else:  # the collapsed positions, in the steps' coordinates
            labels, sq_dist = _nearest_centres(point_positions,
                                               np.ascontiguousarray(centers, dtype=X.dtype))
        # distances against the bandwidth, as MeanShift (fl(sqrt(3))**2 < 3)
        self.labels_ = labels if self.cluster_all else np.where(
            np.sqrt(np.asarray(sq_dist, dtype=np.float64)) > h, -1, labels)
        return self

    def _shift_seeds(self, X, kernel, h, stop, device, threads, offset, bin_size):
        """Move every seed until it converges, counting iterations as MeanShift does.

        A seed takes the mean of the points within reach; it stops when that moved it by at most
        ``stop`` or after ``max_iter`` completed iterations (so at most ``max_iter + 1`` means),
        and is dropped when no point is within reach. Returns the kept modes, the number of
        points behind each one's last mean (the flat kernel's intensity) and ``n_iter_``, the
        most iterations a seed completed, and whether a callback stopped them (the seeds
        still moving then stop where they are, having completed every step so far). The modes
        are in the kernel's coordinates: the points less ``offset`` (``None``: the points).
        """
        if self.seeds is not None:
            try:
                seeds = check_array(self.seeds, dtype=np.float64, input_name="seeds")
            except ValueError as exc:
                raise ValueError(
                    f"seeds must be an array of shape (n_seeds, n_features): {exc}"
                ) from exc
            if seeds.shape[1] != X.shape[1]:
                raise ValueError(f"seeds have {seeds.shape[1]} features but X has {X.shape[1]}.")
        elif self.bin_seeding:
            seeds = get_bin_seeds(X, bin_size, self.min_bin_freq)
            if len(seeds) == 0:
                raise ValueError(
                    f"No grid cell of size bandwidth={h:.6g} holds min_bin_freq="
                    f"{self.min_bin_freq} points, so bin_seeding gives no seed; lower "
                    "min_bin_freq or increase the bandwidth."
                )
        else:
            seeds = X
        # The flat kernel's first ball is around the seed as given (MeanShift's float64 seeds
        # about float32 points): the modes are held in float64, the means in the points' dtype.
        seeds = seeds if offset is None else np.asarray(seeds, dtype=np.float64) - offset
        modes_dtype = np.float64 if offset is None else X.dtype
        modes = torch.from_numpy(np.array(seeds, dtype=modes_dtype)).to(device)
        counts = torch.zeros(modes.shape[0], dtype=torch.long, device=device)
        active = torch.ones(modes.shape[0], dtype=torch.bool, device=device)
        found = torch.ones_like(active)
        n_iter = completed = 0
        stopped = False
        with self._progress() as bar:
            while True:
                idx = active.nonzero().squeeze(1)
                if idx.numel() == 0:
                    break
                bar.set_postfix(moving=idx.numel(), refresh=False)
                bar.update()
                # the step and its bookkeeping on the measured count (the caller's callbacks
                # below on the caller's)
                with threads.step(idx.numel() * kernel.points.shape[0]):
                    old = modes[idx]
                    new, within = kernel.step(old, kernel.points)
                    if within is not None:
                        # a seed with no point within reach stops where it is and is dropped
                        empty = within == 0
                        found[idx[empty]] = False
                        new = torch.where(empty[:, None], old, new)
                        counts[idx] = within
                    shift = ((new.double() - old.double()) ** 2).sum(1).sqrt()
                    modes[idx] = new
                    done = (shift <= stop) | (completed == self.max_iter)
                    if within is not None:
                        done |= empty
                    active[idx[done]] = False
                    if bool(done.any()):
                        n_iter = completed
                completed += 1
                # scikit-learn's callbacks: each step a subtask of the fit; a stop request ends
                # the seeds still moving where they are
                if report_subtask(self, "step") and bool(active.any()):
                    n_iter, stopped = completed, True
                    break
        if not bool(found.any()):
            raise ValueError(
                f"No point was within bandwidth={h:.6g} of any seed. Try a different seeding "
                "strategy or increase the bandwidth."
            )
        return modes[found].to(kernel.points.dtype), counts[found], n_iter, stopped

    def _fit_subtasks(self):
        """Subtasks of the fit for scikit-learn's callbacks: the mean-shift steps."""
        return self.max_iter + 1

    def _progress(self):
        return progress_bar(
            self.verbose, total=self.max_iter + 1, desc="AttentionMeanShift fit", unit="step"
        )

    def predict(self, X):
        """Index of the nearest cluster centre of each point (as MeanShift.predict).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        labels : ndarray of shape (n_samples,)
            Among equally near centres, the first. Every point gets a centre, also with
            ``cluster_all=False`` (which only labels the training points ``-1``).
        """
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=[np.float64, np.float32], order="C")
        points = torch.from_numpy(X).to(resolve_device(self.device))
        labels, _ = _nearest_centres(points, self.cluster_centers_)
        return labels

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False
        return tags


class _FlatKernel:
    """Flat kernel: the mean of the points within distance ``radius`` (``<=``, exactly: the
    engine's :func:`ball_sums` settles points near the boundary on exact distances, so a point
    exactly on it is inside, as in scikit-learn's MeanShift and ``radius_neighbors``). Computed
    in float64, as MeanShift's means are."""

    def __init__(self, points, radius):
        self.points = points
        self.radius = radius

    def step(self, queries, points):
        """New positions (means, in the queries' dtype) and the number of points behind each."""
        count, sums = ball_sums(
            queries, points, self.radius, points, device=points.device, dtype=torch.float64
        )
        if self.radius == 0:  # copies of the query: their mean is it (sum / count, rounded, is off)
            return queries.to(points.dtype), count
        means = sums / count.clamp(min=1)[:, None]
        return means.to(points.dtype), count

    def intensity(self, modes, counts):
        """Points behind each mode's last mean (MeanShift's intensity); for the blurring flow,
        the points within reach of the final positions."""
        return counts if counts is not None else self.step(modes, self.points)[1]


class _GaussianKernel:
    """Gaussian kernel of bandwidth ``h``: attention at temperature ``2 h^2``."""

    def __init__(self, points, h, device, dtype):
        self.points = points
        self.temperature = 2.0 * h * h
        self.engine = dict(temperature=self.temperature, device=device, dtype=dtype)

    def step(self, queries, points):
        return attention(queries, points, points, **self.engine), None

    def intensity(self, modes, counts):
        """Log kernel density of the data at each mode (only the order matters)."""
        return gaussian_kernel_log_sums(
            modes, self.points, self.temperature, device=self.points.device
        )


def _nearest_centres(points, centres):
    """Index of the nearest centre of each point (the first among equally near ones) and the
    squared distance to it, exactly (the engine's 1-NN, in float64)."""
    sq_dist, labels = kneighbors(
        points,
        torch.from_numpy(np.asarray(centres, dtype=np.float64)).to(points.device),
        1,
        device=points.device,
        dtype=torch.float64,
    )
    return labels[:, 0].cpu().numpy(), sq_dist[:, 0].cpu().numpy()


def _merge_modes(modes, intensity, radius):
    """Greedy suppression, densest first: keep a mode unless a kept one lies within ``radius``.

    This is scikit-learn's MeanShift post-processing: identical modes count once (with the
    intensity of the last seed that reached them), modes are sorted by decreasing intensity,
    then by decreasing coordinates, and the modes within ``radius`` (``<=``) of a kept one are
    removed.
    """
    # the last occurrence of each distinct mode, as a dict keyed by the mode would keep
    _, last = np.unique(modes[::-1], axis=0, return_index=True)
    keep = len(modes) - 1 - last
    modes, intensity = modes[keep], intensity[keep]
    keys = [modes[:, j] for j in range(modes.shape[1] - 1, -1, -1)] + [intensity]  # last = primary
    order = np.lexsort(keys)[::-1]
    modes = modes[order].astype(np.float64)
    alive = np.ones(len(modes), dtype=bool)
    kept = []
    r2 = radius * radius
    i = 0
    while i < len(modes):
        kept.append(i)
        d2 = ((modes - modes[i]) ** 2).sum(1)
        alive &= d2 > r2
        rest = np.flatnonzero(alive[i + 1 :])
        if rest.size == 0:
            break
        i = i + 1 + rest[0]
    return modes[kept]
