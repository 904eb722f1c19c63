"""Lazy matplotlib import and axes handling shared by the displays."""


def check_matplotlib(caller):
    """Import matplotlib, or raise an ImportError that names the ``plot`` extra."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"{caller} needs matplotlib, which is not installed. Install it with "
            "`pip install matplotlib` (skattention's `plot` extra, skattention[plot]: "
            "`pip install -e \".[plot]\"` in a clone)."
        ) from exc


def get_axes(ax, caller):
    """``ax`` itself, or new axes on a new pyplot figure when ``ax`` is None."""
    check_matplotlib(caller)
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots()
    return ax
