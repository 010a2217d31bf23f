"""Sphinx configuration of amopt's documentation.

Build (from the repository root, offline, warnings as errors, gallery executed)::

    pip install -e ".[docs]"
    python -m sphinx -W --keep-going -b html docs docs/_build/html

Nothing is fetched while building or reading the site: MathJax is copied from the
``jupyter-server-mathjax`` package into ``_static/mathjax``, the theme's fonts are its
own files, intersphinx is off.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # the checkout's amopt, also when an older one is installed

os.environ.setdefault("MPLBACKEND", "Agg")

from sphinx_gallery.sorting import FunctionSortKey  # noqa: E402

import amopt  # noqa: E402

sys.path.insert(0, str(HERE / "_ext"))
from gallery_order import gallery_key  # noqa: E402
from minimize_methods import write_pages  # noqa: E402

write_pages(HERE / "api" / "minimize")  # one page per minimize method (generated)

project = "amopt"
author = "amopt developers"
copyright = "amopt developers"  # noqa: A001
release = amopt.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
    "myst_parser",
    "sphinx_copybutton",
    "sphinx_design",
    "sphinx_gallery.gen_gallery",
    "matplotlib.sphinxext.plot_directive",
    "bench_table",  # docs/_ext: the performance tables, rendered from the bench's JSON
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "**.ipynb_checkpoints", "auto_examples/*.md5"]
templates_path = ["_templates"]

# -- MyST ----------------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# -- math, served from the site --------------------------------------------------------
_MATHJAX = importlib.util.find_spec("jupyter_server_mathjax")
if _MATHJAX is None or not _MATHJAX.submodule_search_locations:
    raise RuntimeError(
        'the docs serve MathJax from the jupyter-server-mathjax package: pip install -e ".[docs]"'
    )
MATHJAX_DIR = Path(_MATHJAX.submodule_search_locations[0]) / "static"
mathjax_path = "mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"  # the config it ships
mathjax2_config = {
    # MyST marks its pages' sections tex2jax_ignore and wraps math in class "math" (it
    # updates only a MathJax 3 configuration to match): process those elements here too
    "tex2jax": {
        "inlineMath": [["\\(", "\\)"]],
        "displayMath": [["\\[", "\\]"]],
        "processClass": "tex2jax_process|mathjax_process|math|output_area",
        "ignoreClass": "tex2jax_ignore|mathjax_ignore",
    },
    # the package ships the STIX-Web fonts only (as Jupyter configures them)
    "HTML-CSS": {
        "availableFonts": ["STIX-Web"],
        "preferredFont": "STIX-Web",
        "webFont": "STIX-Web",
        "imageFont": None,
        # MathJax's probe font points at about:blank, which Chromium refuses as a failed
        # cross-origin request; a local() name that no system has fails the same way
        # for the probe, with no request
        "styles": {
            "@font-face": {"font-family": "MathJax_Blank", "src": "local('MathJax_Blank_0')"}
        },
    },
    "SVG": {"font": "STIX-Web"},
    "messageStyle": "none",
}


def _copy_mathjax(app, exception) -> None:
    if exception is None and app.builder.format == "html":
        shutil.copytree(MATHJAX_DIR, Path(app.outdir) / "_static" / "mathjax", dirs_exist_ok=True)


# -- autodoc / autosummary / numpydoc -------------------------------------------------
autosummary_generate = True
autosummary_imported_members = True
autodoc_typehints = "none"
autodoc_default_options = {"members": False}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
# Validation of every public docstring during the build (a failure is a warning, and
# the build runs with -W): the checks every public name passes today.
numpydoc_validation_checks = {
    "GL06",  # unknown section
    "GL07",  # sections in the wrong order
    "GL09",  # deprecation warning placement
    "GL10",  # backticks
    "SS02",  # summary starts with a capital letter
    "SS03",  # summary ends with a period
    "PR06",  # parameter types spelled out (not "integer", "boolean")
    "YD01",  # generators document Yields
}
# module constants carry their type's docstring (str, dict), not one of amopt's
numpydoc_validation_exclude = {
    r"\.__init__$",
    r"\._",
    r"\.(LIBSVM_URL|LABEL_CONVENTIONS|METHODS|STATUS_MESSAGES)$",
}

# -- gallery ----------------------------------------------------------------------------
sphinx_gallery_conf = {
    "examples_dirs": [str(ROOT / "examples" / "gallery")],
    "gallery_dirs": ["auto_examples"],
    "filename_pattern": r"/plot_",
    "download_all_examples": False,
    "remove_config_comments": True,
    "matplotlib_animations": False,
    "within_subsection_order": FunctionSortKey(gallery_key, r="gallery order"),
    "show_memory": False,
    "min_reported_time": 1,
    "abort_on_example_error": True,
}

# -- plot directive (figures in the user guide) ----------------------------------------
plot_include_source = False
plot_html_show_source_link = False
plot_html_show_formats = False
plot_formats = [("png", 110)]

# -- HTML ---------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"amopt {release}"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
# without an icon link a browser asks the server for /favicon.ico and logs a 404
html_favicon = "_static/favicon.png"
html_theme_options = {
    "navbar_align": "left",
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "header_links_before_dropdown": 7,
    # an API page is one object: its width goes to the signature and the math box
    "secondary_sidebar_items": {"api/generated/*": []},
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_sidebars = {"index": [], "getting-started": [], "performance": []}
html_show_sourcelink = False
# an empty default mode makes the theme log a console error on every page
html_context = {"default_mode": "light"}
html_copy_source = False

# intersphinx is not loaded: the build and the site stay offline.

suppress_warnings = [
    # docs/results/*/summary.md are written by `python -m amopt.experiments report`, whose
    # pages start at "##"; their titles come from the toctree of results.md
    "myst.header",
]

#: Pages of the user guide that are written with other changes: their toctree entries are
#: dropped (with a note in the log) while the page is not there, so the build stays free of
#: warnings in between; once the page exists it is in the toctree as any other.
OPTIONAL_PAGES = ("choosing-a-method", "caching")


def _drop_missing_optional_pages(app, docname, source) -> None:
    if docname != "user-guide/index":
        return
    kept = []
    for line in source[0].splitlines(keepends=True):
        page = line.strip().removeprefix("../")
        if page in OPTIONAL_PAGES and not (HERE / f"{page}.md").exists():
            print(f"amopt docs: {page}.md is not there yet; left out of the user guide")
            continue
        kept.append(line)
    source[0] = "".join(kept)


def setup(app):
    app.connect("build-finished", _copy_mathjax)
    app.connect("source-read", _drop_missing_optional_pages)
