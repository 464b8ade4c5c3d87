"""MM-MAE: a MultiMAE-style multi-modal masked autoencoder, its pre-training model and its fine-tuning heads.

This is the module transformers' Auto classes import (:mod:`robust_pretrain.vision.multimae.auto_registration`): it
registers the models with them. The models are defined beside it (and exported by :mod:`robust_pretrain.vision`):

- :mod:`~robust_pretrain.vision.multimae.patch_grid`: patches and their fixed sine-cosine positions;
- :mod:`~robust_pretrain.vision.multimae.modality_values`: depth normalisation and class-id checks;
- :mod:`~robust_pretrain.vision.multimae.encoder`: the encoder (:class:`MultiMAEModel`) and the base class;
- :mod:`~robust_pretrain.vision.multimae.decoder`: one decoder per modality (``DECODER_VARIANTS``);
- :mod:`~robust_pretrain.vision.multimae.pretraining`: :class:`MultiMAEForPreTraining`, one task per modality;
- :mod:`~robust_pretrain.vision.multimae.heads`: the classification, segmentation and depth fine-tuning models.
"""

from __future__ import annotations

from transformers import (
    AutoModel,
    AutoModelForDepthEstimation,
    AutoModelForImageClassification,
    AutoModelForPreTraining,
    AutoModelForSemanticSegmentation,
)

from .configuration_multimae import MultiMAEConfig
from .encoder import (
    MultiMAEModel,
)
from .heads import (
    MultiMAEForDepthEstimation,
    MultiMAEForImageClassification,
    MultiMAEForSemanticSegmentation,
)
from .pretraining import MultiMAEForPreTraining

__all__ = [
    "register_auto_classes",
]


def register_auto_classes() -> None:
    """Register the models with transformers' Auto classes (no ``trust_remote_code`` needed)."""
    for auto_class, model_class in (
        (AutoModel, MultiMAEModel),
        (AutoModelForPreTraining, MultiMAEForPreTraining),
        (AutoModelForImageClassification, MultiMAEForImageClassification),
        (AutoModelForSemanticSegmentation, MultiMAEForSemanticSegmentation),
        (AutoModelForDepthEstimation, MultiMAEForDepthEstimation),
    ):
        auto_class.register(MultiMAEConfig, model_class, exist_ok=True)


register_auto_classes()
