"""AttentionDiffusionEmbedding: the attention matrix as a diffusion operator (diffusion maps)."""

from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.linalg import ArpackNoConvergence
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin, clone
from sklearn.exceptions import NotFittedError
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from .._engine import (
    attention,
    prepare_keys,
    progress_bar,
    resolve_device,
)
from ..utils._callbacks import begin_subtask, end_subtask, report_subtask
from ..utils._device import DevicePortableMixin
from ..utils._estimator import EstimatorMixin
from ..utils._param_validation import Count, HasMethods, Interval, StrOptions
from ..utils._sklearn_compat import _fit_context, _num_samples
from ..utils._validation import overflow_advice
from ..utils._warnings import warn_user
from ._eigen import resolve_eigen_solver, top_eigenpairs
from ._nystrom import knn_nystrom
from ._operator import (
    auto_epsilon,
    bandwidth_sample,
    check_dense_memory,
    diffusion_coordinates,
    diffusion_operator,
    knn_graph_and_reference,
    laplacian_eigenvalues,
    reference_size,
    resolve_n_neighbors,
    signed_power,
)

# SpectralEmbedding's warning, word for word.
_NOT_CONNECTED = "Graph is not fully connected, spectral embedding may not work as expected."
# A second eigenvalue this close to 1 means parts joined only by affinities at the rounding
# level of the others (far-apart blobs under a dense Gaussian kernel: exp(-400) > 0): the
# embedding collapses as on a disconnected graph, and the same warning is given.
_DISCONNECTED_GAP = 1e-10

# Radii of the k-NN mask are widened by this relative amount at transform time, so that the
# k-th neighbour of a training point stays inside its ball despite rounding in the recomputed
# distances (transform(X_train) then reproduces embedding_).
_RADIUS_SLACK = 1e-6


def _overflow_advice():
    """Overflow errors advising what this estimator has (:func:`overflow_advice`): its
    attention temperature is ``epsilon``, and it computes in float64 already."""
    return overflow_advice(
        lambda exc: ["rescale the data"] + ["pass a larger epsilon"] * exc.by_temperature)


class AttentionDiffusionEmbedding(
    ClassNamePrefixFeaturesOutMixin, TransformerMixin, EstimatorMixin, DevicePortableMixin,
    BaseEstimator,
):
    """Diffusion-map embedding with the attention matrix as the diffusion operator.

    The attention of the training points over themselves,
    ``S_ij = softmax_j(-f(x_i, x_j) / epsilon - alpha log q_j)`` with ``f`` the squared
    Euclidean distance (in the space of ``metric``) and ``q_j = sum_l exp(-f(x_j, x_l) / epsilon)``
    the kernel density at ``x_j``, is the Markov operator of Coifman and Lafon's diffusion maps.
    Its leading non-trivial right eigenvectors ``psi_k``, scaled by ``mu_k ** diffusion_time``,
    are the embedding. As ``epsilon -> 0``, ``(S - I) / (epsilon / 4)`` tends to
    ``Lap + 2 (1 - alpha) <grad log p, grad>`` (:doc:`/theory`): ``alpha=0`` is raw
    attention with its drift towards dense regions, ``alpha=0.5`` a Fokker–Planck operator and
    ``alpha=1`` the Laplace–Beltrami operator (the heat equation), whatever the sampling density.

    Unlike :class:`~sklearn.manifold.SpectralEmbedding`, new points are embedded by ``transform``:
    the Nyström extension ``psi_k(x) = sum_j S(x, x_j) psi_k(x_j) / mu_k`` is attention from the
    new points (queries) to the training points (keys), computed by the engine.

    Parameters
    ----------
    n_components : int, default=2
        Number of diffusion coordinates (the trivial constant eigenvector is dropped).
    metric : "euclidean" or transformer, default="euclidean"
        Space in which squared Euclidean distances are taken. A transformer (for example a
        :class:`~skattention.MetricAttentionTransformer`) maps the data first, so the diffusion
        runs in a learned metric: used as is when already fitted, else cloned and fitted on
        ``(X, y)`` in ``fit`` (``metric_``). It receives ``X`` as given and checks it itself
        (a :class:`~skattention.MetricAttentionTransformer` takes a DataFrame with strings,
        categories and missing values); its output must be finite numbers.
    epsilon : float or "auto", default="auto"
        Kernel bandwidth, the attention temperature: ``exp(-f / epsilon)``. ``"auto"``: the
        Berry–Giannakis–Harlim bandwidth (where ``log sum_ij exp(-f_ij / epsilon)`` over each
        point's ``ceil(3 sqrt(n_samples)) + 1`` nearest points grows fastest in
        ``log epsilon``) sets the number of effective neighbours (kernel degree
        ``sum_j exp(-f_ij / epsilon)``) of the median point, and ``epsilon`` is the smallest
        bandwidth giving 90% of the points that many; with the k-NN operator it is at most the
        bandwidth giving 90% of them ``0.9 n_neighbors`` (a kernel nearly flat over the k-NN
        ball when ``n_neighbors`` is small). Estimated on up to 2,000 sampled points; see
        docs/manifold.md for why. ``intrinsic_dimension_`` is twice that fastest slope.
    alpha : float in [0, 1], default=1.0
        Coifman–Lafon density normalisation (a log-prior ``-alpha log q_j`` on the attention).
    diffusion_time : float >= 0, default=1
        Eigenvectors are scaled by ``eigenvalue ** diffusion_time``.
    n_neighbors : int, "auto" or None, default="auto"
        ``None``: dense attention over all training points (an n x n operator). An int (at
        least 2): a sparse operator on the symmetric k-NN graph (``j`` is among the
        ``n_neighbors`` nearest points of ``i``, itself included, or ``i`` is among ``j``'s),
        built by the engine's exact neighbour search; new points attend to their
        ``n_neighbors`` nearest training points and to those whose k-NN ball contains them.
        ``"auto"``: the dense operator while its n x n float64 array fits in the working
        memory (``skattention.get_config()["working_memory"]``: up to 5,792 points at the
        default 256 MiB) and, with that working memory beside it, in the memory available to
        the process, else the k-NN graph of 15 points (``n_neighbors_``), as
        :class:`~sklearn.manifold.SpectralEmbedding` defaults to a nearest-neighbours affinity.
        An explicit ``None`` whose n x n array cannot fit in the memory available raises a
        ``MemoryError``.
    include_self : bool, default=True
        Keep each point's affinity with itself (``exp(0) = 1``): attention of a point over all
        training points, itself included. ``False`` drops it, as the graph Laplacian of
        :class:`~sklearn.manifold.SpectralEmbedding` does: with ``alpha=0`` and
        ``epsilon=1 / gamma`` the components are then those of
        ``SpectralEmbedding(affinity="rbf", gamma=gamma)`` up to a scale per component (the
        same eigenvectors). ``transform`` still lets a new point attend to every training
        point, so on the training points themselves it no longer reproduces ``embedding_``.
    eigen_solver : {"auto", "dense", "arpack", "lobpcg", "amg"}, default="auto"
        ``"dense"``: a full ``torch.linalg.eigh`` on ``device``. ``"arpack"``: scipy's Lanczos in
        shift-invert mode just above the top eigenvalue 1 (a Cholesky factorisation made in the
        memory of the dense operator, or a sparse LU), which separates the leading eigenvalues
        however close to 1 they crowd. ``"lobpcg"``: LOBPCG for the smallest eigenvalues
        ``1 - mu`` of the Laplacian ``I - A`` with products by the operator only, no
        factorisation; on the k-NN operator preconditioned by a smoothed-aggregation multigrid
        cycle (the graph aggregated level after level down to a few hundred nodes), so that
        the iterations it needs stay about the same as ``n`` grows. ``"amg"``: LOBPCG
        preconditioned by pyamg's smoothed aggregation (``pip install pyamg``). ``"auto"``:
        dense up to 200 points; beyond, arpack on the dense operator and lobpcg on k-NN
        operators (as fast as arpack's sparse LU or faster on every graph measured with up to
        10 components, in far less memory, and on a real table where Lanczos ran for minutes:
        docs/manifold.md); with more than 10 components, arpack on k-NN operators up to
        100,000 points whose sparse LU, estimated from trial factorisations, fits in the
        working memory, lobpcg on the others. An explicit ``"arpack"`` on a k-NN operator
        whose estimated sparse LU exceeds the memory available raises ``MemoryError``. scipy's
        BLAS runs on one thread in every solver.
    eigen_tol : float >= 0 or "auto", default="auto"
        Stopping tolerance of the eigen-solver: for ``"arpack"`` the relative accuracy of the
        eigenvalues (``"auto"``: machine precision), for ``"lobpcg"`` and ``"amg"`` the largest
        residual norm ``||L v - lambda v||`` of the unit eigenvectors ``v`` of the Laplacian
        ``L = I - A`` of the symmetric conjugate ``A`` of ``S`` (``lambda = 1 - mu``), as
        scikit-learn passes it to scipy's ``lobpcg``. ``"auto"``: ``1e-5 lambda`` for each
        eigenvector, which bounds its angle to the exact eigenvector by
        ``1e-5 lambda / gap`` (``gap``: the distance to the other eigenvalues), a ratio that
        does not change with ``n`` although the eigenvalues shrink as the graph grows denser.
        LOBPCG's tolerance is at least ``1e-13`` (products with ``L`` leave residual norms of
        about ``1e-15``: ``0`` asks for that accuracy). A ``ConvergenceWarning`` when 1,000
        iterations do not reach it. Ignored by ``"dense"``.
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"
        Where kernels, neighbours and attention run. The fitted model holds NumPy arrays only.
    random_state : int, RandomState instance or None, default=None
        Seeds the bandwidth rule's sample of points, the Lanczos starting vector, LOBPCG's
        starting block, and the aggregation and the smoothing's Lanczos estimate of the
        multigrid preconditioner.
    verbose : int, default=0
        ``0``: silent. ``1``: progress bars on standard error over the steps of ``fit``
        (neighbours, bandwidth, operator, eigenpairs), over the neighbour search's blocks, the
        Lanczos solves and the LOBPCG iterations, and over the query blocks of a long
        ``transform`` (tqdm when installed, else plain lines;
        ``pip install skattention[progress]``).

    Attributes
    ----------
    embedding_ : ndarray of shape (n_samples, n_components)
        Diffusion coordinates of the training points.
    eigenvalues_ : ndarray of shape (n_components,)
        Eigenvalues ``mu_k`` of the Markov operator ``S`` behind each component (descending).
    laplacian_eigenvalues_ : ndarray of shape (n_components,)
        ``-4 log(mu_k) / epsilon_`` (``S`` is the heat semigroup at time ``epsilon / 4``):
        estimates of the eigenvalues of the limit operator
        ``-(Lap + 2 (1 - alpha) <grad log p, grad>)`` (``k^2`` on the unit circle for
        ``alpha=1``, ``l (l + 1)`` on the unit sphere). With the k-NN operator and
        ``epsilon="auto"``, corrected for the part of the Gaussian the graph cuts off (its mean
        squared step against the untruncated ``intrinsic_dimension_ * epsilon_ / 2``).
    epsilon_ : float
        The bandwidth used.
    n_neighbors_ : int or None
        The k of the k-NN operator, or ``None`` for the dense operator (``n_neighbors``
        resolved).
    intrinsic_dimension_ : float or None
        Dimension estimated by the bandwidth rule (``epsilon="auto"`` only).
    metric_ : transformer or None
        The fitted metric transformer.
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Defined when ``X`` has string feature names.

    See Also
    --------
    sklearn.manifold.SpectralEmbedding : Laplacian eigenmaps, without out-of-sample transform.
    skattention.manifold.attention_generator : The generator the operator approximates.
    skattention.manifold.spectral_cluster_count : Clusters counted from the same spectrum.

    Examples
    --------
    >>> import numpy as np
    >>> from skattention.manifold import AttentionDiffusionEmbedding
    >>> theta = np.linspace(0, 2 * np.pi, 300, endpoint=False)
    >>> circle = np.c_[np.cos(theta), np.sin(theta)]
    >>> emb = AttentionDiffusionEmbedding(n_components=4, random_state=0).fit(circle)
    >>> np.round(emb.laplacian_eigenvalues_, 1)  # k^2 on the circle: 1, 1, 4, 4
    array([1., 1., 4., 4.])
    >>> new = np.array([[1.0, 0.0], [0.0, -1.0]])
    >>> emb.transform(new).shape
    (2, 4)
    """

    _parameter_constraints: dict = {
        "n_components": [Count(Integral, 1, None, closed="left")],
        "metric": [StrOptions({"euclidean"}), HasMethods(["fit", "transform"])],
        "epsilon": [Interval(Real, 0, None, closed="neither"), StrOptions({"auto"})],
        "alpha": [Interval(Real, 0, 1, closed="both")],
        "diffusion_time": [Interval(Real, 0, None, closed="left")],
        # a point's own neighbour alone gives no distance to take a bandwidth from
        "n_neighbors": [Count(Integral, 2, None, closed="left"), StrOptions({"auto"}), None],
        "include_self": ["boolean"],
        "eigen_solver": [StrOptions({"auto", "dense", "arpack", "lobpcg", "amg"})],
        "eigen_tol": [Interval(Real, 0, None, closed="left"), StrOptions({"auto"})],
        "device": [str, torch.device],
        "random_state": ["random_state"],
        "verbose": ["verbose"],
    }

    def __init__(
        self,
        n_components=2,
        *,
        metric="euclidean",
        epsilon="auto",
        alpha=1.0,
        diffusion_time=1,
        n_neighbors="auto",
        include_self=True,
        eigen_solver="auto",
        eigen_tol="auto",
        device="auto",
        random_state=None,
        verbose=0,
    ):
        self.n_components = n_components
        self.metric = metric
        self.epsilon = epsilon
        self.alpha = alpha
        self.diffusion_time = diffusion_time
        self.n_neighbors = n_neighbors
        self.include_self = include_self
        self.eigen_solver = eigen_solver
        self.eigen_tol = eigen_tol
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    # The metric transformer is validated by its own fit.
    @_fit_context(prefer_skip_nested_validation=False)
    def fit(self, X, y=None):
        """Build the attention operator of ``X`` and embed with its leading eigenvectors.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,), default=None
            Passed to ``metric.fit`` when ``metric`` is an unfitted transformer; else ignored.

        Returns
        -------
        self : object
        """
        X = self._validate_X(X, reset=True)
        n = _num_samples(X)
        if self.n_components >= n:
            raise ValueError(
                f"n_components={self.n_components} must be smaller than n_samples={n}: the "
                "embedding drops the trivial eigenvector."
            )
        n_neighbors = resolve_n_neighbors(self.n_neighbors, n)
        if n_neighbors is not None and n_neighbors > n:
            raise ValueError(f"n_neighbors={n_neighbors} must be at most n_samples={n}.")
        # Fail before any work when the dense n x n arrays cannot fit in memory.
        check_dense_memory(n, n_neighbors, self.eigen_solver, self.n_components + 1)
        device = resolve_device(self.device)
        rng = check_random_state(self.random_state)
        self.metric_ = self._fit_metric(X, y)
        Z = self._to_metric_space(X)

        n_steps = 2 + (n_neighbors is not None) + (self.epsilon == "auto")
        with _overflow_advice(), progress_bar(
            self.verbose, total=n_steps, desc=f"{type(self).__name__} fit", unit="step"
        ) as bar:
            op = self._operator(Z, n_neighbors, rng, device, bar)
            mu, v = self._eigenpairs(op, Z, rng, device, bar)
            bar.set_postfix_str("done")
        if not op.connected or mu[1] > 1.0 - _DISCONNECTED_GAP:
            warn_user(_NOT_CONNECTED, UserWarning)
        psi = diffusion_coordinates(op, v)[:, 1:]
        mu = mu[1:]
        del op.A, v

        self.n_neighbors_ = n_neighbors
        self.eigenvalues_ = mu
        self.laplacian_eigenvalues_ = laplacian_eigenvalues(
            mu, op, self.epsilon_, self.intrinsic_dimension_
        )
        self.embedding_ = psi * signed_power(mu, self.diffusion_time)[None, :]
        # Nyström: transform(x) = mu^t psi(x) = mu^(t-1) sum_j S(x, x_j) psi(x_j).
        self._nystrom_values = psi * signed_power(mu, self.diffusion_time - 1)[None, :]
        self._fit_Z = Z
        self._log_prior = op.log_prior
        self._radius = op.radius
        return self

    def _step(self, bar, name, compute, max_subtasks=0):
        """One step of the fit, a subtask of it for scikit-learn's callbacks (a stop request
        is ignored: no embedding exists before the eigen-solve has run)."""
        bar.set_postfix_str(name)
        task = begin_subtask(self, name, max_subtasks=max_subtasks)
        result = compute(task)
        bar.update()
        end_subtask(self, task)
        return result

    def _operator(self, Z, n_neighbors, rng, device, bar):
        """The k-NN graph (when ``n_neighbors``), the bandwidth (``epsilon_``,
        ``intrinsic_dimension_``) and the diffusion operator."""
        # the keys prepared once for the graph and the bandwidth rule's neighbours
        keys = prepare_keys(Z, device=device, dtype="float64")
        auto = self.epsilon == "auto"
        sample = bandwidth_sample(Z.shape[0], rng) if auto else None
        knn = reference = None
        if n_neighbors is not None:
            knn, reference = self._step(bar, "k-NN graph", lambda _: knn_graph_and_reference(
                Z, n_neighbors, sample, reference_size(Z.shape[0], n_neighbors), device,
                keys=keys, progress=self.verbose))
        if auto:
            self.epsilon_, self.intrinsic_dimension_ = self._step(
                bar, "bandwidth",
                lambda _: auto_epsilon(Z, None if knn is None else knn[0], rng, device, keys,
                                       sample=sample, reference=reference),
            )
        else:
            self.epsilon_, self.intrinsic_dimension_ = float(self.epsilon), None
        return self._step(bar, "operator", lambda _: diffusion_operator(
            Z, self.epsilon_, self.alpha, knn, device, include_self=self.include_self))

    def _eigenpairs(self, op, Z, rng, device, bar):
        """The leading eigenpairs of ``op``; the iterations of an iterative solver (Lanczos
        solves, LOBPCG iterations: their number is not known in advance) are subtasks of the
        step, the dense eigh (one LAPACK call) has none."""
        k = self.n_components + 1
        # the size of a k-NN operator's sparse LU estimated once where arpack would factorise
        # it (LOBPCG for "auto" beyond the working memory, a MemoryError for an explicit
        # "arpack" beyond the memory available)
        solver = resolve_eigen_solver(self.eigen_solver, op.A.shape[0], k, sp.issparse(op.A),
                                      A=op.A)
        iteration = "Lanczos solve" if solver == "arpack" else "LOBPCG iteration"

        def solve(task, A, eigen_solver, after_arpack=False):
            return top_eigenpairs(
                A, k, eigen_solver, device, rng, sqrt_degree=np.sqrt(op.degree),
                eigen_tol=self.eigen_tol, progress=self.verbose,
                on_solve=None if task is None else (
                    lambda: report_subtask(self, iteration, parent=task)
                ),
                after_arpack=after_arpack, resolved=True,
            )

        def solve_or_fall_back(task):
            try:
                return solve(task, op.A, solver)
            except ArpackNoConvergence:
                # eigenvalues equal to 1 to rounding (epsilon small for the data's spacing):
                # LOBPCG's block takes them, as SpectralEmbedding falls back to it
                warn_user("ARPACK did not converge (eigenvalues crowded at 1: is epsilon "
                          "small for the data?); falling back to LOBPCG.", RuntimeWarning)
                if not sp.issparse(op.A):  # the dense A was factorised in place: built again
                    op.A = None
                    op.A = diffusion_operator(Z, self.epsilon_, self.alpha, None, device,
                                              include_self=self.include_self).A
                lobpcg = resolve_eigen_solver("lobpcg", op.A.shape[0], k, sp.issparse(op.A))
                return solve(task, op.A, lobpcg, after_arpack=True)

        return self._step(bar, "eigenpairs", solve_or_fall_back,
                          max_subtasks=None if solver != "dense" else 0)

    def _fit_subtasks(self):
        """Subtasks of the fit for scikit-learn's callbacks: its steps (k-NN graph, bandwidth,
        operator, eigenpairs), the solver's iterations being those of the eigen-solve; not known
        in advance with ``n_neighbors="auto"`` (the operator depends on the data's size)."""
        if self.n_neighbors == "auto":
            return None
        return 2 + (self.n_neighbors is not None) + (self.epsilon == "auto")

    def fit_transform(self, X, y=None):
        """Fit and return ``embedding_``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,), default=None
            See :meth:`fit`.

        Returns
        -------
        X_new : ndarray of shape (n_samples, n_components)
        """
        return self.fit(X, y).embedding_

    def transform(self, X):
        """Embed points by attention to the training points (the Nyström extension).

        ``transform`` of the training points reproduces ``embedding_``, except with
        ``include_self=False`` and, with the k-NN operator, on points with exactly tied k-th
        neighbour distances (integer data: the fitted graph keeps ``k`` of the tied points,
        ``transform`` all of them; see docs/manifold.md). The attention is a softmax: a point
        far beyond the kernel's reach of every training point (all its affinities below
        floating point) takes its nearest training points' extension, the softmax's limit,
        rather than zeros.

        Parameters
        ----------
        X : array-like of shape (n_queries, n_features)

        Returns
        -------
        X_new : ndarray of shape (n_queries, n_components)
        """
        check_is_fitted(self)
        Z = self._to_metric_space(self._validate_X(X, reset=False))
        with _overflow_advice():
            if self.n_neighbors_ is not None:
                return knn_nystrom(
                    Z, self._fit_Z, self._nystrom_values, n_neighbors=self.n_neighbors_,
                    epsilon=self.epsilon_, log_prior=self._log_prior, radius=self._radius,
                    slack=_RADIUS_SLACK, device=self.device, progress=self.verbose,
                )
            out = attention(
                Z,
                self._fit_Z,
                self._nystrom_values,
                temperature=self.epsilon_,
                log_prior=self._log_prior,
                device=self.device,
                dtype="float64",
                progress=self.verbose,
            )
        return np.asarray(out, dtype=np.float64)

    def _validate_X(self, X, reset):
        """``X`` checked as floats, or, where ``metric`` is a transformer, only its width and
        feature names: the transformer checks (and encodes) the raw table itself (a
        :class:`~skattention.MetricAttentionTransformer` takes strings, categories and missing
        values), and its output is what the engine needs as floats
        (:meth:`_to_metric_space`). After the fit, the fitted ``metric_`` decides, not
        ``metric``, which ``set_params`` may have changed since."""
        transformer = not isinstance(self.metric, str) if reset else self.metric_ is not None
        if not transformer:
            return validate_data(self, X, reset=reset, dtype=[np.float64, np.float32],
                                 ensure_min_samples=2 if reset else 1)
        validate_data(self, X, reset=reset, skip_check_array=True)
        if reset and _num_samples(X) < 2:
            raise ValueError(f"Found array with {_num_samples(X)} sample(s) while a minimum of "
                             f"2 is required by {type(self).__name__}.")
        return X

    def _fit_metric(self, X, y):
        if isinstance(self.metric, str):
            return None
        try:
            check_is_fitted(self.metric)
            return self.metric
        except NotFittedError:
            return clone(self.metric).fit(X, y)

    def _to_metric_space(self, X):
        Z = X if self.metric_ is None else self.metric_.transform(X)
        Z = np.asarray(Z, dtype=np.float64)
        if Z.ndim != 2 or not np.isfinite(Z).all():
            raise ValueError("the metric transformer must return a finite 2-D array.")
        return Z

    @property
    def _n_features_out(self):
        # the fit's width (an AttributeError before it: get_feature_names_out's NotFittedError),
        # not n_components, which set_params may have changed since
        return self.embedding_.shape[1]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64"]
        return tags
