"""Training loss and validation curves per epoch."""

import numpy as np
from sklearn.base import is_regressor
from sklearn.utils.validation import check_is_fitted

from ._base import get_axes


class TrainingCurveDisplay:
    """Training loss, validation loss and validation score per epoch of a learned metric.

    Losses are drawn on the left axis and the validation score (accuracy or R^2) on a twin axis
    on the right; a dotted vertical line marks the epoch of lowest validation loss, the one
    restored with ``early_stopping=True``. Create it with :meth:`from_estimator`.

    Parameters
    ----------
    loss_curve : sequence of float
        Training loss per epoch.
    validation_loss_curve : sequence of float, default=None
        Validation loss per epoch.
    validation_scores : sequence of float, default=None
        Validation score per epoch.
    score_name : str, default="validation score"
        Label of the score axis.
    estimator_name : str, default=None
        Shown in the title.

    Attributes
    ----------
    loss_line_ : matplotlib Line2D
        Training loss (x: epochs 1, 2, ...; y: ``loss_curve``).
    validation_loss_line_ : matplotlib Line2D or None
    validation_score_line_ : matplotlib Line2D or None
        On ``ax_score_``.
    best_epoch_line_ : matplotlib Line2D or None
        At the epoch of lowest validation loss.
    ax_ : matplotlib Axes
        Axes of the losses.
    ax_score_ : matplotlib Axes or None
        Twin axes of the validation score.
    figure_ : matplotlib Figure

    Examples
    --------
    >>> from sklearn.datasets import load_iris
    >>> from skattention import MetricAttentionClassifier
    >>> from skattention.plotting import TrainingCurveDisplay
    >>> X, y = load_iris(return_X_y=True)
    >>> clf = MetricAttentionClassifier("linear", max_iter=50, tol=1e-2, n_iter_no_change=3,
    ...                                 random_state=0).fit(X, y)
    >>> display = TrainingCurveDisplay.from_estimator(clf)
    >>> len(display.loss_line_.get_xdata()) == clf.n_iter_
    True
    """

    def __init__(self, loss_curve, validation_loss_curve=None, validation_scores=None, *,
                 score_name="validation score", estimator_name=None):
        self.loss_curve = loss_curve
        self.validation_loss_curve = validation_loss_curve
        self.validation_scores = validation_scores
        self.score_name = score_name
        self.estimator_name = estimator_name

    def plot(self, ax=None, *, title=None):
        """Draw the curves.

        Parameters
        ----------
        ax : matplotlib Axes, default=None
            Axes of the losses; new ones on a new figure when None.
        title : str, default=None
            Axes title; by default the estimator's name and the number of epochs.

        Returns
        -------
        display : TrainingCurveDisplay

        Examples
        --------
        >>> import matplotlib
        >>> matplotlib.use("Agg")  # draw off screen
        >>> import matplotlib.pyplot as plt
        >>> from skattention.plotting import TrainingCurveDisplay
        >>> display = TrainingCurveDisplay([0.9, 0.5, 0.4], validation_loss_curve=[1.0, 0.7, 0.8],
        ...                                validation_scores=[0.6, 0.8, 0.7])
        >>> display = display.plot(title="three epochs")
        >>> display.best_epoch_line_.get_label()
        'lowest validation loss (epoch 2)'
        >>> plt.close("all")
        """
        ax = get_axes(ax, "TrainingCurveDisplay")
        loss = np.asarray(self.loss_curve, dtype=np.float64)
        epochs = np.arange(1, loss.size + 1)
        (self.loss_line_,) = ax.plot(
            epochs, loss, marker="o", markersize=3, color="C0", label="training loss"
        )
        self.validation_loss_line_ = self.validation_score_line_ = self.best_epoch_line_ = None
        self.ax_score_ = None
        handles = [self.loss_line_]
        if self.validation_loss_curve is not None:
            vloss = np.asarray(self.validation_loss_curve, dtype=np.float64)
            (self.validation_loss_line_,) = ax.plot(
                np.arange(1, vloss.size + 1),
                vloss,
                marker="o",
                markersize=3,
                color="C1",
                label="validation loss",
            )
            handles.append(self.validation_loss_line_)
            if vloss.size:
                best = int(np.argmin(vloss)) + 1
                self.best_epoch_line_ = ax.axvline(best, color="grey", linestyle=":",
                                                   label=f"lowest validation loss (epoch {best})")
                handles.append(self.best_epoch_line_)
        ax.set_xlabel("epoch")
        ax.set_ylabel("loss")
        if self.validation_scores is not None:
            score = np.asarray(self.validation_scores, dtype=np.float64)
            self.ax_score_ = ax.twinx()
            (self.validation_score_line_,) = self.ax_score_.plot(
                np.arange(1, score.size + 1),
                score,
                marker="s",
                markersize=3,
                color="C2",
                label=self.score_name,
            )
            self.ax_score_.set_ylabel(self.score_name)
            handles.append(self.validation_score_line_)
        ax.legend(handles=handles, loc="best", fontsize="small")
        if title is None:
            title = f"{self.estimator_name + ': ' if self.estimator_name else ''}{loss.size} epochs"
        ax.set_title(title)
        self.ax_, self.figure_ = ax, ax.figure
        return self

    @classmethod
    def from_estimator(cls, estimator, *, ax=None, **plot_kwargs):
        """Draw the curves recorded by a fitted estimator.

        Parameters
        ----------
        estimator : fitted estimator with ``loss_curve_``
            A metric-attention estimator with a learned metric (``validation_loss_curve_`` and
            ``validation_scores_`` are drawn when ``early_stopping=True`` recorded them), an
            :class:`~skattention.AttentionNetworkClassifier`, or a pipeline ending in one.
        ax : matplotlib Axes, default=None
        **plot_kwargs
            Passed to :meth:`plot`.

        Returns
        -------
        display : TrainingCurveDisplay

        Examples
        --------
        >>> import matplotlib
        >>> matplotlib.use("Agg")  # draw off screen
        >>> import matplotlib.pyplot as plt
        >>> from sklearn.datasets import load_iris
        >>> from skattention import MetricAttentionClassifier
        >>> from skattention.plotting import TrainingCurveDisplay
        >>> X, y = load_iris(return_X_y=True)
        >>> clf = MetricAttentionClassifier("linear", early_stopping=True, max_iter=100, tol=1e-3,
        ...                                 random_state=0).fit(X, y)
        >>> fig, ax = plt.subplots()
        >>> display = TrainingCurveDisplay.from_estimator(clf, ax=ax)
        >>> display.validation_loss_line_ is not None  # early stopping recorded it
        True
        >>> display.ax_score_.get_ylabel()  # on the twin axis at the right
        'validation accuracy'
        >>> plt.close("all")
        """
        final = estimator[-1] if hasattr(estimator, "steps") else estimator
        check_is_fitted(final)
        loss = getattr(final, "loss_curve_", None)
        if loss is None:
            raise TypeError(f"{type(final).__name__} has no training curve (loss_curve_): "
                            "pass a fitted MetricAttention* or AttentionNetworkClassifier.")
        if len(loss) == 0:
            raise ValueError(
                f"{type(final).__name__} recorded no training curve (loss_curve_ is empty): "
                "a fixed metric (metric='euclidean') learns nothing."
            )
        score_name = "validation R^2" if is_regressor(final) else "validation accuracy"
        display = cls(
            loss,
            getattr(final, "validation_loss_curve_", None),
            getattr(final, "validation_scores_", None),
            score_name=score_name,
            estimator_name=type(final).__name__,
        )
        return display.plot(ax=ax, **plot_kwargs)
