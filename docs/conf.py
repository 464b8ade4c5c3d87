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

# Every cross-reference must resolve (CI builds with -W): a broken link to the package's own API is an error.
nitpicky = True
# The build is offline (no intersphinx inventories), so references to other packages' types in signatures and
# inherited docstrings cannot be linked: ignored by package prefix, never the package's own names.
_EXTERNAL = ("torch", "numpy", "pathlib", "os", "abc", r"collections\.abc")
_EXTERNAL += ("transformers", "datasets", "accelerate", "huggingface_hub", "evaluate")
nitpick_ignore_regex = [
    *((r"py:class", rf"{package}\..*") for package in _EXTERNAL),
    # field types of transformers.TrainingArguments (e.g. "dict[str, typing.Any] | str | None") split at the comma
    (r"py:class", r"dict\[str"),
    # string annotations of names imported only under TYPE_CHECKING from other packages, seen by their short name
    (r"py:class", r"(Dataset|Trainer|TrainingArguments|ModelCard|Figure)"),
    # torch.nn.Module.forward's docstring, inherited by the MM-MAE models' forward, links its own :class:`Module`
    (r"py:class", r"Module"),
]
# The package's own types that signatures and class bases name but the reference (package exports only) does not
# document: internal helpers, listed one by one so that any other unresolved own name still fails the build.
nitpick_ignore = [
    ("py:class", name)
    for name in (
        "DrawSlots",
        "TaskSamplingSchedule",
        "robust_pretrain.data.taggers.Tagger",
        "robust_pretrain.trainer.task_sampling.TaskSamplingSchedule",
        "robust_pretrain.reference.Provenance",
        "robust_pretrain.vision.multimae.encoder.MultiMAEModelOutput",
        "robust_pretrain.vision.multimae.encoder.MultiMAEPreTrainedModel",
        "robust_pretrain.vision.multimae.heads.MultiMAEDenseModel",
        "robust_pretrain.vision.multimae.heads.MultiMAEFineTuningModel",
        "robust_pretrain.vision.multimae.image_processing_multimae.MultiMAEImageProcessorKwargs",
    )
]
