"""Sphinx configuration: MyST pages, furo theme, API and option references generated from the code (offline)."""

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS.parent), str(DOCS / "_ext")]

import robust_pretrain  # noqa: E402

project = "robust-pretrain"
author = "robust-pretrain contributors"
release = robust_pretrain.__version__
copyright = "robust-pretrain contributors, Apache-2.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "option_reference",
    "api_reference",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "api/generated/*.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
smartquotes = False  # keep "--option" and quotes as typed

autosummary_generate = True
autosummary_imported_members = False
# The API pages list each package's exports (docs/_ext/api_reference.py); re-exports are documented once.
templates_path = ["_templates"]
autodoc_default_options = {"show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = f"robust-pretrain {release}"
