"""Images: MM-MAE models (Auto-registered), modality-mask collator, image processor, scene generator, loaders.

Names load lazily, on first access, so importing this package stays cheap. The Auto classes find the MM-MAE classes
after ``import robust_pretrain``, in any import order: see ``robust_pretrain.vision.multimae.auto_registration``.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_LAZY = {
    "ModalitySpec": "robust_pretrain.vision.multimae.configuration_multimae",
    "MultiMAEConfig": "robust_pretrain.vision.multimae.configuration_multimae",
    "MultiMAEModel": "robust_pretrain.vision.multimae.encoder",
    "MultiMAEForPreTraining": "robust_pretrain.vision.multimae.pretraining",
    "MultiMAEForPreTrainingOutput": "robust_pretrain.vision.multimae.pretraining",
    "MultiMAEForImageClassification": "robust_pretrain.vision.multimae.heads",
    "MultiMAEForSemanticSegmentation": "robust_pretrain.vision.multimae.heads",
    "MultiMAEForDepthEstimation": "robust_pretrain.vision.multimae.heads",
    "ModalityMaskCollator": "robust_pretrain.vision.collator",
    "export_vit": "robust_pretrain.vision.multimae.export",
    "MultiMAEImageProcessor": "robust_pretrain.vision.multimae.image_processing_multimae",
    "MultiMAETransform": "robust_pretrain.vision.multimae.image_processing_multimae",
    "SceneConfig": "robust_pretrain.vision.scenes",
    "generate_scenes": "robust_pretrain.vision.scenes",
    "load_image_folder": "robust_pretrain.vision.loaders",
    "load_mapped_dataset": "robust_pretrain.vision.loaders",
    "pseudo_label": "robust_pretrain.vision.pseudo_label",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
