"""The dense fine-tuning's batches and Trainer: the collator, the evaluation transform keeping each label at its
own size, and the Trainer that scores the upsampled predictions against it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import Trainer
from transformers.trainer_utils import EvalLoopOutput

from robust_pretrain.vision.finetune.metrics import first_output
from robust_pretrain.vision.multimae.image_processing_multimae import MultiMAETransform

ORIGINAL_TARGET, TARGET_SIZE = "original_target", "target_size"  # evaluation batches: labels at their own size


@dataclass
class DenseCollator:
    """Processed rows -> model batch: ``pixel_values`` (RGB), extra input modalities by name, ``labels``
    (semseg (B,H,W) int64, depth (B,H,W) metres with 0 = invalid, classification (B,) int64). A missing dense target
    (``--unmatched partial``) is filled with the no-label value (``ignore_index`` / 0 m): no loss. Evaluation rows
    also carry the target at its own resolution (:class:`OriginalTargets`), passed on for :class:`DenseTrainer`."""

    task: str
    extra_inputs: tuple[str, ...] = ()
    ignore_index: int = 255

    def __call__(self, features: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        def stack(name: str, fill: float | None = None) -> torch.Tensor:
            values = [feature[name] for feature in features]
            if any(value is None for value in values):  # a missing target: depth (1,H,W) metres, semseg (H,W) ids
                height, width = np.shape(features[0]["rgb"])[-2:]
                shape, dtype = ((1, height, width), np.float32) if name == "depth" else ((height, width), np.int64)
                values = [np.full(shape, fill, dtype) if value is None else value for value in values]
            return torch.from_numpy(np.stack([np.asarray(value) for value in values]))

        batch = {"pixel_values": stack("rgb")}
        batch.update({name: stack(name) for name in self.extra_inputs})
        if self.task == "classification":
            batch["labels"] = torch.tensor([int(feature["label"]) for feature in features], dtype=torch.long)
        elif self.task == "depth":
            batch["labels"] = stack("depth", fill=0.0)[:, 0]
        else:
            batch["labels"] = stack("semseg", fill=self.ignore_index).long()
        if ORIGINAL_TARGET in features[0]:
            batch[ORIGINAL_TARGET] = stack(ORIGINAL_TARGET)
            batch[TARGET_SIZE] = stack(TARGET_SIZE)
        return batch


@dataclass
class OriginalTargets:
    """Evaluation transform: the processed rows plus each target at its own resolution (``original_target``, padded
    to ``canvas`` with the no-label value) and its ``target_size`` (height, width), which :class:`DenseTrainer`
    scores against (the NYUv2 convention: the labels are never resized)."""

    transform: MultiMAETransform
    task: str
    canvas: tuple[int, int]

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        out = self.transform(batch)
        processor = self.transform.processor
        fill, dtype = (processor.ignore_index, np.int32) if self.task == "semseg" else (0.0, np.float32)
        out[ORIGINAL_TARGET], out[TARGET_SIZE] = [], []
        for image_id, value in zip(batch["id"], batch[self.task], strict=True):
            target = processor.decode_example({self.task: value}, f"row {image_id}")[self.task]
            padded = np.full(self.canvas, fill, dtype=dtype)
            padded[: target.shape[0], : target.shape[1]] = target
            out[ORIGINAL_TARGET].append(padded)
            out[TARGET_SIZE].append(np.asarray(target.shape, dtype=np.int64))
        return out


class DenseTrainer(Trainer):
    """``Trainer`` scoring dense predictions at each label's own resolution (the NYUv2 convention): the model's output
    at its input size is upsampled bilinearly to the label's size (segmentation: the logits, then argmax) and
    compared with the label as stored. The evaluation loss stays the model's, at the input size."""

    def __init__(self, *args: Any, task: str, ignore_index: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.task, self.ignore_index = task, ignore_index

    def prediction_step(
        self,
        model: torch.nn.Module,
        inputs: dict[str, torch.Tensor],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        targets, sizes = inputs.pop(ORIGINAL_TARGET, None), inputs.pop(TARGET_SIZE, None)
        loss, outputs, labels = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        if targets is None or outputs is None:
            return loss, outputs, labels
        predictions = upsample_predictions(
            self.task, first_output(outputs), sizes, targets.shape[-2:], self.ignore_index
        )
        return loss, predictions, targets.to(predictions.device)

    def evaluation_loop(self, *args: Any, **kwargs: Any) -> EvalLoopOutput:
        """Evaluate with the main process's buffers on every process: under DDP each process updates its own batch
        norm statistics (the segmentation head's) in training, and evaluation does not wrap the model, so the other
        processes would score a model other than the one saved."""
        if torch.distributed.is_available() and torch.distributed.is_initialized() and self.args.world_size > 1:
            for buffer in self.model.buffers():
                torch.distributed.broadcast(buffer, src=0)
        return super().evaluation_loop(*args, **kwargs)


def upsample_predictions(
    task: str, outputs: torch.Tensor, sizes: torch.Tensor, canvas: Sequence[int], ignore_index: int
) -> torch.Tensor:
    """Per example, ``outputs`` (semseg logits (B,C,h,w), depth (B,h,w) metres) upsampled bilinearly to its label
    size ``sizes[i]`` (segmentation: then argmax), on a ``canvas`` filled with the no-label value elsewhere."""
    semseg = task == "semseg"
    predictions = torch.full(
        (len(outputs), *canvas),
        ignore_index if semseg else 0.0,
        dtype=torch.int32 if semseg else torch.float32,
        device=outputs.device,
    )
    for index, (height, width) in enumerate(sizes.tolist()):
        values = outputs[index : index + 1].float()
        values = values if semseg else values[:, None]
        upsampled = torch.nn.functional.interpolate(values, size=(height, width), mode="bilinear", align_corners=False)
        predictions[index, :height, :width] = upsampled[0].argmax(0) if semseg else upsampled[0, 0]
    return predictions
