"""MM-MAE: a MultiMAE-style multi-modal masked autoencoder, its pre-training model and its fine-tuning heads.

This is the module transformers' Auto classes import (:mod:`robust_pretrain.vision.auto_registration`): it registers
the models with them and exports every MM-MAE modelling name. The parts live beside it:

- :mod:`~robust_pretrain.vision.patch_grid`: patches and their fixed sine-cosine positions;
- :mod:`~robust_pretrain.vision.modality_values`: depth normalisation and class-id checks;
- :mod:`~robust_pretrain.vision.multimae_encoder`: the encoder (:class:`MultiMAEModel`) and the base class;
- :mod:`~robust_pretrain.vision.multimae_decoder`: one decoder per modality (``DECODER_VARIANTS``);
- :mod:`~robust_pretrain.vision.multimae_pretraining`: :class:`MultiMAEForPreTraining`, one task per modality;
- :mod:`~robust_pretrain.vision.multimae_heads`: the classification, segmentation and depth fine-tuning models.
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
from .modality_values import check_class_ids, prepare_depth, trimmed_depth_statistics
from .multimae_decoder import MultiMAECrossAttention, MultiMAEDecoder
from .multimae_encoder import (
    MultiMAEEmbeddings,
    MultiMAEModel,
    MultiMAEModelOutput,
    MultiMAEPatchEmbedding,
    MultiMAEPreTrainedModel,
)
from .multimae_heads import (
    MultiMAEDenseModel,
    MultiMAEFineTuningModel,
    MultiMAEForDepthEstimation,
    MultiMAEForImageClassification,
    MultiMAEForSemanticSegmentation,
)
from .multimae_pretraining import MultiMAEForPreTraining, MultiMAEForPreTrainingOutput
from .patch_grid import patchify, sincos_position_embedding, unpatchify

__all__ = [  # every MM-MAE modelling name, wherever it is defined (importable from here as before the split)
    "MultiMAECrossAttention",
    "MultiMAEDecoder",
    "MultiMAEDenseModel",
    "MultiMAEEmbeddings",
    "MultiMAEFineTuningModel",
    "MultiMAEForDepthEstimation",
    "MultiMAEForImageClassification",
    "MultiMAEForPreTraining",
    "MultiMAEForPreTrainingOutput",
    "MultiMAEForSemanticSegmentation",
    "MultiMAEModel",
    "MultiMAEModelOutput",
    "MultiMAEPatchEmbedding",
    "MultiMAEPreTrainedModel",
    "check_class_ids",
    "patchify",
    "prepare_depth",
    "register_auto_classes",
    "sincos_position_embedding",
    "trimmed_depth_statistics",
    "unpatchify",
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
