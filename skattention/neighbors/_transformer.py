"""MetricAttentionTransformer: the learned pseudo-metric as a transformer (like NCA)."""

import numpy as np
from sklearn.base import ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from .._engine import resolve_device
from ..utils._param_validation import StrOptions
from ..utils._sklearn_compat import _fit_context, _num_samples
from ..utils._threads import uses_n_jobs
from . import _docs
from ._base import _BaseMetricAttention
from ._queries import NeighborsQueryMixin


class MetricAttentionTransformer(
    ClassNamePrefixFeaturesOutMixin, TransformerMixin, NeighborsQueryMixin, _BaseMetricAttention,
):
    """Map inputs into the space of a pseudo-metric learned by attention from class labels.

    The metric is trained exactly as in :class:`MetricAttentionClassifier`: leave-one-out
    soft-neighbour likelihood of the labels, each training point attending to sampled candidates
    with ``f(x, y) = ||phi(x) - phi(y)||`` (squared for ``"mlp"`` and ``"linear"``).
    ``transform`` returns ``phi(x)``, so Euclidean
    methods applied afterwards (k-NN, k-means, a diffusion embedding) work in the learned metric,
    like :class:`~sklearn.neighbors.NeighborhoodComponentsAnalysis` with a non-linear map.
    :meth:`kneighbors` and :meth:`radius_neighbors` find the training points nearest to a query
    in that space (those of :class:`~sklearn.neighbors.NearestNeighbors` fitted on
    ``transform(X)``, queried with ``transform`` of the queries), as the classifier's do.

    Parameters
    ----------
    n_components : int, default=None
        Dimension of the output. ``None``: 64 for ``"tabular"``; otherwise the number of
        features, at most 128 (then initialised by PCA). At most the number of features (after
        encoding) for ``"linear"``, as in NCA.
    metric : {"tabular", "mlp", "linear"}, default="tabular"
        ``"tabular"``: ``phi`` embeds numbers and categories and is trained with the
        non-squared distance (see :class:`MetricAttentionClassifier` and :doc:`/tabular`);
        ``"mlp"``: ``phi`` is a residual MLP; ``"linear"``: ``phi(x) = W x`` (as in NCA).
    {TEMPERATURE}
    class_weight : dict or "balanced", default=None
        Weight of each class in the training loss and as a prior on the candidates.
    numeric_embedding : {"auto", "plr", "none"}, default="auto"
        Periodic embeddings of the numbers for ``metric="tabular"`` (``"auto"``: from 1,500
        training samples); see :class:`MetricAttentionClassifier`.
    hidden_size : int, default=256
        Width of the hidden layer of each residual block (``metric="mlp"``).
    n_blocks : int, default=1
        Number of residual blocks (``metric="mlp"``).
    activation : {"relu", "tanh", "gelu"}, default="relu"
        Activation of the residual blocks.
    dropout : float in [0, 1), default=0.0
        Dropout inside the residual blocks during training.
    max_iter : int, default=100
        Maximum number of epochs.
    batch_size : int or "auto", default="auto"
        Training points per minibatch; ``"auto"``: 256 with ``metric="tabular"``, else 1,024
        (all of them when fewer).
    learning_rate : float, default=1e-2
        AdamW learning rate.
    weight_decay : float, default=2e-4
        AdamW weight decay of the map.
    sample_rate : float in (0, 1] or "auto", default="auto"
        Fraction of training points sampled as candidates per minibatch; ``"auto"``: the batch
        and half of the other points, at most 256 of them with ``metric="tabular"`` (a
        sixteenth of them up to 8,192 from 16,384 training points), else 1,024.
    early_stopping : bool, default=True
        Stop on the loss of a held-out validation set (see :class:`MetricAttentionClassifier`).
    validation_fraction : float in (0, 1), default=0.15
        Held-out fraction for early stopping.
    n_iter_no_change : int, default=3
        Epochs without improvement before stopping.
    tol : float, default=1e-4
        Minimum improvement of the validation loss (or training loss).
    warm_start : bool, default=False
        Continue training the fitted map on the next ``fit``.
    random_state : int, RandomState instance or None, default=None
        Seeds everything random in training; an int gives bit-identical maps on the CPU at a
        given torch thread count.
    verbose : int, default=0
        ``0``: silent. ``1``: a progress bar on standard error over the training epochs (loss
        and validation score; tqdm when installed, else plain lines;
        ``pip install skattention[progress]``). ``2``: also one line per epoch.
    {DEVICE}
    {CATEGORICAL}

    Attributes
    ----------
    map_ : torch.nn.Module
        The learned map (on the CPU), applied to the encoded inputs (see :doc:`/tabular`).
    temperature_ : float
        The learned (or fixed) temperature.
    loss_curve_ : list of float
        Mean training loss per epoch.
    validation_scores_ : list of float or None
        Validation accuracy per epoch with ``early_stopping``.
    validation_loss_curve_ : list of float or None
        Validation loss per epoch with ``early_stopping`` (the stopping criterion).
    best_validation_score_ : float or None
        Validation accuracy of the restored (lowest validation loss) epoch.
    n_iter_ : int
        Epochs run.
    classes_ : ndarray of shape (n_classes,)
        Class labels seen in fit.
    outputs_2d_ : bool
        ``False``: ``y`` is one column of class labels.
    n_samples_fit_ : int
        Number of training samples (the points :meth:`kneighbors` can return).
    {INPUT_ATTRIBUTES}

    See Also
    --------
    MetricAttentionClassifier : Classification by attention in the learned metric.
    sklearn.neighbors.NeighborhoodComponentsAnalysis : The linear, full-batch ancestor.

    Examples
    --------
    >>> from sklearn.datasets import load_wine
    >>> from sklearn.neighbors import KNeighborsClassifier
    >>> from sklearn.pipeline import make_pipeline
    >>> from skattention import MetricAttentionTransformer
    >>> X, y = load_wine(return_X_y=True)
    >>> pipe = make_pipeline(MetricAttentionTransformer(n_components=2, random_state=0),
    ...                      KNeighborsClassifier())
    >>> pipe.fit(X, y).score(X, y) > 0.9
    True
    >>> pipe[0].transform(X).shape
    (178, 2)
    """

    _parameter_constraints: dict = {
        **_BaseMetricAttention._parameter_constraints,
        "metric": [StrOptions({"mlp", "linear", "tabular"})],
        "class_weight": [dict, StrOptions({"balanced"}), None],
    }
    for _name in ("n_neighbors", "radius", "weights", "p", "prototypes"):
        _parameter_constraints.pop(_name)
    del _name

    def __init__(self, n_components=None, *, metric="tabular", temperature="auto",
                 class_weight=None,
                 numeric_embedding="auto", hidden_size=256, n_blocks=1, activation="relu",
                 dropout=0.0, max_iter=100, batch_size="auto", learning_rate=1e-2,
                 weight_decay=2e-4, sample_rate="auto", early_stopping=True,
                 validation_fraction=0.15, n_iter_no_change=3, tol=1e-4, warm_start=False,
                 random_state=None, verbose=0, device="auto", dtype=None, n_jobs=None,
                 categorical_features="from_dtype"):
        # n_neighbors, radius, weights and p, the base's prediction-time settings, keep their
        # defaults, and there are no prototypes of the keys: a transformer does not predict.
        super().__init__(
            metric, temperature=temperature, n_components=n_components, prototypes=None,
            numeric_embedding=numeric_embedding, hidden_size=hidden_size,
            n_blocks=n_blocks, activation=activation, dropout=dropout, max_iter=max_iter,
            batch_size=batch_size, learning_rate=learning_rate, weight_decay=weight_decay,
            sample_rate=sample_rate, early_stopping=early_stopping,
            validation_fraction=validation_fraction, n_iter_no_change=n_iter_no_change, tol=tol,
            warm_start=warm_start, random_state=random_state, verbose=verbose, device=device,
            dtype=dtype, n_jobs=n_jobs, categorical_features=categorical_features,
        )
        self.class_weight = class_weight

    @_fit_context(prefer_skip_nested_validation=True)
    @uses_n_jobs
    def fit(self, X, y, sample_weight=None):
        """Learn the map from labelled data.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training data.
        y : array-like of shape (n_samples,)
            Class labels.
        sample_weight : array-like of shape (n_samples,), default=None
            Weight of each training point in the loss and as a candidate.

        Returns
        -------
        self : MetricAttentionTransformer
            The fitted transformer.
        """
        return self._fit_labels(X, y, sample_weight)

    @uses_n_jobs
    def fit_transform(self, X, y, sample_weight=None):
        """Fit, then map the training data.

        As ``fit(X, y).transform(X)``, except where the encoding adds target statistics
        (``metric="tabular"`` on many rows; see ``categorical_features``): the training rows
        then take the cross-fitted statistics they were trained with, not those of every
        training row, so that a model after this one in a pipeline does not learn from
        statistics that saw each row's own target (as
        :meth:`sklearn.preprocessing.TargetEncoder.fit_transform`).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training data.
        y : array-like of shape (n_samples,)
            Class labels.
        sample_weight : array-like of shape (n_samples,), default=None
            Weight of each training point in the loss and as a candidate.

        Returns
        -------
        X_new : ndarray of shape (n_samples, n_components)
            ``phi`` of the encoded training inputs.
        """
        self.fit(X, y, sample_weight)
        encoder = getattr(self._strategy.input, "encoder", None)
        inputs = getattr(self._keys, "inputs", None)
        if (len(getattr(encoder, "statistic_columns_", ())) == 0 or inputs is None
                or inputs.shape[0] != _num_samples(X)):
            return self.transform(X)
        return self._embedded([inputs])

    @uses_n_jobs
    def transform(self, X):
        """Map ``X`` into the learned space.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Data to map.

        Returns
        -------
        X_new : ndarray of shape (n_samples, n_components)
            ``phi`` of the encoded inputs, float32 for float32 input, else float64.
        """
        check_is_fitted(self, "_keys")
        return self._embedded(self._encoded_blocks(X))

    def _embedded(self, blocks):
        """``phi`` of encoded row ``blocks``, each in its own dtype, as one array."""
        device, dtype = resolve_device(self.device), self._compute_dtype()
        return np.concatenate([self._strategy.embed(Q, "key", device, dtype)
                               .astype(Q.dtype, copy=False) for Q in blocks])

    @property
    def _n_features_out(self):
        return self.map_.n_components

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = True
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags


MetricAttentionTransformer.__doc__ = _docs.fill(MetricAttentionTransformer.__doc__)
