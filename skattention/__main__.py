"""``python -m skattention``: the command line (see ``skattention --help``)."""

import sys

from ._cli import main

if __name__ == "__main__":
    sys.exit(main())
