"""What :class:`~robust_pretrain.trainer.MinimaxTrainer` reads off a model: whether it is a causal LM (next-token
targets) and, for GradNorm, its last encoder layer."""

from __future__ import annotations

import re

import torch
from accelerate.utils import extract_model_from_parallel
from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def is_causal_lm(model: torch.nn.Module) -> bool:
    """Whether ``model``'s own loss shifts its labels (next-token prediction), decided as transformers decides it: a
    class (or base class) in the ``AutoModelForCausalLM`` mapping (the Trainer's label-smoothing rule) or a
    ``loss_type`` whose loss is ``ForCausalLMLoss`` (its ``num_items_in_batch`` rule), and not an encoder-decoder.

    Looks through DDP/FSDP/DeepSpeed/compile wrappers and peft (``get_base_model``). A custom causal model outside the
    mapping declares itself with ``model.loss_type = "ForCausalLM"``.
    """
    model = extract_model_from_parallel(model, keep_torch_compile=False)
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return False
    causal_names = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    in_mapping = any(cls.__name__ in causal_names for cls in type(model).__mro__)
    return in_mapping or LOSS_MAPPING.get(getattr(model, "loss_type", None)) is ForCausalLMLoss


def last_encoder_layer(model: torch.nn.Module) -> str:
    """Dotted name of the last block of the longest ``...layer.N`` / ``layers.N`` / ``h.N`` / ``block.N`` stack."""
    stacks: dict[str, int] = {}
    for name, _ in model.named_modules():
        match = re.fullmatch(r"(.*\.(?:layer|layers|h|block|blocks))\.(\d+)", name)
        if match:
            stacks[match.group(1)] = max(stacks.get(match.group(1), -1), int(match.group(2)))
    if not stacks:
        raise ValueError("gradnorm_shared_module: no encoder layer stack found; name the shared module explicitly")
    prefix = max(stacks, key=lambda k: stacks[k])
    return f"{prefix}.{stacks[prefix]}"
