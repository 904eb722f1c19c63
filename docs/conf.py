"""Sphinx configuration of the skattention documentation.

Build (from the repository root, warnings as errors, executing the example gallery)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html
"""

import os
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # document the checkout being built, not another installed copy
sys.path.insert(0, str(DOCS))  # sphinxext_helpers (gallery hooks)
os.environ.setdefault("MPLBACKEND", "Agg")

import skattention  # noqa: E402

project = "skattention"
author = "skattention developers"
copyright = "skattention developers, BSD-3-Clause"
version = release = skattention.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    # MathJax served from the site itself (_static/mathjax), not from a CDN: the pages' math
    # renders without a network (the package's setup points mathjax_path there)
    "sphinx-mathjax-offline",
    "numpydoc",
    "myst_parser",
    "sphinx_gallery.gen_gallery",
    "matplotlib.sphinxext.plot_directive",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
templates_path = ["_templates"]
exclude_patterns = ["_build", "plots", "auto_examples/*.ipynb", "auto_examples/*.py", "**.zip"]
suppress_warnings = []

# -- API reference ---------------------------------------------------------------------------
autosummary_generate = True
autosummary_imported_members = False
autodoc_default_options = {"members": True, "inherited-members": False}
autodoc_typehints = "none"
numpydoc_show_class_members = False  # the class template lists the members
numpydoc_class_members_toctree = False
numpydoc_attributes_as_param_list = True
numpydoc_xref_param_type = False

# -- Markdown pages (the design notes in docs/*.md) -------------------------------------------
myst_heading_anchors = 3
myst_enable_extensions = ["dollarmath"]

# -- plots produced by code at build time (``.. plot::``, the theory page) -------------------
plot_include_source = True
plot_html_show_source_link = False
plot_html_show_formats = False
plot_formats = [("png", 100)]
plot_rcparams = {"figure.dpi": 100}
plot_basedir = str(DOCS)

# -- example gallery: examples/plot_*.py are executed, other scripts are not part of it --------
GALLERY_OUTPUT = tempfile.mkdtemp(prefix="skattention-gallery-")
os.environ["SKATTENTION_GALLERY_OUTPUT"] = GALLERY_OUTPUT
sphinx_gallery_conf = {
    "examples_dirs": "../examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    # matched against the file name: scripts that are not plot_*.py stay out of the gallery
    # (tests/test_examples.py runs them)
    "ignore_pattern": r"^(?!plot_).*\.py$",
    # an example that raises fails the build (after all examples ran, so one run reports all)
    "abort_on_example_error": False,
    "only_warn_on_example_error": False,
    # the examples take an output file name as argv[1]: write it to a scratch directory,
    # the gallery keeps the figures itself
    "reset_argv": "sphinxext_helpers.reset_argv",
    "within_subsection_order": "FileNameSortKey",
    "download_all_examples": False,
    "remove_config_comments": True,
    "doc_module": ("skattention",),
    "reference_url": {"skattention": None},
    "backreferences_dir": "generated/backreferences",
    "min_reported_time": 1,
}

# -- HTML ----------------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"skattention {release}"
html_static_path = ["_static"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "header_links_before_dropdown": 4,
}
html_show_sourcelink = False


def _skip_metadata_request_setters(app, what, name, obj, skip, options):
    """Leave out scikit-learn's generated ``set_{method}_request`` methods.

    They are made by scikit-learn for metadata routing, are the same for every estimator, and
    their docstrings refer to scikit-learn's glossary, which this site does not hold.
    """
    if name.startswith("set_") and name.endswith("_request"):
        return True
    return None


def _drop_cdn_scripts_of_the_times_table(app, docname, source):
    """Serve sphinx-gallery's computation-times table without its CDN scripts.

    sphinx-gallery writes its ``sg_execution_times`` pages with raw HTML that loads jQuery and
    DataTables (and their stylesheets) from CDNs to make the table sortable. The site reads
    offline (tests/test_docs.py checks it), so the table stays a plain one; the ``.rst`` file on
    disk, which ``benchmarks/bench_gallery.py`` reads, is left as written.
    """
    if docname.rsplit("/", 1)[-1] != "sg_execution_times":
        return
    text = source[0]
    start = text.find("  .. raw:: html")
    end = text.find("  .. list-table::", start)
    if start >= 0 and end > start:
        source[0] = text[:start] + text[end:]


def setup(app):
    app.connect("autodoc-skip-member", _skip_metadata_request_setters)
    app.connect("source-read", _drop_cdn_scripts_of_the_times_table)
