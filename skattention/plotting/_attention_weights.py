"""Which training points one query attends to."""

import numpy as np
from sklearn.utils.validation import check_array, check_is_fitted

from ._base import get_axes


class AttentionWeightsDisplay:
    """The training points one query attends to, sized and coloured by attention weight.

    The attention analogue of drawing a query's nearest neighbours. With two features the points
    are drawn in the input space; with more, in the plane of the first two principal components
    of the training points (a :class:`~sklearn.decomposition.PCA` fitted on ``X_train``), so
    points that look close may not be close in the full space or in a learned metric: the
    weights, not the positions, are the model's. Create it with :meth:`from_estimator`.

    Parameters
    ----------
    points : ndarray of shape (n_samples, 2)
        Plotted coordinates of all training points.
    query : ndarray of shape (2,)
        Plotted coordinates of the query.
    weights : ndarray of shape (n_weights,)
        The query's largest attention weights (padding removed), largest first.
    indices : ndarray of shape (n_weights,)
        Training indices the weights fall on.
    xlabel, ylabel : str, default=None
        Axis labels.

    Attributes
    ----------
    background_ : matplotlib PathCollection
        All training points, in light grey.
    scatter_ : matplotlib PathCollection
        The attended training points, drawn from the smallest weight to the largest (so the
        largest is on top): offsets, sizes (``get_sizes``) and colours (``get_array``, the
        weights) are in that order.
    query_ : matplotlib PathCollection
        The query, a star.
    colorbar_ : matplotlib Colorbar
    ax_ : matplotlib Axes
    figure_ : matplotlib Figure

    See Also
    --------
    skattention.MetricAttentionClassifier.attention_weights : The weights drawn.

    Examples
    --------
    >>> from sklearn.datasets import load_iris
    >>> from skattention import MetricAttentionClassifier
    >>> from skattention.plotting import AttentionWeightsDisplay
    >>> X, y = load_iris(return_X_y=True)
    >>> clf = MetricAttentionClassifier("euclidean", temperature=0.5).fit(X, y)
    >>> display = AttentionWeightsDisplay.from_estimator(clf, X, X[0], n_weights=10)
    >>> display.scatter_.get_sizes().shape  # the 10 largest weights, drawn as sizes
    (10,)
    """

    def __init__(self, points, query, weights, indices, *, xlabel=None, ylabel=None):
        self.points = points
        self.query = query
        self.weights = weights
        self.indices = indices
        self.xlabel = xlabel
        self.ylabel = ylabel

    def plot(self, ax=None, *, cmap="viridis", max_size=300.0, title=None):
        """Draw the training points, the attended ones and the query.

        Parameters
        ----------
        ax : matplotlib Axes, default=None
            Axes to draw on; new ones on a new figure when None.
        cmap : str or Colormap, default="viridis"
            Colour map of the weights.
        max_size : float, default=300.0
            Marker area of the largest weight; areas are proportional to the weights.
        title : str, default=None
            Axes title; by default the number of points shown and the weight they carry.

        Returns
        -------
        display : AttentionWeightsDisplay

        Examples
        --------
        >>> import matplotlib
        >>> matplotlib.use("Agg")  # draw off screen
        >>> import matplotlib.pyplot as plt
        >>> import numpy as np
        >>> from skattention.plotting import AttentionWeightsDisplay
        >>> points = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> display = AttentionWeightsDisplay(points, query=np.array([0.2, 0.1]),
        ...                                   weights=np.array([0.7, 0.2, 0.1]),
        ...                                   indices=np.array([0, 1, 2]))
        >>> fig, ax = plt.subplots()
        >>> display = display.plot(ax=ax, max_size=100.0, title="three weights")
        >>> display.ax_ is ax
        True
        >>> display.scatter_.get_sizes().round(1)  # areas prop. to the weights, largest last
        array([ 14.3,  28.6, 100. ])
        >>> plt.close("all")
        """
        ax = get_axes(ax, "AttentionWeightsDisplay")
        weights = np.asarray(self.weights, dtype=np.float64)
        order = np.argsort(weights, kind="stable")  # smallest first: the largest drawn on top
        w, idx = weights[order], np.asarray(self.indices)[order]
        top = w.max() if w.size and w.max() > 0 else 1.0
        self.background_ = ax.scatter(self.points[:, 0], self.points[:, 1], s=8, c="lightgrey",
                                      label="training points")
        self.scatter_ = ax.scatter(
            self.points[idx, 0],
            self.points[idx, 1],
            s=max_size * w / top,
            c=w,
            cmap=cmap,
            vmin=0.0,
            vmax=top,
            edgecolors="black",
            linewidths=0.5,
            label="attended (size, colour: weight)",
        )
        self.query_ = ax.scatter([self.query[0]], [self.query[1]], s=250, marker="*", c="red",
                                 edgecolors="black", linewidths=0.8, label="query", zorder=3)
        self.colorbar_ = ax.figure.colorbar(self.scatter_, ax=ax, label="attention weight")
        if self.xlabel is not None:
            ax.set_xlabel(self.xlabel)
        if self.ylabel is not None:
            ax.set_ylabel(self.ylabel)
        if title is None:
            title = f"top {w.size} attention weights (sum {w.sum():.3f})"
        ax.set_title(title)
        ax.legend(loc="best", fontsize="small")
        self.ax_, self.figure_ = ax, ax.figure
        return self

    @classmethod
    def from_estimator(cls, estimator, X_train, query, *, n_weights=None, ax=None, **plot_kwargs):
        """Compute the weights of one query with ``estimator.attention_weights`` and draw them.

        Parameters
        ----------
        estimator : fitted estimator with an ``attention_weights(X, n_weights)`` method
            For example :class:`~skattention.MetricAttentionClassifier` or
            :class:`~skattention.MetricAttentionRegressor` (or a pipeline ending in one, with
            ``X_train`` and ``query`` given in the pipeline's input space when its steps before
            the estimator do not change the number of samples).
        X_train : array-like of shape (n_samples, n_features)
            The training points the estimator was fitted on, in the same order (the weights'
            indices refer to them).
        query : array-like of shape (n_features,) or (1, n_features)
            One query point.
        n_weights : int, default=None
            Number of largest weights drawn; the estimator's default when None.
        ax : matplotlib Axes, default=None
        **plot_kwargs
            Passed to :meth:`plot`.

        Returns
        -------
        display : AttentionWeightsDisplay

        Examples
        --------
        >>> import matplotlib
        >>> matplotlib.use("Agg")  # draw off screen
        >>> import matplotlib.pyplot as plt
        >>> from sklearn.datasets import load_iris
        >>> from skattention import MetricAttentionClassifier
        >>> from skattention.plotting import AttentionWeightsDisplay
        >>> X, y = load_iris(return_X_y=True)
        >>> clf = MetricAttentionClassifier("euclidean", temperature=0.5).fit(X, y)
        >>> display = AttentionWeightsDisplay.from_estimator(clf, X, X[60], n_weights=5)
        >>> int(display.indices[0])  # the largest weight: on the query itself, point 60
        60
        >>> display.ax_.get_xlabel()  # four features: drawn in their first two PCs
        'principal component 1'
        >>> plt.close("all")
        """
        X_train = check_array(X_train, dtype=np.float64)
        query = check_array(np.atleast_2d(query), dtype=np.float64)
        if query.shape[0] != 1:
            raise ValueError(f"query must be a single point, got {query.shape[0]} rows.")
        if query.shape[1] != X_train.shape[1]:
            raise ValueError(
                f"query has {query.shape[1]} features, X_train has {X_train.shape[1]}."
            )
        final = estimator[-1] if hasattr(estimator, "steps") else estimator
        if not hasattr(final, "attention_weights"):
            raise TypeError(f"{type(final).__name__} has no attention_weights method.")
        check_is_fitted(final)
        Xq = _with_feature_names(query, estimator)
        if hasattr(estimator, "steps"):
            Xq = estimator[:-1].transform(Xq) if len(estimator.steps) > 1 else Xq
        n_fit = getattr(final, "n_samples_fit_", X_train.shape[0])
        if n_fit != X_train.shape[0]:
            raise ValueError(
                f"X_train has {X_train.shape[0]} samples but the estimator was fitted on {n_fit}; "
                "pass the training points the estimator was fitted on."
            )
        weights, indices = final.attention_weights(Xq, n_weights=n_weights)
        weights, indices = weights[0], indices[0]
        keep = indices >= 0
        weights, indices = weights[keep], indices[keep]
        if X_train.shape[1] == 2:
            points, q, labels = X_train, query[0], ("feature 0", "feature 1")
        elif X_train.shape[1] == 1:
            points = np.c_[X_train[:, 0], np.zeros(X_train.shape[0])]
            q, labels = np.array([query[0, 0], 0.0]), ("feature 0", "")
        else:
            from sklearn.decomposition import PCA

            pca = PCA(n_components=2).fit(X_train)
            points, q = pca.transform(X_train), pca.transform(query)[0]
            labels = ("principal component 1", "principal component 2")
        display = cls(points, q, weights, indices, xlabel=labels[0], ylabel=labels[1])
        return display.plot(ax=ax, **plot_kwargs)


def _with_feature_names(query, estimator):
    """The query as a DataFrame of the names the estimator was fitted with (the checked array
    lost them, and scikit-learn warns about a nameless query), else as it is."""
    names = getattr(estimator, "feature_names_in_", None)
    if names is None or len(names) != query.shape[1]:
        return query
    try:
        import pandas as pd
    except ImportError:  # fitted on another dataframe library: its warning stays
        return query
    return pd.DataFrame(query, columns=names)
