"""Configuration of the multi-modal masked autoencoder (MM-MAE): its modalities and its encoder, decoders and heads.

A modality is configuration, not code: a :class:`ModalitySpec` names it (the batch key and the task name), says what
it is (``rgb`` image, metric ``depth`` map or ``semseg`` class-id map) and which reconstruction loss it uses.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from huggingface_hub.dataclasses import strict
from transformers import AutoConfig, PretrainedConfig

MODALITY_KINDS = ("rgb", "depth", "semseg")
MODALITY_LOSSES = ("mse", "l1", "cross_entropy")
DEPTH_NORMALIZATIONS = ("none", "standardize", "standardize_trimmed")
DEPTH_TRIM = 0.1  # standardize_trimmed: the share of an image's valid depth values left out at each end (MultiMAE's)
DEPTH_VARIANCE_EPS = 1e-6  # standardize_trimmed: added to the variance (MultiMAE's), in the depth unit squared
DECODER_TYPES = ("cross_attention", "joint")
SEMSEG_HEADS = ("dpt", "convnext")
DEPTH_LOSSES = ("l1", "berhu")
# The cross-attention decoder's four switches: this project's variant (the config defaults, what checkpoints without
# the keys were trained with) and MultiMAE's (its SpatialOutputAdapter with decoder_use_task_queries).
DECODER_VARIANTS = {
    "project": dict(
        decoder_use_task_queries=False,
        decoder_cross_attention_residual=True,
        decoder_final_norm=True,
        decoder_reads_encoder_norm=True,
    ),
    "multimae": dict(
        decoder_use_task_queries=True,
        decoder_cross_attention_residual=False,
        decoder_final_norm=False,
        decoder_reads_encoder_norm=False,
    ),
}
_KIND_DEFAULTS = {"rgb": (3, "mse"), "depth": (1, "l1"), "semseg": (1, "cross_entropy")}


@dataclass
class ModalitySpec:
    """One input modality and its reconstruction task.

    ``channels`` and ``loss`` default by ``kind``: rgb 3 channels + ``mse``, depth 1 channel + ``l1`` (metres, 0 =
    invalid pixel), semseg a class-id map + ``cross_entropy`` (needs ``num_classes``; ``ignore_index`` marks unknown
    pixels). ``norm_pix_loss``: an rgb modality with ``mse`` regresses per-patch normalised pixels (MAE).

    Depth only: ``max_depth`` (in the map's unit, metres from the image processor) marks farther pixels invalid, like
    the NYUv2 metric's cap (Kinect frames carry 65.535 m "valid" pixels); ``None`` keeps every positive pixel.
    ``depth_normalization="standardize"`` (MultiMAE's ``standardize_depth``) feeds and reconstructs each image's
    depth standardised by the mean and standard deviation of its valid pixels (invalid pixels become 0, the mean), so
    the depth loss and everything the encoder sees do not depend on the depth unit; ``"standardize_trimmed"`` is
    MultiMAE's exact robust variant: the mean and the (unbiased) variance come from the valid values of ranks
    ``floor(0.1 n)`` to ``floor(0.9 n) - 1`` of the ``n`` sorted ones (the top and bottom 10 % trimmed) and the
    values are ``(depth - mean) / sqrt(variance + 1e-6)``; ``"none"`` uses the raw values.
    """

    name: str
    kind: str
    channels: int | None = None
    num_classes: int | None = None
    loss: str | None = None
    ignore_index: int = 255
    norm_pix_loss: bool = True
    depth_normalization: str = "none"
    max_depth: float | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.name.isidentifier():
            raise ValueError(f"modalities: name {self.name!r} must be a non-empty identifier (it is a batch key)")
        if self.kind not in MODALITY_KINDS:
            raise ValueError(f"modalities[{self.name}]: kind {self.kind!r} is not one of {MODALITY_KINDS}")
        default_channels, default_loss = _KIND_DEFAULTS[self.kind]
        self.channels = default_channels if self.channels is None else self.channels
        self.loss = default_loss if self.loss is None else self.loss
        if self.loss not in MODALITY_LOSSES:
            raise ValueError(f"modalities[{self.name}]: loss {self.loss!r} is not one of {MODALITY_LOSSES}")
        if self.kind == "semseg":
            if self.channels != 1:
                raise ValueError(f"modalities[{self.name}]: a semseg modality is one map of class ids (channels 1)")
            if self.num_classes is None or self.num_classes < 1:
                raise ValueError(f"modalities[{self.name}]: a semseg modality needs num_classes >= 1")
            if self.loss != "cross_entropy":
                raise ValueError(f"modalities[{self.name}]: a semseg modality uses loss 'cross_entropy'")
            if 0 <= self.ignore_index < self.num_classes:
                raise ValueError(
                    f"modalities[{self.name}]: ignore_index {self.ignore_index} is a class id (< {self.num_classes})"
                )
        elif self.loss == "cross_entropy":
            raise ValueError(f"modalities[{self.name}]: cross_entropy needs kind 'semseg', got {self.kind!r}")
        if self.channels < 1:
            raise ValueError(f"modalities[{self.name}]: channels must be >= 1, got {self.channels}")
        if self.depth_normalization not in DEPTH_NORMALIZATIONS:
            raise ValueError(
                f"modalities[{self.name}]: depth_normalization {self.depth_normalization!r} is not one of "
                f"{DEPTH_NORMALIZATIONS}"
            )
        if self.kind != "depth" and (self.depth_normalization != "none" or self.max_depth is not None):
            raise ValueError(f"modalities[{self.name}]: depth_normalization and max_depth apply to kind 'depth'")
        if self.max_depth is not None and not self.max_depth > 0:
            raise ValueError(f"modalities[{self.name}]: max_depth must be > 0, got {self.max_depth}")

    @property
    def output_channels(self) -> int:
        """Channels of the decoder's prediction (class logits for semseg, the image channels otherwise)."""
        return self.num_classes if self.kind == "semseg" else self.channels


def default_modalities(num_semseg_classes: int = 40) -> list[ModalitySpec]:
    """RGB, depth and semantic segmentation (NYUv2-40 class count by default)."""
    return [
        ModalitySpec("rgb", "rgb"),
        ModalitySpec("depth", "depth"),
        ModalitySpec("semseg", "semseg", num_classes=num_semseg_classes),
    ]


@strict(accept_kwargs=True)
class MultiMAEConfig(PretrainedConfig):
    r"""Configuration of :class:`MultiMAEModel` and its pre-training / fine-tuning heads.

    Encoder: a ViT (``hidden_size``, ``num_hidden_layers``, ... as in ``ViTConfig``) over the visible patches of all
    modalities plus ``num_global_tokens`` learned global tokens, with fixed 2D sine-cosine position embeddings.
    Decoders (pre-training, one per modality): ``decoder_*`` sizes; ``decoder_type`` ``"cross_attention"``
    (MultiMAE's: the queries cross-attend to the encoded tokens, then ``decoder_num_hidden_layers`` self-attention
    layers over the queries) or ``"joint"`` (self-attention layers over the encoded tokens and the queries together;
    what a saved config without the key was trained with). Four switches of the cross-attention decoder (defaults:
    this project's variant; ``DECODER_VARIANTS`` ``"multimae"`` sets all four to reproduce MultiMAE's decoder):
    ``decoder_use_task_queries`` (a visible patch's query is its own encoded token, as the context sees it, in place
    of the mask token: MultiMAE's ``decoder_use_task_queries``), ``decoder_cross_attention_residual`` (add the
    queries back after the cross-attention; MultiMAE does not), ``decoder_final_norm`` (a LayerNorm before the
    prediction; MultiMAE has none) and ``decoder_reads_encoder_norm`` (the decoders read the encoder's final
    LayerNorm; MultiMAE's read its last layer's output, it has no final norm). Fine-tuning heads:
    ``finetune_modalities`` are the inputs (``["rgb"]`` as in the paper; add ``"depth"`` to feed it too); the dense
    heads are DPT reassemble-and-fuse heads over four encoder layers ``head_layer_indices`` with ``neck_hidden_sizes``
    / ``fusion_hidden_size`` channels; ``semseg_head="convnext"`` gives semantic segmentation MultiMAE's ConvNeXt
    head instead (``robust_pretrain.vision.multimae.convnext_head.ConvNeXtSegmentationHead`` over the encoder's
    last layer,
    ``convnext_head_dim`` / ``convnext_preds_per_patch`` / ``convnext_num_blocks``: MultiMAE's 6144 / 16 / 4), and
    ``depth_loss="berhu"`` depth estimation MultiMAE's berHu loss instead of L1
    (``robust_pretrain.vision.multimae.losses``).

    Args:
        modalities: list of :class:`ModalitySpec` (or their dicts); default rgb, depth, semseg (40 classes).
        image_size: ``int`` or ``[height, width]``; the size export and the pre-training data use. The encoder accepts
            any size that is a multiple of ``patch_size`` (position embeddings are computed, not learned).
        class_embed_dim: width of the semseg class embedding applied before patchifying.
    """

    model_type = "multimae"
    # What Trainer.evaluate/predict skip: per-task scalars and counts (the MinimaxTrainer reports task losses itself)
    # and hidden states; the reconstructions (``predictions``) are the pre-training model's "logits".
    keys_to_ignore_at_inference: ClassVar[list[str]] = ["task_losses", "task_counts", "hidden_states"]

    modalities: list | None = None
    image_size: int | list[int] | tuple[int, int] = 224
    patch_size: int = 16
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float | int = 0.0
    attention_probs_dropout_prob: float | int = 0.0
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-6
    qkv_bias: bool = True
    num_global_tokens: int = 1
    class_embed_dim: int = 64
    decoder_hidden_size: int = 256
    decoder_num_hidden_layers: int = 2
    decoder_num_attention_heads: int = 8
    decoder_intermediate_size: int = 1024
    decoder_type: str = "cross_attention"
    decoder_use_task_queries: bool = False
    decoder_cross_attention_residual: bool = True
    decoder_final_norm: bool = True
    decoder_reads_encoder_norm: bool = True
    finetune_modalities: list[str] | None = None
    head_layer_indices: list[int] | None = None
    neck_hidden_sizes: list[int] | None = None
    fusion_hidden_size: int = 256
    semantic_loss_ignore_index: int = 255
    semseg_head: str = "dpt"
    convnext_head_dim: int = 6144
    convnext_preds_per_patch: int = 16
    convnext_num_blocks: int = 4
    depth_loss: str = "l1"
    semantic_classifier_dropout: float | int = 0.1

    def __post_init__(self, **kwargs: Any) -> None:
        specs = default_modalities() if self.modalities is None else self.modalities
        self.modalities = [spec if isinstance(spec, ModalitySpec) else ModalitySpec(**spec) for spec in specs]
        names = [spec.name for spec in self.modalities]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"modalities: need at least one, with unique names; got {names}")
        if self.finetune_modalities is None:
            self.finetune_modalities = [next((s.name for s in self.modalities if s.kind == "rgb"), names[0])]
        unknown = [name for name in self.finetune_modalities if name not in names]
        if unknown or not self.finetune_modalities:
            raise ValueError(f"finetune_modalities: {self.finetune_modalities} must be a non-empty subset of {names}")
        if self.decoder_type not in DECODER_TYPES:
            raise ValueError(f"decoder_type {self.decoder_type!r} is not one of {DECODER_TYPES}")
        changed = [key for key, value in DECODER_VARIANTS["project"].items() if getattr(self, key) != value]
        if changed and self.decoder_type != "cross_attention":
            raise ValueError(f"{changed} apply to decoder_type 'cross_attention', not {self.decoder_type!r}")
        if self.semseg_head not in SEMSEG_HEADS:
            raise ValueError(f"semseg_head {self.semseg_head!r} is not one of {SEMSEG_HEADS}")
        if self.depth_loss not in DEPTH_LOSSES:
            raise ValueError(f"depth_loss {self.depth_loss!r} is not one of {DEPTH_LOSSES}")
        side = round(self.convnext_preds_per_patch**0.5)
        if side < 1 or side * side != self.convnext_preds_per_patch or self.convnext_head_dim % side**2:
            raise ValueError(
                f"convnext_preds_per_patch {self.convnext_preds_per_patch} must be a square number that divides "
                f"convnext_head_dim {self.convnext_head_dim}"
            )
        if self.hidden_size % 4 or self.decoder_hidden_size % 4:
            raise ValueError("hidden_size and decoder_hidden_size must be multiples of 4 (2D sine-cosine embeddings)")
        height, width = self.image_grid_size()
        if height < 1 or width < 1 or self.image_height % self.patch_size or self.image_width % self.patch_size:
            raise ValueError(
                f"image_size {self.image_size} must be a positive multiple of patch_size {self.patch_size}"
            )
        if self.num_global_tokens < 1:
            raise ValueError(f"num_global_tokens must be >= 1, got {self.num_global_tokens}")
        if self.head_layer_indices is None:
            layers = self.num_hidden_layers
            self.head_layer_indices = [max(0, round((i + 1) * layers / 4) - 1) for i in range(4)]
        if len(self.head_layer_indices) != 4 or any(
            not 0 <= i < self.num_hidden_layers for i in self.head_layer_indices
        ):
            raise ValueError(
                f"head_layer_indices {self.head_layer_indices}: four encoder layers in 0..{self.num_hidden_layers - 1}"
            )
        if self.neck_hidden_sizes is None:
            self.neck_hidden_sizes = [96, 192, 384, 768]
        if len(self.neck_hidden_sizes) != 4:
            raise ValueError(f"neck_hidden_sizes {self.neck_hidden_sizes}: one width per head layer (four)")
        super().__post_init__(**kwargs)

    @property
    def image_height(self) -> int:
        return self.image_size if isinstance(self.image_size, int) else int(self.image_size[0])

    @property
    def image_width(self) -> int:
        return self.image_size if isinstance(self.image_size, int) else int(self.image_size[1])

    def image_grid_size(self) -> tuple[int, int]:
        """Patches per column and per row at ``image_size``."""
        return self.image_height // self.patch_size, self.image_width // self.patch_size

    @property
    def num_patches(self) -> int:
        """Patches per modality at ``image_size`` (the length of each ``mask_<name>``)."""
        height, width = self.image_grid_size()
        return height * width

    @property
    def task_names(self) -> list[str]:
        """One pre-training task per modality, in config order (``MinimaxTrainingArguments.task_names``)."""
        return [spec.name for spec in self.modalities]

    def modality(self, name: str) -> ModalitySpec:
        for spec in self.modalities:
            if spec.name == name:
                return spec
        raise KeyError(f"no modality named {name!r}; the config has {self.task_names}")

    def to_dict(self) -> dict[str, Any]:
        output = super().to_dict()
        output["modalities"] = [asdict(spec) for spec in self.modalities]
        return output

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> MultiMAEConfig:
        """A saved config without ``decoder_type`` predates the option: its decoders are ``"joint"``."""
        return super().from_dict({"decoder_type": "joint", **config_dict}, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs: Any) -> MultiMAEConfig:
        """``PretrainedConfig.from_pretrained``, refusing (with a clear error) a checkpoint of another model type."""
        config_dict, _ = cls.get_config_dict(pretrained_model_name_or_path, **kwargs)
        model_type = config_dict.get("model_type")
        if model_type != cls.model_type:
            hint = (
                " A ViT checkpoint (e.g. one written by robust_pretrain.vision.multimae.export) loads with "
                "transformers' ViTModel / ViTForImageClassification instead."
                if model_type == "vit"
                else ""
            )
            raise ValueError(
                f"{pretrained_model_name_or_path}: config.json has model_type {model_type!r}, not an MM-MAE "
                f"checkpoint (model_type 'multimae').{hint}"
            )
        return super().from_pretrained(pretrained_model_name_or_path, **kwargs)


AutoConfig.register(MultiMAEConfig.model_type, MultiMAEConfig, exist_ok=True)
