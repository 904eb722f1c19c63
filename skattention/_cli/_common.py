"""What every subcommand shares: the one-line error and the progress lines on standard error.

Standard library only at import: the modules of the command line check the user's arguments
and data before anything imports torch or scikit-learn, so that a mistake is answered at once.
"""

import sys


class CLIError(Exception):
    """A problem with the user's input: reported in one line, without a traceback."""


def check_device(args):
    """The user's ``--device`` checked on this machine once the data is read (torch imported
    here): an unavailable one is the one-line error before any table or work."""
    if args.device in ("auto", "cpu"):
        return
    from .._engine import resolve_device

    try:
        resolve_device(args.device)
    except ValueError as exc:
        raise CLIError(str(exc)) from None


def progress(args, message):
    """A progress line on standard error with ``--verbose``."""
    if args.verbose:
        note(args, message)


def note(args, message):
    """A line on standard error whatever ``--verbose`` says (hints that change what to type)."""
    print(prefixed(args, message), file=sys.stderr, flush=True)


def prefixed(args, message):
    """``message`` as a line of the subcommand on standard error."""
    return f"skattention {args.command}: {message}"


def describe(dataset):
    """``name, n_samples x n_features`` for the first line of a table and for plot titles."""
    return f"{dataset['name']}, {dataset['n_samples']} x {dataset['n_features']}"
