"""A 2-D embedding coloured by label."""

from numbers import Integral

import numpy as np
from sklearn.utils.multiclass import type_of_target
from sklearn.utils.validation import check_is_fitted, column_or_1d

from ._base import get_axes


class EmbeddingDisplay:
    """Points of a 2-D embedding, coloured by label (or by a continuous target).

    Class labels (a target that :func:`~sklearn.utils.multiclass.type_of_target` calls binary or
    multiclass) get one colour each from a qualitative colour map and a legend; a continuous
    target a sequential colour map and a colour bar. Create it with :meth:`from_estimator`, or
    directly from coordinates (for example to draw cluster labels on a projection).

    Parameters
    ----------
    embedding : ndarray of shape (n_samples, 2)
        Coordinates.
    y : array-like of shape (n_samples,), default=None
        Labels or values used to colour the points.
    xlabel, ylabel : str, default="component 1", "component 2"

    Attributes
    ----------
    scatter_ : matplotlib PathCollection
        The points, in the order of ``embedding``; with class labels ``get_array()`` holds each
        point's class index into ``classes_``.
    classes_ : ndarray or None
        The sorted class labels (None for a continuous or missing ``y``).
    legend_ : matplotlib Legend or None
    colorbar_ : matplotlib Colorbar or None
    ax_ : matplotlib Axes
    figure_ : matplotlib Figure

    Examples
    --------
    >>> from sklearn.datasets import load_iris
    >>> from skattention import AttentionDiffusionEmbedding
    >>> from skattention.plotting import EmbeddingDisplay
    >>> X, y = load_iris(return_X_y=True)
    >>> embedding = AttentionDiffusionEmbedding(n_components=2, random_state=0).fit(X)
    >>> display = EmbeddingDisplay.from_estimator(embedding, X, y)
    >>> display.classes_
    array([0, 1, 2])
    """

    def __init__(self, embedding, y=None, *, xlabel="component 1", ylabel="component 2"):
        self.embedding = embedding
        self.y = y
        self.xlabel = xlabel
        self.ylabel = ylabel

    def plot(self, ax=None, *, s=10, title=None):
        """Draw the points.

        Parameters
        ----------
        ax : matplotlib Axes, default=None
            Axes to draw on; new ones on a new figure when None.
        s : float, default=10
            Marker area.
        title : str, default=None
            Axes title.

        Returns
        -------
        display : EmbeddingDisplay

        Examples
        --------
        >>> import matplotlib
        >>> matplotlib.use("Agg")  # draw off screen
        >>> import matplotlib.pyplot as plt
        >>> import numpy as np
        >>> from skattention.plotting import EmbeddingDisplay
        >>> Z = np.random.default_rng(0).normal(size=(20, 2))
        >>> display = EmbeddingDisplay(Z, y=Z[:, 0] ** 2).plot(s=20, title="a continuous target")
        >>> display.classes_ is None, display.colorbar_ is not None  # a colour bar, no legend
        (True, True)
        >>> plt.close("all")
        """
        ax = get_axes(ax, "EmbeddingDisplay")
        Z = np.asarray(self.embedding, dtype=np.float64)
        if Z.ndim != 2 or Z.shape[1] != 2:
            raise ValueError(f"embedding must have shape (n_samples, 2), got {Z.shape}.")
        self.classes_ = self.legend_ = self.colorbar_ = None
        if self.y is None:
            self.scatter_ = ax.scatter(Z[:, 0], Z[:, 1], s=s)
        else:
            y = column_or_1d(self.y)
            if y.shape[0] != Z.shape[0]:
                raise ValueError(f"y has {y.shape[0]} values for {Z.shape[0]} points.")
            if type_of_target(y) in ("binary", "multiclass"):
                self.classes_, codes = np.unique(y, return_inverse=True)
                k = self.classes_.size
                # one colour each: the qualitative maps up to 20 classes, then evenly spaced
                # hues (tab20 alone gave the classes from the 20th on its last colour)
                cmap = "tab10" if k <= 10 else "tab20" if k <= 20 else "hsv"
                top = 10 if k <= 10 else 20 if k <= 20 else k
                self.scatter_ = ax.scatter(Z[:, 0], Z[:, 1], c=codes, s=s, cmap=cmap, vmin=-0.5,
                                           vmax=top - 0.5)
                handles, _ = self.scatter_.legend_elements(num=list(range(k)))
                self.legend_ = ax.legend(
                    handles,
                    [str(c) for c in self.classes_],
                    loc="best",
                    fontsize="small",
                    markerscale=0.8,
                    ncols=1 if k <= 10 else 2,
                )
            else:
                self.scatter_ = ax.scatter(
                    Z[:, 0], Z[:, 1], c=y.astype(np.float64), s=s, cmap="viridis"
                )
                self.colorbar_ = ax.figure.colorbar(self.scatter_, ax=ax)
        ax.set_xlabel(self.xlabel)
        ax.set_ylabel(self.ylabel)
        if title is not None:
            ax.set_title(title)
        self.ax_, self.figure_ = ax, ax.figure
        return self

    @classmethod
    def from_estimator(cls, embedding, X, y=None, *, components=(0, 1), ax=None, **plot_kwargs):
        """Embed ``X`` with a fitted transformer and draw two of its components.

        Parameters
        ----------
        embedding : fitted transformer
            For example :class:`~skattention.AttentionDiffusionEmbedding` (``transform`` of its
            training points reproduces ``embedding_``; new points are placed by attention) or
            :class:`~skattention.MetricAttentionTransformer`.
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,), default=None
            Labels or values used to colour the points.
        components : pair of int, default=(0, 1)
            The output columns drawn.
        ax : matplotlib Axes, default=None
        **plot_kwargs
            Passed to :meth:`plot`.

        Returns
        -------
        display : EmbeddingDisplay

        Examples
        --------
        >>> import matplotlib
        >>> matplotlib.use("Agg")  # draw off screen
        >>> import matplotlib.pyplot as plt
        >>> from sklearn.datasets import load_iris
        >>> from sklearn.decomposition import PCA
        >>> from skattention.plotting import EmbeddingDisplay
        >>> X, y = load_iris(return_X_y=True)
        >>> pca = PCA(n_components=3).fit(X)
        >>> display = EmbeddingDisplay.from_estimator(pca, X, y, components=(0, 2))
        >>> display.ax_.get_xlabel(), display.ax_.get_ylabel()
        ('PCA 1', 'PCA 3')
        >>> display.classes_
        array([0, 1, 2])
        >>> plt.close("all")
        """
        final = embedding[-1] if hasattr(embedding, "steps") else embedding
        check_is_fitted(final)
        Z = np.asarray(embedding.transform(X))
        if (np.ndim(components) != 1 or len(components) != 2
                or not all(isinstance(c, Integral) and c >= 0 for c in components)):
            raise ValueError(f"components must be a pair of non-negative column indices, got "
                             f"{components!r}.")
        i, j = components
        if Z.ndim != 2 or max(i, j) >= Z.shape[1]:
            raise ValueError(
                f"components={components} needs at least {max(i, j) + 1} output columns, "
                f"the transformer gives {Z.shape[1] if Z.ndim == 2 else 1}."
            )
        name = type(final).__name__
        display = cls(Z[:, [i, j]], y, xlabel=f"{name} {i + 1}", ylabel=f"{name} {j + 1}")
        return display.plot(ax=ax, **plot_kwargs)
