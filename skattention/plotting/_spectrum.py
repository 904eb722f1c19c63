"""The spectrum of ``I - S``: one near-zero eigenvalue per cluster."""

import numpy as np
from sklearn.utils.validation import check_is_fitted

from ._base import get_axes


class DiffusionSpectrumDisplay:
    """Smallest eigenvalues of ``I - S`` (``S`` the attention operator), near-zero ones highlighted.

    Repeated attention collapses the data into clusters, one per (near-)zero eigenvalue of
    ``I - S`` (see :func:`~skattention.manifold.spectral_cluster_count`). The eigenvalues below
    ``threshold`` are drawn in red, the others in blue, the threshold as a dashed line, and the
    count is given in the title. The y axis is symmetric-logarithmic (linear below
    ``threshold / 10``) so that the gap shows. Create it with :meth:`from_data` or
    :meth:`from_estimator`.

    Parameters
    ----------
    eigenvalues : array-like of shape (n_eigenvalues,)
        Eigenvalues of ``I - S``, ascending.
    threshold : float
        Eigenvalues below it count as zero.

    Attributes
    ----------
    n_clusters_ : int
        Number of eigenvalues below ``threshold``.
    near_zero_ : matplotlib PathCollection
        The highlighted eigenvalues (x: their ranks 1, 2, ...).
    rest_ : matplotlib PathCollection
        The others.
    threshold_line_ : matplotlib Line2D
    ax_ : matplotlib Axes
    figure_ : matplotlib Figure

    Examples
    --------
    >>> import numpy as np
    >>> from skattention.plotting import DiffusionSpectrumDisplay
    >>> rng = np.random.default_rng(0)
    >>> X = np.vstack([rng.normal(0, 0.1, (50, 2)), rng.normal(3, 0.1, (50, 2))])
    >>> display = DiffusionSpectrumDisplay.from_data(X, random_state=0)
    >>> display.n_clusters_  # two well separated blobs: two near-zero eigenvalues
    2
    """

    def __init__(self, eigenvalues, threshold):
        self.eigenvalues = eigenvalues
        self.threshold = threshold

    def plot(self, ax=None, *, yscale="symlog", title=None):
        """Draw the eigenvalues against their rank.

        Parameters
        ----------
        ax : matplotlib Axes, default=None
            Axes to draw on; new ones on a new figure when None.
        yscale : {"symlog", "linear"}, default="symlog"
            Scale of the eigenvalue axis.
        title : str, default=None
            Axes title; by default the cluster count.

        Returns
        -------
        display : DiffusionSpectrumDisplay

        Examples
        --------
        >>> import matplotlib
        >>> matplotlib.use("Agg")  # draw off screen
        >>> import matplotlib.pyplot as plt
        >>> from skattention.plotting import DiffusionSpectrumDisplay
        >>> display = DiffusionSpectrumDisplay([0.0, 2e-5, 0.3, 0.5], threshold=1e-3)
        >>> display = display.plot(yscale="linear")
        >>> display.n_clusters_
        2
        >>> display.ax_.get_title()
        '2 near-zero eigenvalues of I - S: 2 clusters'
        >>> plt.close("all")
        """
        ax = get_axes(ax, "DiffusionSpectrumDisplay")
        ev = np.asarray(self.eigenvalues, dtype=np.float64)
        rank = np.arange(1, ev.size + 1)
        low = ev < self.threshold
        self.n_clusters_ = int(low.sum())
        self.rest_ = ax.scatter(rank[~low], ev[~low], c="C0", s=30, label="eigenvalues")
        self.near_zero_ = ax.scatter(rank[low], ev[low], c="C3", s=50, marker="D",
                                     label=f"below {self.threshold:g} (clusters)")
        self.threshold_line_ = ax.axhline(
            self.threshold, color="grey", linestyle="--", label="threshold"
        )
        if yscale == "symlog":
            ax.set_yscale("symlog", linthresh=self.threshold / 10)
            # round-off below 0: no negative decades
            if ev.size and ev.min() >= -self.threshold / 10:
                ax.set_ylim(bottom=-self.threshold / 100)
        elif yscale != "linear":
            raise ValueError(f"yscale must be 'symlog' or 'linear', got {yscale!r}.")
        ax.set_xlabel("rank")
        ax.set_ylabel("eigenvalue of I - S")
        ax.legend(loc="best", fontsize="small")
        if title is None:
            plural = "s" if self.n_clusters_ != 1 else ""
            title = (
                f"{self.n_clusters_} near-zero eigenvalue{plural} of I - S: "
                f"{self.n_clusters_} cluster{plural}"
            )
            if self.n_clusters_ == ev.size:
                title += " (or more)"
        ax.set_title(title)
        self.ax_, self.figure_ = ax, ax.figure
        return self

    @classmethod
    def from_data(
        cls,
        X,
        *,
        epsilon="auto",
        n_neighbors=None,
        alpha=0.0,
        threshold=1e-3,
        max_clusters=20,
        device="auto",
        random_state=None,
        ax=None,
        **plot_kwargs,
    ):
        """Compute the spectrum with ``spectral_cluster_count(X, ..., return_eigenvalues=True)``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        epsilon, n_neighbors, alpha, threshold, max_clusters, device, random_state
            As in :func:`~skattention.manifold.spectral_cluster_count`.
        ax : matplotlib Axes, default=None
        **plot_kwargs
            Passed to :meth:`plot`.

        Returns
        -------
        display : DiffusionSpectrumDisplay

        Examples
        --------
        >>> import matplotlib
        >>> matplotlib.use("Agg")  # draw off screen
        >>> import matplotlib.pyplot as plt
        >>> from sklearn.datasets import make_blobs
        >>> from skattention.plotting import DiffusionSpectrumDisplay
        >>> X, _ = make_blobs(60, centers=[[0, 0], [5, 0], [0, 5]], cluster_std=0.3,
        ...                   random_state=0)
        >>> display = DiffusionSpectrumDisplay.from_data(X, n_neighbors=10, random_state=0)
        >>> display.n_clusters_  # three blobs
        3
        >>> plt.close("all")
        """
        from ..manifold import spectral_cluster_count

        _, eigenvalues = spectral_cluster_count(
            X,
            epsilon=epsilon,
            n_neighbors=n_neighbors,
            alpha=alpha,
            threshold=threshold,
            max_clusters=max_clusters,
            return_eigenvalues=True,
            device=device,
            random_state=random_state,
        )
        return cls(eigenvalues, threshold).plot(ax=ax, **plot_kwargs)

    @classmethod
    def from_estimator(cls, embedding, *, threshold=1e-3, ax=None, **plot_kwargs):
        """Draw the spectrum of a fitted :class:`~skattention.AttentionDiffusionEmbedding`.

        The eigenvalues are ``1 - eigenvalues_`` preceded by the trivial ``0`` (the constant
        eigenvector the embedding drops), so only ``n_components + 1`` of them are known: fit
        with a larger ``n_components`` to see more, or use :meth:`from_data`.

        Parameters
        ----------
        embedding : fitted AttentionDiffusionEmbedding
        threshold : float, default=1e-3
            Eigenvalues below it count as zero.
        ax : matplotlib Axes, default=None
        **plot_kwargs
            Passed to :meth:`plot`.

        Returns
        -------
        display : DiffusionSpectrumDisplay

        Examples
        --------
        >>> import matplotlib
        >>> matplotlib.use("Agg")  # draw off screen
        >>> import matplotlib.pyplot as plt
        >>> from sklearn.datasets import make_blobs
        >>> from skattention import AttentionDiffusionEmbedding
        >>> from skattention.plotting import DiffusionSpectrumDisplay
        >>> X, _ = make_blobs(60, centers=[[0, 0], [5, 0], [0, 5]], cluster_std=0.3,
        ...                   random_state=0)
        >>> embedding = AttentionDiffusionEmbedding(n_components=4, random_state=0).fit(X)
        >>> display = DiffusionSpectrumDisplay.from_estimator(embedding)
        >>> display.n_clusters_, len(display.eigenvalues)  # n_components + 1 eigenvalues known
        (3, 5)
        >>> plt.close("all")
        """
        from ..manifold import AttentionDiffusionEmbedding

        if not isinstance(embedding, AttentionDiffusionEmbedding):  # (was "not fitted")
            raise TypeError(f"DiffusionSpectrumDisplay.from_estimator takes a fitted "
                            f"AttentionDiffusionEmbedding, got {type(embedding).__name__}.")
        check_is_fitted(embedding, "eigenvalues_")
        eigenvalues = np.sort(
            np.r_[0.0, 1.0 - np.asarray(embedding.eigenvalues_, dtype=np.float64)]
        )
        return cls(eigenvalues, threshold).plot(ax=ax, **plot_kwargs)
