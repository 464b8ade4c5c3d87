"""Task-robust multi-modal masked-autoencoder pre-training (MM-MAE): one task per image modality.

    accelerate launch recipes/pretrain_multimae.py --config recipes/configs/vision_demo.yaml [--max_steps 100 ...]
    robust-pretrain-multimae --config recipes/configs/vision_demo.yaml      (the same, one process)

Data: generated indoor scenes by default (:mod:`robust_pretrain.vision.scenes`: RGB, metric depth, class maps), or a
folder layout ``<root>/<split>/{rgb,depth,semseg}/<id>.<ext>`` (``--image_folder``), or any ``datasets`` dataset
(``--dataset_name`` with ``--column_mapping rgb=image depth=depth_map ...``). A modality the data do not have is an
absent task (no loss, weight 0); a frame lacking one modality file is refused unless ``--unmatched drop`` (complete
frames only) or ``partial`` (kept: the collator fills that modality with an invalid value and hides it, so it gives
no input and no loss for that frame). Training examples get one random resized crop and flip shared by all their
modalities (the image processor) and a Dirichlet(``mask_alpha``) split of ``num_visible_tokens`` visible patches
across their modalities (the collator); both draw from ``(seed, epoch, image id)``, so a resumed run sees the same
crops and masks as an uninterrupted one. Held-out images are resized whole and masked by a fixed draw
(``eval_masking_seed``, image id): every evaluation, run and strategy scores the same patches.

Every option can come from the ``--config`` YAML/JSON file and be overridden on the command line. The run writes into
``output_dir``: ``model.safetensors``, ``config.json``, ``preprocessor_config.json`` (``AutoModelForPreTraining`` /
``AutoImageProcessor`` load them, no remote code), ``task_report.json`` (per-modality held-out loss, mean, worst),
``task_weights.png``, ``reconstructions.png`` (held-out images: input, masked input, prediction, target per modality),
a model card (README.md), ``*_results.json`` and the Trainer's checkpoints; it resumes from the last checkpoint in
``output_dir`` when there is one (with the same settings).
"""

from __future__ import annotations

import logging
from pathlib import Path

from transformers import set_seed

from robust_pretrain.cli import check_checkpoint, run_console
from robust_pretrain.config import OptionParser, parse_with_config
from robust_pretrain.output_dir import resume_or_refuse, write_run_config
from robust_pretrain.pretraining.common import (
    bind_tasks,
    create_trainer,
    push,
    refuse_given_options,
    setup_logging,
    train_and_evaluate,
)
from robust_pretrain.pretraining.multimae import data as multimae_data
from robust_pretrain.pretraining.multimae.arguments import (
    FROM_SCRATCH,
    DataArguments,
    ModelArguments,
    resolve_modalities,
    run_config,
)
from robust_pretrain.pretraining.multimae.data import (
    MaskedImages,
    prepare_images,
)
from robust_pretrain.pretraining.multimae.model import load_model, semseg_classes
from robust_pretrain.reference import Provenance, check_override, check_reference_run, dataset_fingerprint
from robust_pretrain.reporting import card_renderer, task_report
from robust_pretrain.reporting.plots import plot_reconstructions
from robust_pretrain.reporting.recipe_cards import RECONSTRUCTIONS_NAME, multimae_card_content
from robust_pretrain.reporting.task_report import report_settings, write_report_and_card
from robust_pretrain.trainer.training_args import MinimaxTrainingArguments

__all__ = [
    "main",
    "parse_arguments",
    "run",
    "run_provenance",
    "write_report",
]

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    """Console entry point (``robust-pretrain-multimae``, ``recipes/pretrain_multimae.py``): exit status 2 and one
    paragraph for a bad option, file or checkpoint."""
    return run_console(run, argv, prog="robust-pretrain-multimae")


def run(argv: list[str]) -> dict:
    """Pre-train as ``argv`` says; the held-out metrics and the task report."""
    model_args, data_args, training_args = parse_arguments(argv)
    task_names = model_args.modalities
    setup_logging(training_args, logger, multimae_data.logger)
    logger.info(
        "weighting=%s modalities=%s output_dir=%s", training_args.weighting, task_names, training_args.output_dir
    )
    settings = run_config(model_args, data_args, training_args)
    resume_checkpoint = resume_or_refuse(training_args, settings, overwrite=data_args.overwrite_output_dir)
    set_seed(training_args.seed)

    num_classes = semseg_classes(model_args, data_args)
    model = load_model(model_args, num_classes if "semseg" in task_names else None)
    images = prepare_images(model_args, data_args, training_args, model.config, num_classes)
    provenance = run_provenance(images, data_args, model, task_names)
    check_reference_run(training_args.reference_run, training_args.reference_mismatch_ok, provenance)
    write_run_config(training_args, settings)
    trainer = create_trainer(
        training_args,
        model=model,
        train_dataset=images.train_dataset,
        eval_dataset=images.eval_dataset,
        processing_class=images.processor,
        data_collator=images.collator,
    )
    eval_metrics = train_and_evaluate(trainer, resume_checkpoint)
    report = write_report(trainer, eval_metrics, provenance, images, model_args, data_args, training_args)
    push(trainer)
    return {**eval_metrics, "report": report}


def parse_arguments(argv: list[str]) -> tuple[ModelArguments, DataArguments, MinimaxTrainingArguments]:
    """The options (MultiMAE's optimiser by default), checked, with the modalities resolved and bound as the tasks."""
    parser = OptionParser((ModelArguments, DataArguments, MinimaxTrainingArguments), description=__doc__)
    parser.set_defaults(
        report_to=[],
        save_total_limit=3,
        remove_unused_columns=False,  # the image transform needs the raw columns and the ids
        learning_rate=1e-4,  # the paper's (MultiMAE's) optimiser: AdamW, lr 1e-4, wd 0.05, warm-up then cosine
        weight_decay=0.05,
        adam_beta2=0.95,
        lr_scheduler_type="cosine",
        warmup_steps=0.05,
    )
    model_args, data_args, training_args = parse_with_config(parser, argv)
    check_override(training_args.reference_mismatch_ok, {"reference_run": training_args.reference_run})
    check_checkpoint(model_args.model_name_or_path)
    if model_args.model_name_or_path is not None:
        refuse_given_options(
            argv, FROM_SCRATCH, "from-scratch options, unused with --model_name_or_path (the checkpoint keeps its own)"
        )
    bind_tasks(training_args, resolve_modalities(model_args), "the modalities")
    return model_args, data_args, training_args


def run_provenance(images: MaskedImages, data_args: DataArguments, model, task_names: list[str]) -> Provenance:
    """What the run's held-out losses depend on: the tasks, the data, the held-out masks and the model."""
    config = model.config
    held_out = dataset_fingerprint(
        images.eval_raw,
        data_args.eval_masking_seed,
        images.budget,
        data_args.mask_alpha,
        config.image_size,
        config.patch_size,
    )
    return Provenance.of_run(task_names, None, dataset_fingerprint(images.train_raw), held_out, model)


def write_report(
    trainer,
    eval_metrics: dict,
    provenance: Provenance,
    images: MaskedImages,
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: MinimaxTrainingArguments,
) -> dict:
    """Write the task report, the reconstructions of a few held-out images and the model card; the report."""
    base = trainer.accelerator.unwrap_model(trainer.model)
    config = base.config
    recipe_settings = {
        "image_size": config.image_size,
        "patch_size": config.patch_size,
        "num_visible_tokens": images.budget,
        "mask_alpha": data_args.mask_alpha,
    }
    stated = report_settings(training_args, trainer.state.max_steps, recipe_settings)
    final_weights = trainer.step_weights.tolist()
    task_names = model_args.modalities
    report = task_report(task_names, trainer.state.log_history, eval_metrics, stated, final_weights, provenance)
    reconstructions = training_args.should_save and data_args.num_reconstructions > 0
    if reconstructions:
        eval_dataset = images.eval_dataset
        shown = eval_dataset.select(range(min(data_args.num_reconstructions, len(eval_dataset))))
        examples = [shown[i] for i in range(len(shown))]
        plot_reconstructions(
            base,
            images.collator(examples),
            [e["id"] for e in examples],
            images.processor,
            Path(training_args.output_dir) / RECONSTRUCTIONS_NAME,
        )
    content = multimae_card_content(
        base,
        report,
        model_args,
        data_args,
        len(images.train_raw),
        len(images.eval_raw),
        reconstructions=reconstructions,
    )
    write_report_and_card(trainer, report, card_renderer(trainer, content))
    return report


if __name__ == "__main__":
    raise SystemExit(main())
