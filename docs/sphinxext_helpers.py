"""Hooks of the example gallery, referred to by name in conf.py (so the configuration pickles)."""

import os
from pathlib import Path


def reset_argv(gallery_conf, script_vars):
    """argv[1:] of an example: an output file in a scratch directory, not in examples/."""
    name = Path(script_vars["src_file"]).stem + ".png"
    return [os.path.join(os.environ.get("SKATTENTION_GALLERY_OUTPUT", "."), name)]
