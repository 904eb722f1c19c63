"""Output shared by the subcommands: the ``--plot`` figure and the table or JSON object."""

import json
import os

from ._common import CLIError


def new_figure(args):
    """A matplotlib Figure (no pyplot, so no display is needed), after checking that ``--plot``
    can be written: its folder exists and is writable, its extension is a format matplotlib
    writes. Fails in one line before any work."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise CLIError("--plot needs matplotlib: pip install \"skattention[plot]\"") from None
    fig = Figure(figsize={"compare": (8, 4)}.get(args.command, (6, 5)))
    folder = os.path.dirname(os.path.abspath(args.plot))
    if not os.path.isdir(folder):
        raise CLIError(f"cannot write --plot {args.plot!r}: folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise CLIError(f"cannot write --plot {args.plot!r}: folder {folder!r} is not writable")
    if os.path.isdir(args.plot):
        raise CLIError(f"cannot write --plot {args.plot!r}: it is a folder")
    formats = fig.canvas.get_supported_filetypes()
    extension = os.path.splitext(args.plot)[1].lstrip(".").lower()
    if extension not in formats:
        raise CLIError(f"cannot write --plot {args.plot!r}: the extension must be one of "
                       f"{', '.join(sorted(formats))}")
    return fig


def save_figure(fig, path):
    try:
        fig.savefig(path, dpi=100, bbox_inches="tight")
    except (OSError, ValueError) as exc:
        raise CLIError(f"cannot write {path!r}: {getattr(exc, 'strerror', None) or exc}") from None


def emit(args, dataset, settings, results, lines):
    """Print the rest of the table (``lines``, after what was printed as it came) or the JSON
    object shared by the three subcommands."""
    from .. import __version__

    if args.plot:
        lines.append(f"figure written to {args.plot}")
    if args.json:
        print(json.dumps({
            "command": args.command, "version": __version__, "dataset": dataset,
            "settings": settings, "results": results, "plot": args.plot,
        }, indent=2))
    elif lines:
        print("\n".join(lines))
    return 0
