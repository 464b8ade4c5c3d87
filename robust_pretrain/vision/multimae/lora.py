"""Loading a LoRA output of ``robust-pretrain-finetune-dense`` in one line: ``AutoModelFor*.from_pretrained(folder)``.

Such a folder holds the adapters and the trained head (``adapter_config.json``, ``adapter_model.safetensors``), the
fine-tuned model's ``config.json`` (classes, inputs, head) and the image processor, but no model weights: the base
weights are the checkpoint ``adapter_config.json`` names (an absolute path for a local checkpoint).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel
from transformers.utils import CONFIG_NAME, SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

ADAPTER_CONFIG_NAME = "adapter_config.json"
_WEIGHTS = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)


def is_lora_output(path: str | os.PathLike) -> bool:
    """A local folder with an adapter and a ``config.json`` but no model weights."""
    folder = Path(path)
    return (
        (folder / ADAPTER_CONFIG_NAME).is_file()
        and (folder / CONFIG_NAME).is_file()
        and not any((folder / name).is_file() for name in _WEIGHTS)
    )


def load_lora_output(
    load_base: Callable[..., PreTrainedModel], path: str | os.PathLike, *model_args: Any, **kwargs: Any
) -> PreTrainedModel:
    """The base model named in ``path``'s adapter config, built with ``path``'s ``config.json`` (unless ``config`` is
    given) by ``load_base`` (a ``from_pretrained``), with the adapters and the trained head merged in."""
    from peft import PeftModel

    from .configuration_multimae import MultiMAEConfig

    base = json.loads((Path(path) / ADAPTER_CONFIG_NAME).read_text(encoding="utf-8")).get("base_model_name_or_path")
    if not base:
        raise ValueError(
            f"{path}: the adapters were trained on a randomly initialised encoder (--random_init), which no "
            "checkpoint holds; load the merged model in its merged/ folder instead"
        )
    kwargs.pop("adapter_kwargs", None)  # the Auto classes point at this folder's adapter: it is merged in below
    config = kwargs.pop("config", None) or MultiMAEConfig.from_pretrained(path)
    model = load_base(base, *model_args, config=config, **kwargs)
    return PeftModel.from_pretrained(model, str(path)).merge_and_unload()
