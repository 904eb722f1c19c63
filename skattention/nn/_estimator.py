"""AttentionNetworkClassifier: a scikit-learn classifier training the seed paper's IPN."""

import copy
from numbers import Integral, Real

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from .._engine import (
    EarlyStopping,
    ProgressReport,
    progress_bar,
    resolve_device,
    seeded_torch_rng,
    small_work_single_threaded,
    train_network,
)
from ..utils._callbacks import EpochTasks
from ..utils._convergence import warn_if_max_iter_reached
from ..utils._device import DevicePortableMixin, _cuda_nondeterministic
from ..utils._estimator import EstimatorMixin
from ..utils._param_validation import Count, Interval, StrOptions
from ..utils._sklearn_compat import _fit_context
from ..utils._validation import ProbabilisticClassifierMixin, encode_classes, standardisation
from ._attention import METRICS
from ._ipn import IPN

_AUTO_BATCH = 512


def _finite_weights(net):
    """Whether every parameter of the network ``net`` is finite."""
    return all(bool(torch.isfinite(p).all()) for p in net.parameters())


class AttentionNetworkClassifier(ProbabilisticClassifierMixin, ClassifierMixin,
                                 EstimatorMixin, DevicePortableMixin, BaseEstimator):
    """Classifier training an IPN: attention blocks that propagate across the samples of a batch.

    The network (:class:`skattention.nn.IPN`) is a linear layer, ``n_blocks`` residual attention
    blocks ``h <- h + MetricAttention(h, h, h)`` in which every sample attends to the other
    samples of its batch, and a linear layer giving the class logits. It is trained with Adam
    (L2 weight decay) on the cross-entropy of minibatches; within a minibatch the samples attend
    to each other (themselves included). This is the network of the seed paper's experiments
    (:doc:`/theory`), comparing metric-attention (``"mlp"``), L2 self-attention
    (``"linear"``) and self-attention (``"dot"``).

    **Inference rule.** A query attends to the whole training set plus itself, never to the other
    queries: the training samples propagate among themselves through the blocks, and each query
    ``x`` follows them with keys ``training set + {x}``. So a prediction does not depend on the
    other samples passed to ``predict``. Prediction runs in float64 (the network is copied), so
    chunking the queries changes the result only at the level of float64 rounding.

    Parameters
    ----------
    metric : {"mlp", "linear", "dot"}, default="mlp"
        Attention of the blocks: ``"mlp"`` is metric-attention,
        ``f(x, y) = ||phi(W x) - phi(W y)||^2`` with ``phi`` a residual tanh MLP; ``"linear"`` is
        L2 self-attention ``||W x - W y||^2``; ``"dot"`` is dot-product self-attention.
    width : int, default=32
        Width of the hidden representation (the paper: 10 on two moons, 100 on MNIST).
    n_blocks : int, default=2
        Number of attention blocks.
    num_heads : int, default=1
        Heads per attention block (``width`` must be divisible by it).
    max_iter : int, default=100
        Maximum number of epochs (passes over the training data); reaching it without the
        stopping rule of ``tol`` gives a ``ConvergenceWarning``.
    batch_size : int or "auto", default="auto"
        Samples per minibatch, i.e. per attention set. ``"auto"``: all samples up to 512.
    learning_rate : float, default=3e-3
        Adam learning rate (the paper: 1e-3 on two moons, 1e-4 on MNIST, with more epochs).
    weight_decay : float, default=1e-4
        Adam (L2) weight decay.
    tol : float, default=1e-4
        Training stops when the mean training loss of an epoch has not improved by ``tol`` for
        ``n_iter_no_change`` epochs (as in :class:`~sklearn.neural_network.MLPClassifier`).
    n_iter_no_change : int, default=10
        Epochs without an improvement of ``tol`` before stopping.
    random_state : int, RandomState instance or None, default=None
        Seeds the initialisation and the minibatch order.
    verbose : int, default=0
        ``0``: silent. ``1``: a progress bar over the epochs with the training loss, on standard
        error (tqdm when installed, else plain lines; ``pip install skattention[progress]``).
        ``2``: also one line per epoch.
    device : {"auto", "cpu", "cuda", "cuda:N"} or torch.device, default="auto"
        Training device. ``"auto"``: CUDA when available, else the CPU (the default of every
        skattention estimator). Prediction runs on the CPU in float64 (see above).

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        Class labels.
    network_ : skattention.nn.IPN
        The trained network (float32, on the CPU), operating on standardised inputs.
    loss_curve_ : list of float
        Mean training cross-entropy of each epoch.
    n_iter_ : int
        Number of epochs run.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Names of features seen during fit, when ``X`` has string column names.

    See Also
    --------
    skattention.MetricAttentionClassifier : Attention over the training set with a metric
        trained by leave-one-out likelihood (no propagation blocks).

    Examples
    --------
    >>> from sklearn.datasets import make_moons
    >>> from skattention.nn import AttentionNetworkClassifier
    >>> X, y = make_moons(200, noise=0.2, random_state=0)
    >>> clf = AttentionNetworkClassifier(width=10, max_iter=100, learning_rate=1e-2,
    ...                                  random_state=0).fit(X[:150], y[:150])
    >>> clf.predict_proba(X[150:]).shape
    (50, 2)
    >>> clf.score(X[150:], y[150:]) > 0.9
    True
    """

    _parameter_constraints: dict = {
        "metric": [StrOptions(set(METRICS))],
        "width": [Count(Integral, 1, None, closed="left")],
        "n_blocks": [Count(Integral, 0, None, closed="left")],
        "num_heads": [Count(Integral, 1, None, closed="left")],
        "max_iter": [Count(Integral, 1, None, closed="left")],
        "batch_size": [Count(Integral, 1, None, closed="left"), StrOptions({"auto"})],
        "learning_rate": [Interval(Real, 0, None, closed="neither")],
        "weight_decay": [Interval(Real, 0, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "n_iter_no_change": [Count(Integral, 1, None, closed="left")],
        "random_state": ["random_state"],
        "verbose": ["verbose"],
        "device": [str, torch.device],
    }

    def __init__(self, metric="mlp", *, width=32, n_blocks=2, num_heads=1, max_iter=100,
                 batch_size="auto", learning_rate=3e-3, weight_decay=1e-4, tol=1e-4,
                 n_iter_no_change=10, random_state=None, verbose=0, device="auto"):
        self.metric = metric
        self.width = width
        self.n_blocks = n_blocks
        self.num_heads = num_heads
        self.max_iter = max_iter
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay
        self.tol = tol
        self.n_iter_no_change = n_iter_no_change
        self.random_state = random_state
        self.verbose = verbose
        self.device = device

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y):
        """Train the network on (X, y).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training data.
        y : array-like of shape (n_samples,)
            Class labels (numbers or strings).

        Returns
        -------
        self : AttentionNetworkClassifier
            The fitted classifier.
        """
        X, y = validate_data(self, X, y, dtype=[np.float64, np.float32])
        self.classes_, y_encoded = encode_classes(self, y)
        if self.width % self.num_heads:
            raise ValueError(f"width={self.width} must be divisible by num_heads={self.num_heads}.")
        device = resolve_device(self.device)
        rng = check_random_state(self.random_state)
        self._x_mean, self._x_scale = standardisation(X)
        Xt = torch.tensor(self._standardise(X), dtype=torch.float32, device=device)
        yt = torch.tensor(y_encoded, dtype=torch.long, device=device)
        n = X.shape[0]
        batch_size = min(n, _AUTO_BATCH if self.batch_size == "auto" else self.batch_size)
        seed = int(rng.randint(np.iinfo(np.int32).max))
        # private seeded RNG for initialisation (and dropout); the caller's is restored
        with seeded_torch_rng(seed, device) as release_rng:
            net = IPN(X.shape[1], self.classes_.size, width=self.width, n_blocks=self.n_blocks,
                      metric=self.metric, num_heads=self.num_heads).to(device, torch.float32)
            release_rng(net)  # training draws nothing from it (unless dropout)
            name = type(self).__name__
            with progress_bar(
                self.verbose, total=self.max_iter, desc=f"{name} fit", unit="epoch"
            ) as bar:
                history = train_network(
                    net, Xt, yt, max_iter=self.max_iter, batch_size=batch_size,
                    learning_rate=self.learning_rate, weight_decay=self.weight_decay,
                    order=lambda: torch.as_tensor(rng.permutation(n), device=device),
                    callbacks=[ProgressReport(bar, name, self.max_iter, self.verbose),
                               EarlyStopping(self.n_iter_no_change, self.tol),
                               EpochTasks(self, lambda: self._epoch_attributes(net, X))],
                    # each block: a minibatch's scores and weighted values over itself; and
                    # the dense layers (input, blocks, output)
                    step_work=batch_size * (self.n_blocks * batch_size * 2 * self.width
                                            + self.width * (X.shape[1] + self.classes_.size
                                                            + 2 * self.n_blocks * self.width)),
                )
        if not (np.all(np.isfinite(history.loss_curve)) and _finite_weights(net)):
            # NaN weights would give NaN probabilities, silently
            raise ValueError(
                f"Training diverged: the training loss or the network's weights are not finite "
                f"after {history.n_iter} epochs; lower learning_rate (={self.learning_rate:g})."
            )
        warn_if_max_iter_reached(
            self, history.n_iter,
            f"the training loss stopped improving by tol={self.tol} for "
            f"n_iter_no_change={self.n_iter_no_change} epochs",
        )
        self.loss_curve_ = history.loss_curve
        self.network_ = net.to("cpu").eval()
        self.n_iter_ = history.n_iter
        self._fit_X = self._standardise(X).astype(np.float64)
        return self

    def _epoch_attributes(self, net, X):
        """The fitted attributes of the model after a training epoch, for scikit-learn's
        callbacks (``ScoringMonitor`` scores it): a copy of the network being trained."""
        return {"network_": copy.deepcopy(net).to("cpu").eval(),
                "_fit_X": self._standardise(X).astype(np.float64)}

    def _fit_subtasks(self):
        """Subtasks of the fit for scikit-learn's callbacks: the training epochs."""
        return self.max_iter

    def _standardise(self, X):
        with np.errstate(over="ignore"):
            Z = (X - self._x_mean) / self._x_scale
        if not np.all(np.isfinite(Z)):  # differences beyond float64's largest: scaled first
            Z = X / self._x_scale - self._x_mean / self._x_scale
        return Z

    def _predict_proba(self, X):
        """Each query attends to the training set plus itself (float64, on the CPU)."""
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=[np.float64, np.float32])
        net, context = self._inference()
        # a few rows (a single row served) on one thread: each block's kernels over the m
        # training samples are too short for a parallel region to pay, and on a busy machine
        # every region waits for a descheduled thread (work: the scores' and values' products)
        work = 2 * X.shape[0] * context.n_samples * (self.width + self.num_heads) * self.n_blocks
        with torch.no_grad(), small_work_single_threaded(work, torch.device("cpu")):
            logits = net(torch.tensor(self._standardise(X), dtype=torch.float64), context=context)
            proba = torch.softmax(logits, dim=1).numpy()
        if not np.all(np.isfinite(proba)):  # NaN probabilities, silently, before
            if not _finite_weights(net):
                raise ValueError(  # (a callback's copy during a diverging fit, an old pickle)
                    "The network's weights are not finite (its training diverged); fit it "
                    "again with a lower learning_rate."
                )
            raise ValueError(
                "X holds values too far from the training data's range for the network: its "
                "float64 computations overflow (NaN probabilities); rescale the data."
            )
        return proba

    def _inference(self):
        """The network in float64 and its training set propagated through the blocks
        (``IPN.prepare_context``), made once per fitted network (again where its parameters
        were changed or the training set replaced): a call then costs its queries' attention
        over the training set, not the training set's over itself. Kept with the estimator: about
        ``n_blocks * m * (2 * width + num_heads)`` float64 numbers for m training samples."""
        def build(network, device, dtype):
            net = copy.deepcopy(network).to(device, dtype).eval()
            with torch.no_grad():
                return net, net.prepare_context(torch.from_numpy(self._fit_X).to(device))

        network = self.network_
        # (the training set by identity, as a new fit replaces it; the parameters by value
        # against those of the last preparation: a change through .data or load_state_dict
        # counts as well)
        version = (self._fit_X, *network.parameters(), *network.buffers())
        return self._on_device("inference", network, torch.device("cpu"), torch.float64, build,
                               version)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False
        tags.non_deterministic = _cuda_nondeterministic(self.device)
        return tags
