"""Command line: ``skattention compare``, ``embed`` and ``cluster`` (``python -m skattention``).

The three subcommands read the same data (scikit-learn's digits, or a CSV read by pandas) and
print a table, or with ``--json`` one JSON object of the same shape for all three::

    {"command": ..., "version": ..., "dataset": {"name", "n_samples", "n_features"},
     "settings": {...}, "results": [{"model": ..., "time_s": ..., ...}, ...], "plot": ...}

The modules follow the work: ``_parser`` (the arguments), ``_data`` (digits or the CSV),
``_output`` (the figure, the table or JSON), one module per subcommand, and ``_common`` (the
one-line error). Torch and scikit-learn's estimators are imported only once the arguments and
the data have been checked, so that a mistake is answered at once.
"""

import sys
import warnings

from ._cluster import cluster
from ._common import CLIError, note
from ._compare import compare
from ._embed import embed
from ._output import new_figure
from ._parser import build_parser

__all__ = ["CLIError", "main"]

_COMMANDS = {"compare": compare, "embed": embed, "cluster": cluster}


def main(argv=None):
    """Entry point of the ``skattention`` console script; returns the exit status."""
    from .. import __version__

    args = build_parser(__version__).parse_args(argv)
    with warnings.catch_warnings():
        # a warning as a line of the subcommand: Python's "file:line: Category: ..." points
        # into the libraries (or at <frozen runpy>), and a source line follows it
        warnings.showwarning = lambda message, *_, **__: note(args, f"warning: {message}")
        try:
            fig = new_figure(args) if args.plot else None  # a bad --plot fails before any work
            return _COMMANDS[args.command](args, fig)
        except CLIError as exc:
            print(f"skattention: error: {exc}", file=sys.stderr)
            return 2
