"""How long each gallery example takes in the documentation build.

Reads the execution times sphinx-gallery wrote during the last ``make docs`` (run that first) and
reports them against a budget, so that the documentation build stays quick. It is a report, not
a test: wall-clock times depend on the machine and its load.

    python benchmarks/bench_gallery.py [--budget 30]
"""

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMES = ROOT / "docs" / "auto_examples" / "sg_execution_times.rst"


def gallery_times(path=TIMES):
    """``{example file name: seconds}`` from sphinx-gallery's execution-times page."""
    text = path.read_text(encoding="utf-8")
    rows = re.findall(r"``(?:\.\./examples/)?(\S+\.py)``\)\s*\n\s*- (\d+):(\d+\.\d+)", text)
    return {name: 60 * int(minutes) + float(seconds) for name, minutes, seconds in rows}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=30.0, help="seconds per example")
    args = parser.parse_args(argv)
    if not TIMES.is_file():
        sys.exit(f"{TIMES} does not exist: run `make docs` first")
    times = gallery_times()
    for name, seconds in sorted(times.items(), key=lambda item: -item[1]):
        flag = "  over budget" if seconds > args.budget else ""
        print(f"{seconds:7.1f} s  {name}{flag}")
    over = sum(seconds > args.budget for seconds in times.values())
    total = sum(times.values())
    print(f"{len(times)} examples, {total:.1f} s in all, {over} over {args.budget:g} s")


if __name__ == "__main__":
    main()
