"""Every bad input is refused before any work: exit status 2, at most 3 lines naming the option or file, no traceback,
nothing written (issue 17). A new case is one line in a table.

Console cases run ``main(argv)`` in-process: ``argv`` is the script's base command line plus the case's options
(later options win); ``{out}`` is an existing output directory holding a user's file, ``{tmp}`` the test's folder
(with ``file.txt``, ``empty.txt``, ``blank.txt``, ``binary.txt``, ``bad.parquet``, ``typo.yaml``, ``weights.json``,
``overflow.json``, ``strings.json``, ``booleans.json``, ``zero.json``, ``two.json``, ``ds.json``), ``{mmae}`` a tiny
MM-MAE checkpoint, ``{images}`` image folders (:func:`image_folders`), ``{ro}`` a path where nothing can be created.
Each case checks that no file under ``{tmp}`` changed.
"""

from __future__ import annotations

import json
import logging
import math
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from processes import checkout_env
from test_recipe_pretrain import DEMO_CONFIG, MINILM
from tiny_causal_lm import VOCAB as DECODER_VOCAB
from tiny_training import TASKS, VOCAB, masked_examples, one_step_args, tiny_bert
from tiny_vision import tiny_config
from transformers import AutoTokenizer

from robust_pretrain.data import TaskGroupedMLMCollator
from robust_pretrain.evaluation import suite
from robust_pretrain.glue import finetune as glue_finetune
from robust_pretrain.hub import main as publish_main
from robust_pretrain.options import LoraArguments
from robust_pretrain.pretraining import compare, mixture
from robust_pretrain.pretraining.causal_lm import recipe as causal_lm
from robust_pretrain.pretraining.multimae import recipe as multimae
from robust_pretrain.pretraining.pos_mlm import recipe as pos_mlm
from robust_pretrain.trainer import MinimaxTrainer
from robust_pretrain.trainer.training_args import MinimaxTrainingArguments
from robust_pretrain.vision import pseudo_label
from robust_pretrain.vision.collator import ModalityMaskCollator
from robust_pretrain.vision.finetune import recipe as dense_finetune
from robust_pretrain.vision.multimae import export
from robust_pretrain.vision.multimae.image_processing_multimae import MultiMAEImageProcessor
from robust_pretrain.vision.multimae.pretraining import MultiMAEForPreTraining
from robust_pretrain.weighting import build_weighting

REPO_ROOT = Path(__file__).resolve().parents[1]
VISION_CONFIG = REPO_ROOT / "recipes" / "configs" / "vision_demo.yaml"
GLUE_DIR = REPO_ROOT.parent / "shared" / "data" / "glue"
READ_ONLY = "/sys/robust-pretrain-bad-input"  # even root cannot create anything there

SCRIPTS: dict[str, tuple[Callable[[list[str]], int], str, list[str]]] = {
    "pos-mlm": (
        pos_mlm.main,
        "robust-pretrain-pos-mlm",
        ["--config", str(DEMO_CONFIG), "--output_dir", "{out}", "--train_file", "{tmp}/train.txt", "--max_steps", "2"],
    ),
    "multimae": (
        multimae.main,
        "robust-pretrain-multimae",
        ["--config", str(VISION_CONFIG), "--output_dir", "{out}", "--max_steps", "2"],
    ),
    "compare": (compare.main, "robust-pretrain-compare", ["--config", str(DEMO_CONFIG), "--output_dir", "{out}"]),
    "finetune-glue": (
        glue_finetune.main,
        "robust-pretrain-finetune-glue",
        [
            "--model_name_or_path",
            str(MINILM),
            "--task_name",
            "rte",
            "--glue_dir",
            str(GLUE_DIR),
            "--output_dir",
            "{out}",
        ],
    ),
    "finetune-dense": (
        dense_finetune.main,
        "robust-pretrain-finetune-dense",
        ["--model_name_or_path", "{mmae}", "--task", "semseg", "--output_dir", "{out}"],
    ),
    "suite": (
        suite.main,
        "robust-pretrain-suite",
        ["--checkpoints", str(MINILM), "--tasks", "rte", "--glue_dir", str(GLUE_DIR), "--output_dir", "{out}"],
    ),
    "pseudo-label": (
        pseudo_label.main,
        "robust-pretrain-pseudo-label",
        ["--dataset", "{tmp}", "--output_dir", "{tmp}/labelled", "--depth_model", str(MINILM)],
    ),
    "causal-lm": (
        causal_lm.main,
        "robust-pretrain-causal-lm",
        ["--config", "decoder_demo", "--output_dir", "{out}", "--max_steps", "2"],
    ),
    "mixture": (mixture.main, "robust-pretrain-mixture", ["--config", "decoder_demo", "--output_dir", "{out}"]),
    "export-vit": (export.main, "robust-pretrain-export-vit", []),
    "publish": (publish_main, "robust-pretrain-publish", []),
}

FOLDER = ["--num_semseg_classes", "3", "--image_size", "16", "--patch_size", "4", "--num_visible_tokens", "8"]
DENSE = ["--num_labels", "3", "--eval_split", "test", "--image_folder"]
TWO_DOMAINS = ["--domain_files", "web={tmp}/train.txt", "mail={tmp}/train.txt"]
DOMAIN_STREAMS = ["--streaming", "true", *TWO_DOMAINS, "--tokenizer_name", str(MINILM)]
POS_STREAM = ["--streaming", "true", "--tokenizer_name", str(MINILM)]

# (script, options, fragments the error must contain)
CONSOLE_CASES: list[tuple[str, list[str], list[str]]] = [
    # pos-mlm: numbers, ranges, finiteness, choices, types
    ("pos-mlm", ["--per_device_train_batch_size", "0"], ["--per_device_train_batch_size", "positive integer"]),
    ("pos-mlm", ["--per_device_eval_batch_size", "-3"], ["--per_device_eval_batch_size"]),
    ("pos-mlm", ["--gradient_accumulation_steps", "0"], ["--gradient_accumulation_steps", "positive integer"]),
    ("pos-mlm", ["--learning_rate", "-1"], ["--learning_rate must be > 0, got -1.0"]),
    ("pos-mlm", ["--learning_rate", "0"], ["--learning_rate must be > 0"]),
    ("pos-mlm", ["--learning_rate", "nan"], ["--learning_rate must be a finite number > 0, got nan"]),
    ("pos-mlm", ["--learning_rate", "abc"], ["--learning_rate", "invalid float value: 'abc'"]),
    ("pos-mlm", ["--weight_decay", "-0.1"], ["--weight_decay must be >= 0"]),
    ("pos-mlm", ["--adam_beta1", "1.5"], ["--adam_beta1 must be in [0, 1)"]),
    ("pos-mlm", ["--adam_beta2", "inf"], ["--adam_beta2 must be a finite number"]),
    ("pos-mlm", ["--max_grad_norm", "-1"], ["--max_grad_norm must be >= 0"]),
    ("pos-mlm", ["--warmup_steps", "-5"], ["--warmup_steps must be >= 0"]),
    ("pos-mlm", ["--max_steps", "0"], ["--max_steps must be a positive number of optimizer steps"]),
    ("pos-mlm", ["--max_steps", "-5"], ["--max_steps must be a positive number of optimizer steps"]),
    ("pos-mlm", ["--max_steps", "2.5"], ["--max_steps", "invalid int value"]),
    ("pos-mlm", ["--max_steps", "-1", "--num_train_epochs", "0"], ["--num_train_epochs must be > 0"]),
    ("pos-mlm", ["--logging_steps", "0"], ["--logging_steps must be > 0"]),
    ("pos-mlm", ["--save_steps", "-1"], ["--save_steps must be > 0"]),
    ("pos-mlm", ["--save_total_limit", "0"], ["--save_total_limit"]),
    ("pos-mlm", ["--seed", "-1"], ["--seed must be in [0, 4.29497e+09], got -1"]),
    ("pos-mlm", ["--dataloader_num_workers", "-1"], ["--dataloader_num_workers must be >= 0"]),
    ("pos-mlm", ["--label_smoothing_factor", "1"], ["--label_smoothing_factor must be in [0, 1)"]),
    ("pos-mlm", ["--vocab_size", "-5"], ["--vocab_size must be >= 16, got -5"]),
    ("pos-mlm", ["--vocab_size", "abc"], ["--vocab_size", "invalid int value"]),
    ("pos-mlm", ["--max_seq_length", "4"], ["--max_seq_length must be between 8 and 8192 tokens"]),
    ("pos-mlm", ["--mlm_probability", "0"], ["--mlm_probability must be in (0, 1]", "nothing to learn"]),
    ("pos-mlm", ["--mlm_probability", "nan"], ["--mlm_probability must be a finite number"]),
    ("pos-mlm", ["--validation_split_percentage", "100"], ["--validation_split_percentage must be in [1, 99]"]),
    ("pos-mlm", ["--max_train_samples", "0"], ["--max_train_samples must be a positive integer"]),
    ("pos-mlm", ["--max_eval_samples", "-2"], ["--max_eval_samples must be a positive integer"]),
    ("pos-mlm", ["--preprocessing_num_workers", "0"], ["--preprocessing_num_workers"]),
    ("pos-mlm", ["--eval_masking_seed", "-1"], ["--eval_masking_seed must be >= 0"]),
    ("pos-mlm", ["--tagger", "bogus"], ["--tagger", "invalid choice: 'bogus'"]),
    ("pos-mlm", ["--masking", "foo"], ["--masking", "invalid choice: 'foo'"]),
    ("pos-mlm", ["--model_size", "huge"], ["--model_size", "invalid choice: 'huge'"]),
    ("pos-mlm", ["--weighting", "best"], ["--weighting", "invalid choice: 'best'"]),
    ("pos-mlm", ["--task_sampling", "online"], ["--task_sampling online", "--masking per_example"]),
    ("pos-mlm", ["--alpha", "inf"], ["--alpha must be a finite number > 0, got inf"]),
    ("pos-mlm", ["--alpha", "-1"], ["--alpha must be > 0"]),
    ("pos-mlm", ["--alpha", "nan"], ["--alpha must be a finite number"]),
    ("pos-mlm", ["--weight_floor", "1"], ["--weight_floor must be in [0, 1)"]),
    ("pos-mlm", ["--loss_ema", "-0.5"], ["--loss_ema must be in [0, 1)"]),
    ("pos-mlm", ["--alpha_schedule", "linear"], ["--alpha_schedule", "invalid choice"]),
    (
        "pos-mlm",
        ["--loss_normalization", "excess", "--reference_losses", "1", "nan", "2", "3", "4", "5", "6", "7", "8"],
        ["--reference_losses must be a finite number, got nan"],
    ),  # fmt: skip
    ("pos-mlm", ["--loss_normalization", "excess"], ["reference_losses"]),
    # reference-relative objectives (issue 18): the reference run or model, refused before any work
    ("pos-mlm", ["--loss_normalization", "excess", "--reference_run", "{tmp}/nowhere"], ["--reference_run", "nowhere"]),
    ("pos-mlm", ["--loss_normalization", "excess", "--reference_run", "{tmp}"], ["{tmp}: no task_report.json"]),
    ("pos-mlm", ["--reference_run", "{tmp}"], ["reference_run is the reference of", "add --loss_normalization excess"]),
    (
        "pos-mlm",
        ["--weighting", "proportional", "--loss_normalization", "excess", "--reference_model", "{mmae}"],
        ["reference_model: weighting='proportional' does not weigh the tasks by their losses"],
    ),
    (
        "pos-mlm",
        ["--loss_normalization", "excess", "--reference_model", "{tmp}/nowhere"],
        ["--reference_model {tmp}/nowhere: no such checkpoint directory"],
    ),
    (
        "pos-mlm",
        ["--loss_normalization", "excess", "--reference_model", "{mmae}", "--reference_run", "{tmp}"],
        ["reference_run and reference_model: give one reference"],
    ),
    (
        "pos-mlm",
        ["--loss_normalization", "excess", "--reference_model", "{mmae}", "--reference_losses", *"123456789"],
        ["reference_model and reference_losses: give one reference"],
    ),
    ("pos-mlm", ["--reference_mismatch_ok", "tokenizer"], ["reference_mismatch_ok: only used with reference_run"]),
    (
        "pos-mlm",
        ["--loss_normalization", "excess", "--reference_model", "{mmae}"],
        ["--reference_model {mmae}: records no tokenizer", "pass --reference_mismatch_ok tokenizer"],
    ),  # issue 39: a reference model's tokenizer is checked like a reference run's
    ("pos-mlm", ["--reference_mismatch_ok", "vocabulary"], ["--reference_mismatch_ok", "invalid choice"]),
    (
        "pos-mlm",
        ["--masking", "per_example", "--task_sampling", "online", "--weighting", "minimax"]
        + ["--loss_normalization", "excess", "--reference_model", "{mmae}"],
        ["task_sampling='online' minimises the plain mean: it cannot use reference_model"],
    ),
    ("multimae", ["--loss_normalization", "excess", "--reference_run", "{tmp}"], ["{tmp}: no task_report.json"]),
    ("pos-mlm", ["--weighting", "group_dro", "--dro_step_size", "0"], ["--dro_step_size must be > 0"]),
    ("pos-mlm", ["--weighting", "morbit", "--morbit_step_size", "inf"], ["--morbit_step_size must be a finite"]),
    ("pos-mlm", ["--weighting", "dwa", "--dwa_window", "0"], ["--dwa_window must be a positive integer"]),
    ("pos-mlm", ["--weighting", "dwa", "--dwa_temperature", "-2"], ["--dwa_temperature must be > 0"]),
    ("pos-mlm", ["--weighting", "gradnorm", "--gradnorm_alpha", "-1"], ["--gradnorm_alpha must be >= 0"]),
    ("pos-mlm", ["--weighting_learning_rate", "0"], ["--weighting_learning_rate must be > 0"]),
    ("pos-mlm", ["--causal_lm_chunk_size", "-1"], ["--causal_lm_chunk_size must be >= 0"]),
    ("pos-mlm", ["--weighting", "average", "--alpha", "2"], ["alpha: not used by weighting='average'"]),
    ("pos-mlm", ["--use_lora", "true", "--lora_r", "0"], ["--lora_r must be a positive integer"]),
    ("pos-mlm", ["--lora_dropout", "1"], ["--lora_dropout must be in [0, 1)"]),
    ("pos-mlm", ["--lora_alpha", "0"], ["--lora_alpha must be > 0"]),
    ("pos-mlm", ["--use_lora", "maybe"], ["--use_lora"]),
    ("pos-mlm", ["--output_dir", "{tmp}/file.txt"], ["--output_dir", "file.txt: is a file, not a directory"]),
    ("pos-mlm", ["--output_dir", READ_ONLY], ["--output_dir", "is not writable"]),
    ("pos-mlm", ["--train_file", "{tmp}/nowhere.txt"], ["--train_file", "nowhere.txt: no such file"]),
    ("pos-mlm", ["--train_file", "{tmp}/nothing-*.txt"], ["--train_file", "no file matches"]),
    ("pos-mlm", ["--train_file", "{tmp}"], ["--train_file", "is a directory, not a file"]),
    ("pos-mlm", ["--validation_file", "{tmp}/nowhere.txt"], ["--validation_file", "no such file"]),
    ("pos-mlm", ["--train_file", "{tmp}/bad.parquet"], ["--train_file", "bad.parquet is not a readable Parquet file"]),
    ("pos-mlm", ["--train_file", "{tmp}/empty.txt"], ["--train_file", "empty.txt is empty"]),
    ("pos-mlm", ["--train_file", "{tmp}/binary.txt"], ["--train_file", "binary.txt is not text"]),
    ("pos-mlm", ["--model_name_or_path", "{tmp}/no-model"], ["--model_name_or_path", "no such checkpoint directory"]),
    ("pos-mlm", ["--model_name_or_path", "{tmp}/file.txt"], ["--model_name_or_path", "is a file"]),
    ("pos-mlm", ["--tokenizer_name", "{tmp}/no-tokenizer"], ["--tokenizer_name", "no such checkpoint directory"]),
    ("pos-mlm", ["--task_spec", "{tmp}/no-spec.yaml"], ["--task_spec", "no-spec.yaml"]),
    ("pos-mlm", ["--max_stepz", "3"], ["unknown option --max_stepz", "did you mean --max_steps?"]),
    ("pos-mlm", ["--config", "{tmp}/typo.yaml"], ["--config", "typo.yaml", "'max_stepz' is not an option"]),
    ("pos-mlm", ["--config", "{tmp}/no-config.yaml"], ["--config", "no-config.yaml"]),
    (
        "pos-mlm",
        ["--per_device_train_batch_size", "0", "--learning_rate", "-1", "--alpha", "inf"],
        ["--per_device_train_batch_size", "--learning_rate", "--alpha"],
    ),  # fmt: skip
    ("pos-mlm", ["--streaming", "true", "--max_steps", "-1"], ["--streaming needs --max_steps"]),
    (
        "pos-mlm",
        [*POS_STREAM, "--masking", "per_example", "--task_sampling", "online"],
        ["--streaming: --task_sampling online draws among each sequence's tasks, which needs map-style data"],
    ),  # fmt: skip
    # multimae
    ("multimae", ["--patch_size", "0"], ["--patch_size must be a positive integer, got 0"]),
    ("multimae", ["--patch_size", "7"], ["--patch_size 7 does not divide --image_size"]),
    ("multimae", ["--image_size", "-32"], ["--image_size must be a positive integer"]),
    ("multimae", ["--max_depth", "0"], ["--max_depth must be > 0"]),
    ("multimae", ["--depth_normalization", "log"], ["--depth_normalization", "invalid choice: 'log'"]),
    ("multimae", ["--config_overrides", "decoder_type=self"], ["decoder_type 'self' is not one of"]),
    ("multimae", ["--image_folder", "{tmp}/nowhere"], ["--image_folder", "nowhere: no such directory"]),
    ("multimae", ["--image_folder", "{tmp}/file.txt"], ["--image_folder", "is a file, not a directory"]),
    ("multimae", ["--modalities", "rgb", "--num_semseg_classes", "1"], ["--num_semseg_classes must be >= 2"]),
    ("multimae", ["--mask_alpha", "0"], ["--mask_alpha must be > 0"]),
    ("multimae", ["--mask_alpha", "nan"], ["--mask_alpha must be a finite number"]),
    ("multimae", ["--num_visible_tokens", "0"], ["--num_visible_tokens must be a positive integer"]),
    ("multimae", ["--crop_scale", "0.2", "inf"], ["--crop_scale must be a finite number in (0, 1]"]),
    ("multimae", ["--crop_scale", "0.9", "0.2"], ["--crop_scale", "give min then max"]),
    ("multimae", ["--flip_probability", "1.5"], ["--flip_probability must be in [0, 1]"]),
    ("multimae", ["--depth_scale", "0"], ["--depth_scale must be > 0"]),
    ("multimae", ["--num_train_scenes", "0"], ["--num_train_scenes must be a positive integer"]),
    ("multimae", ["--scene_size", "2"], ["--scene_size must be >= 8"]),
    ("multimae", ["--model_size", "giant"], ["--model_size", "invalid choice"]),
    ("multimae", ["--output_dir", READ_ONLY], ["--output_dir", "is not writable"]),
    ("multimae", ["--num_reconstructions", "-1"], ["--num_reconstructions must be >= 0"]),
    # compare
    ("compare", ["--strategies", "minimax", "--baseline", "average"], ["--baseline average is not among the runs"]),
    ("compare", ["--sweep", "alpha=abc"], ["--sweep alpha=abc: not a number"]),
    ("compare", ["--sweep", "alpha=0.5,inf"], ["--sweep alpha=inf", "finite"]),
    ("compare", ["--sweep", "alpha=-1"], ["--sweep alpha=-1", "must be > 0"]),
    ("compare", ["--strategies", "dwa", "--sweep", "dwa_window=1.5"], ["--sweep dwa_window=1.5: not an integer"]),
    ("compare", ["--sweep", "alpha_auto_k=abc,0.5"], ["--sweep alpha_auto_k=abc: not a number", "must be >= 1"]),
    ("compare", ["--sweep", "alpha"], ["--sweep must look like setting=v1,v2"]),
    ("compare", ["--sweep", "alpah=1,2"], ["--sweep 'alpah' is a setting of none of the strategies"]),
    ("compare", ["--strategies", "minmax"], ["unknown strategy 'minmax'"]),
    ("compare", ["--seeds", "-1"], ["--seeds must be >= 0"]),
    ("compare", ["--reference_run", "{tmp}"], ["--reference_run {tmp}: no task_report.json"]),
    ("compare", ["--reference_run", "{tmp}/gone"], ["--reference_run {tmp}/gone: no such directory"]),
    (
        "compare",
        ["--", "--reference_run", "{tmp}/gone"],
        ["the options of every run: --reference_run {tmp}/gone: no such"],
    ),
    (
        "compare",
        ["--reference_run", "{tmp}/reference"],
        [
            "the reference run {tmp}/reference does not have the runs' tasks",
            "it lacks ['adjective',",
            "lack ['numeral']",
        ],
    ),
    ("compare", ["--seeds", "one"], ["--seeds", "invalid int value"]),
    ("compare", ["--output_dir", "{tmp}/file.txt"], ["--output_dir", "is a file"]),
    ("compare", ["--recipe", "gpt"], ["--recipe", "invalid choice"]),
    # finetune-glue
    ("finetune-glue", ["--model_name_or_path", "{mmae}"], ["--model_name_or_path", "(multimae) is not a text model"]),
    ("finetune-glue", ["--learning_rate", "-0.00002"], ["--learning_rate must be > 0"]),
    ("finetune-glue", ["--per_device_train_batch_size", "0"], ["--per_device_train_batch_size"]),
    ("finetune-glue", ["--max_seq_length", "0"], ["--max_seq_length must be a positive integer"]),
    ("finetune-glue", ["--glue_dir", "{tmp}/no-glue"], ["--glue_dir", "no such directory"]),
    ("finetune-glue", ["--use_lora", "true", "--lora_r", "0"], ["--lora_r must be a positive integer"]),
    ("finetune-glue", ["--warmup_steps", "nan"], ["--warmup_steps must be a finite number"]),
    ("finetune-glue", ["--output_dir", "{tmp}/file.txt"], ["--output_dir", "is a file"]),
    ("finetune-glue", [], ["--output_dir", "already holds files"]),
    # finetune-dense
    ("finetune-dense", ["--task", "segmentation"], ["--task", "invalid choice: 'segmentation'"]),
    ("finetune-dense", ["--layer_decay", "0"], ["--layer_decay must be in (0, 1]"]),
    ("finetune-dense", ["--image_folder", "{tmp}/nowhere"], ["--image_folder", "no such directory"]),
    ("finetune-dense", ["--num_labels", "0"], ["--num_labels must be a positive integer"]),
    ("finetune-dense", ["--max_depth", "-1"], ["--max_depth must be > 0"]),
    ("finetune-dense", ["--flip_probability", "2"], ["--flip_probability must be in [0, 1]"]),
    ("finetune-dense", ["--learning_rate", "inf"], ["--learning_rate must be a finite number"]),
    ("finetune-dense", ["--model_name_or_path", "{tmp}/no-model"], ["--model_name_or_path", "no such checkpoint"]),
    # suite
    ("suite", ["--seeds", "-4"], ["--seeds must be >= 0"]),
    ("suite", ["--learning_rate", "0"], ["--learning_rate must be > 0"]),
    ("suite", ["--glue_dir", "{tmp}/no-glue"], ["--glue_dir", "no such directory"]),
    ("suite", ["--per_device_train_batch_size", "zero"], ["--per_device_train_batch_size", "invalid int value"]),
    ("suite", ["--output_dir", READ_ONLY], ["--output_dir", "is not writable"]),
    ("suite", ["--family", "probe", "--probe_folds", "1"], ["--probe_folds must be >= 2, got 1"]),
    ("suite", ["--family", "probe", "--probe_lambdas", "1", "0"], ["--probe_lambdas must be > 0"]),
    ("suite", ["--family", "probe", "--learning_rate", "1e-4"], ["--learning_rate"]),
    ("suite", ["--checkpoints", "random-init:{mmae}"], ["random-init:", "the glue family has no random-init entries"]),
    # pseudo-label
    ("pseudo-label", ["--batch_size", "0"], ["--batch_size must be a positive integer"]),
    ("pseudo-label", ["--depth_scale", "-1"], ["--depth_scale must be > 0"]),
    ("pseudo-label", ["--output_format", "zip"], ["--output_format", "invalid choice: 'zip'"]),
    ("pseudo-label", ["--output_dir", "{tmp}/file.txt"], ["--output_dir", "is a file"]),
    ("pseudo-label", ["--depth_model", "{tmp}/no-model"], ["--depth_model", "no such checkpoint"]),
    # causal-lm
    ("causal-lm", ["--domain_files", "web={tmp}/empty.txt"], ["--domain_files web={tmp}/empty.txt is empty"]),
    (
        "causal-lm",
        ["--domain_files", "answers={tmp}/missing.txt", "web={tmp}/train.txt"],
        ["--domain_files answers={tmp}/missing.txt: data file not found"],
    ),  # issue 39: no stray space after the "="
    ("causal-lm", ["--domain_files", "web={tmp}/nowhere.txt"], ["--domain_files web=", "data file not found"]),
    ("causal-lm", ["--domain_files", "web"], ["--domain_files web: expected name=path"]),
    (
        "causal-lm",
        ["--domain_files", "web={tmp}/train.txt", "mail={tmp}/file.txt"],
        ["domain mail has no held-out text", "at least 2 texts"],
    ),  # fmt: skip
    (
        "causal-lm",
        ["--domain_files", "web={tmp}/train.txt", "--domain_weights", "{tmp}/weights.json"],
        ["weights.json: unknown domain(s) ['news'], missing domain(s) ['web']"],
    ),  # fmt: skip
    ("causal-lm", ["--domain_weights", "{tmp}/file.txt"], ["--domain_weights", "file.txt: not a JSON file"]),
    ("causal-lm", ["--domain_column", "source"], ["--domain_column names a column of --dataset_name or --train_file"]),
    (
        "causal-lm",
        ["--train_file", "{tmp}/train.txt", "--domain_column", "source"],
        ["--domain_column source", "has no such column (columns: ['text'])"],
    ),  # fmt: skip
    ("causal-lm", ["--model_name_or_path", str(MINILM)], ["(bert, BertModel) is not a causal LM"]),
    ("causal-lm", ["--model_name_or_path", "{mmae}"], ["(multimae", "is not a causal LM"]),
    (
        "causal-lm",
        ["--task_sampling", "online", "--domain_weights", "{tmp}/weights.json"],
        ["--domain_weights are the fixed sampling weights: they exclude --task_sampling online"],
    ),  # fmt: skip
    (
        "causal-lm",
        ["--task_sampling", "online", "--weighting", "uncertainty"],
        ["weighting='uncertainty' cannot drive task sampling"],
    ),  # fmt: skip
    (
        "causal-lm",
        ["--objective_weights", "{tmp}/weights.json"],
        ["--objective_weights are the objective of importance weighting: add --task_sampling fixed"],
    ),  # fmt: skip
    ("causal-lm", ["--importance_weighting", "true"], ["importance_weighting: corrects the draws of task_sampling="]),
    ("causal-lm", ["--max_seq_length", "1"], ["--max_seq_length must be in [2, 8192]"]),
    ("causal-lm", ["--streaming", "true"], ["--streaming reads --domain_files (one stream per domain)"]),
    (
        "causal-lm",
        ["--streaming", "true", "--domain_files", "web={tmp}/train.txt"],
        ["--streaming: a tokenizer cannot be trained on a stream"],
    ),  # fmt: skip
    ("causal-lm", ["--stream_held_out_texts", "0"], ["--stream_held_out_texts must be a positive integer"]),
    # issue 31 item 5: online sampling on streams
    (
        "causal-lm",
        [*DOMAIN_STREAMS, "--task_sampling", "fixed", "--task_sampling_weights", "1", "1"],
        ["--streaming --task_sampling fixed: streams draw fixed weights from a file; give them as --domain_weights"],
    ),
    (
        "causal-lm",
        [*DOMAIN_STREAMS, "--stream_shuffle_buffer", "8"],
        ["--stream_shuffle_buffer shuffles the domain streams of --task_sampling online"],
    ),
    (
        "causal-lm",
        [*DOMAIN_STREAMS, "--task_sampling", "online", "--dataloader_num_workers", "2"],
        ["reads the domain streams in the training process: --dataloader_num_workers must be 0, got 2"],
    ),
    (
        "causal-lm",
        [*DOMAIN_STREAMS, "--task_sampling", "online", "--restore_callback_states_from_checkpoint", "true"],
        ["--restore_callback_states_from_checkpoint: --streaming --task_sampling online restores its stream positions"],
    ),
    ("causal-lm", ["--stream_shuffle_buffer", "-1"], ["--stream_shuffle_buffer must be"]),
    ("causal-lm", ["--task_names", "a", "b"], ["--task_names ['a', 'b'] differ from the data's domains"]),
    # issue 39: importance weighting, sampling, FSDP / DeepSpeed that cannot run, unused stream options
    (
        "causal-lm",
        ["--task_sampling", "fixed", "--task_sampling_weights", "0", "1", "1", "--importance_weighting", "true"],
        ["task_sampling_weights: importance weighting draws every task, but task 0: 0 (normalised) is below 0.000333"],
    ),
    (
        "causal-lm",
        ["--task_sampling", "fixed", "--task_sampling_weights", "1e-30", "1", "1", "--importance_weighting", "true"],
        ["importance weighting draws every task, but task 0: 5e-31 (normalised)", "never drawn"],
    ),
    (
        "causal-lm",
        [
            *TWO_DOMAINS,
            "--domain_weights",
            "{tmp}/zero.json",
            "--task_sampling",
            "fixed",
            "--importance_weighting",
            "1",
        ],
        ["--domain_weights {tmp}/zero.json: importance weighting draws every task, but web: 0 (normalised)"],
    ),
    (
        "causal-lm",
        [*TWO_DOMAINS, "--domain_weights", "{tmp}/two.json", "--objective_weights", "{tmp}/strings.json"]
        + ["--task_sampling", "fixed", "--importance_weighting", "1"],
        ["--objective_weights {tmp}/strings.json: the weight of 'web' is '0.5', not a finite JSON number"],
    ),
    (
        "causal-lm",
        ["--task_sampling", "online", "--weighting", "proportional"],
        ["weighting='proportional' cannot drive task sampling: its weights are the batch's own task shares"],
    ),
    (
        "causal-lm",
        ["--stream_shuffle_buffer", "8"],
        ["--stream_shuffle_buffer shuffles domain streams: it needs --streaming"],
    ),
    ("causal-lm", ["--fsdp", "full_shard"], ["fsdp: FSDP shards the model over processes and this run has one"]),
    ("causal-lm", ["--fsdp", "full_shard", "--weighting", "gradnorm"], ["fsdp: FSDP shards the model over processes"]),
    ("causal-lm", ["--fsdp", "full_shard", "--causal_lm_chunk_size", "0"], ["fsdp: FSDP shards the model"]),
    ("pos-mlm", ["--fsdp", "full_shard", "--weighting", "uncertainty"], ["fsdp: FSDP shards the model over processes"]),
    (
        "causal-lm",
        ["--deepspeed", "{tmp}/ds.json"],
        ["deepspeed {tmp}/ds.json: DeepSpeed is not installed; install it (pip install deepspeed"],
    ),
    # mixture
    ("mixture", ["--rounds", "0"], ["--rounds must be a positive integer"]),
    ("mixture", ["--weights_tolerance", "0"], ["--weights_tolerance must be > 0"]),
    ("mixture", ["--proxy_objective", "dwa"], ["--proxy_objective", "invalid choice: 'dwa'"]),
    ("mixture", ["--domain_files", "web={tmp}/empty.txt"], ["--domain_files web=", "empty.txt is empty"]),
    # issue 29 item 1: a task, domain or modality without targets, in the training or the held-out data
    (
        "causal-lm",
        ["--domain_files", "web={tmp}/train.txt", "blank={tmp}/blank.txt"],
        ["domain blank: no target in the training data (no text after tokenisation"],
    ),  # fmt: skip
    (
        "pos-mlm",
        ["--max_seq_length", "32", "--vocab_size", "100"],
        ["tasks adjective, pronoun, conjunction, interjection: no target in the training data", "no word of its UPOS"],
    ),  # fmt: skip
    (
        "multimae",
        ["--image_folder", "{images}/plain", *FOLDER, "--max_depth", "0.1"],
        ["modality depth: no target in the training data (no valid depth pixel: none is within (0, 0.1] metres"],
    ),  # fmt: skip
    (
        "multimae",
        ["--image_folder", "{images}/far_held_out", *FOLDER, "--max_depth", "6"],
        ["modality depth: no target in the held-out data (no valid depth pixel"],
    ),  # fmt: skip
    (
        "multimae",
        ["--image_folder", "{images}/unlabelled", *FOLDER, "--do_reduce_labels", "true"],
        ["modality semseg: no target in the training data (no labelled pixel", "after --do_reduce_labels"],
    ),  # fmt: skip
    (
        "multimae",
        ["--image_folder", "{images}/no_training_depth", *FOLDER, "--unmatched", "partial"],
        ["modality depth: no target in the training data (no example has the modality (--unmatched partial))"],
    ),  # fmt: skip
    (
        "finetune-dense",
        [*DENSE, "{images}/unlabelled", "--do_reduce_labels", "true"],
        ["task semseg: no target in the training data (no labelled pixel", "after --do_reduce_labels"],
    ),  # fmt: skip
    (
        "finetune-dense",
        [*DENSE, "{images}/far_held_out", "--task", "depth", "--max_depth", "6"],
        ["task depth: no target in the held-out data (no valid depth pixel: none within [0.001, 6] metres"],
    ),  # fmt: skip
    # item 4: late tracebacks become start-up checks
    (
        "finetune-dense",
        ["--task", "depth", "--min_depth", "2", "--max_depth", "1"],
        ["--max_depth 1 must exceed --min_depth 2"],
    ),  # fmt: skip
    (
        "causal-lm",
        [*TWO_DOMAINS, "--domain_weights", "{tmp}/overflow.json"],
        ["--domain_weights", "overflow.json: the weights' sum overflows"],
    ),  # fmt: skip
    (
        "causal-lm",
        [*TWO_DOMAINS, "--task_sampling", "fixed", "--task_sampling_weights", "web=1e308", "mail=1e308"],
        ["task_sampling_weights: the weights' sum overflows"],
    ),  # the draws normalise by the sum: every sequence would be drawn from mail
    # item 5: values that mean nothing are refused like their siblings
    ("causal-lm", [*TWO_DOMAINS, "--domain_weights", "{tmp}/strings.json"], ["the weight of 'web' is '0.5'"]),
    ("causal-lm", [*TWO_DOMAINS, "--domain_weights", "{tmp}/booleans.json"], ["the weight of 'web' is True"]),
    ("pos-mlm", ["--reference_losses", *"123456789"], ["reference_losses: only used with loss_normalization='excess'"]),
    (
        "pos-mlm",
        ["--loss_normalization", "relative", "--reference_losses", *"123456789"],
        ["reference_losses: only used with loss_normalization='excess' (this run has 'relative')"],
    ),  # fmt: skip
    ("pos-mlm", ["--alpha_auto_k", "10"], ["alpha_auto_k 10 exceeds the 9 tasks"]),
    (
        "causal-lm",
        ["--streaming", "true", *TWO_DOMAINS, "--tokenizer_name", str(MINILM), "--validation_split_percentage", "10"],
        ["--validation_split_percentage: not used with --streaming"],
    ),  # fmt: skip
    (
        "causal-lm",
        ["--model_name_or_path", "{mmae}", "--model_size", "mini"],
        ["--model_size: from-scratch options, unused with --model_name_or_path"],
    ),  # fmt: skip
    (
        "pos-mlm",
        ["--model_name_or_path", str(MINILM), "--vocab_size", "100", "--model_size", "small"],
        ["--model_size, --vocab_size: from-scratch options, unused with a checkpoint"],
    ),  # fmt: skip
    (
        "multimae",
        ["--model_name_or_path", "{mmae}", "--patch_size", "8"],
        ["--patch_size: from-scratch options, unused with --model_name_or_path"],
    ),  # fmt: skip
    # item 7: NYUv2's raw labels (0 = unlabelled, 1..K) without --do_reduce_labels: the hint names it first
    (
        "finetune-dense",
        [*DENSE, "{images}/raw_labels"],
        ["class id 3 outside 0..2: if 0 marks unlabelled pixels", "pass --do_reduce_labels true", "otherwise raise"],
    ),  # fmt: skip
    (
        "multimae",
        ["--image_folder", "{images}/raw_labels", *FOLDER],
        ["class id 3 outside 0..2", "pass --do_reduce_labels true (do_reduce_labels=True); otherwise raise"],
    ),  # fmt: skip
    # export-vit
    ("export-vit", [str(MINILM), "{tmp}/vit"], ["checkpoint", "is not an MM-MAE checkpoint"]),
    ("export-vit", ["{mmae}", "{tmp}/file.txt"], ["output_dir", "is a file"]),
    ("export-vit", ["{mmae}", "{tmp}/vit", "--modality", "foo"], ["--modality foo", "pixel modalities are rgb, depth"]),
    ("export-vit", ["{mmae}", "{tmp}/vit", "--modality", "semseg"], ["--modality semseg"]),
    ("export-vit", ["{tmp}/no-model", "{tmp}/vit"], ["checkpoint", "no such checkpoint directory"]),
    ("export-vit", ["{mmae}"], ["output_dir"]),
    # publish
    ("publish", [str(MINILM), "--repo-id", "a/b/c"], ["--repo-id", "a/b/c"]),
    ("publish", ["{tmp}/missing", "--repo-id", "user/model"], ["output_dir", "does not exist"]),
    ("publish", ["{tmp}/file.txt", "--repo-id", "user/model"], ["output_dir", "is not a directory"]),
    ("publish", ["{out}", "--repo-id", "user/model"], ["output_dir", "does not contain a saved model"]),
    ("publish", [str(MINILM)], ["--repo-id"]),
]


def _tiny_tokenizer():
    return AutoTokenizer.from_pretrained(MINILM)


class NoLogits(torch.nn.Module):
    """A model returning hidden states but no ``logits``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 8)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return {"last_hidden_state": self.embed(input_ids)}


def _one_step(tmp: Path, change: Callable[[dict], dict], model: torch.nn.Module | None = None) -> torch.Tensor:
    """The loss of one training step of a tiny BERT (or ``model``) on pre-masked examples changed by ``change``; the
    trainer (which creates its output directory when built) writes beside ``tmp``."""
    trainer = MinimaxTrainer(model=model or tiny_bert(), args=one_step_args(str(tmp.parent / "trainer"), TASKS))
    trainer.model.train()
    samples, _ = trainer.get_batch_samples(iter([change(masked_examples(4))]), 1, torch.device("cpu"))
    trainer.current_gradient_accumulation_steps = 1
    return trainer.compute_loss(trainer.model, dict(samples[0]))


def _task_one_as(value: int, column: str) -> Callable[[dict], dict]:
    """Set ``column`` to ``value`` at the targets of task 1."""
    return lambda batch: {**batch, column: torch.where(batch["task_ids"] == 1, value, batch[column])}


# (name, construction, exception type, fragment of its message)
API_CASES: list[tuple[str, Callable[[Path], object], type[Exception], str]] = [
    (
        "alpha inf",
        lambda tmp: MinimaxTrainingArguments(str(tmp), task_names=["a"], alpha=math.inf),
        ValueError,
        "alpha must be a finite number > 0",
    ),  # fmt: skip
    (
        "reference nan",
        lambda tmp: MinimaxTrainingArguments(
            str(tmp), task_names=["a", "b"], loss_normalization="excess", reference_losses=[1.0, math.nan]
        ),
        ValueError,
        "reference_losses must be a finite number",
    ),  # fmt: skip
    (
        "batch 0",
        lambda tmp: MinimaxTrainingArguments(str(tmp), task_names=["a"], per_device_train_batch_size=0),
        ValueError,
        "per_device_train_batch_size must be a positive integer",
    ),  # fmt: skip
    (
        "accumulation 0",
        lambda tmp: MinimaxTrainingArguments(str(tmp), task_names=["a"], gradient_accumulation_steps=0),
        ValueError,
        "gradient_accumulation_steps",
    ),  # fmt: skip
    (
        "lr nan",
        lambda tmp: MinimaxTrainingArguments(str(tmp), task_names=["a"], learning_rate=math.nan),
        ValueError,
        "learning_rate must be a finite number",
    ),  # fmt: skip
    (
        "causal lm chunk size -8",
        lambda tmp: MinimaxTrainingArguments(str(tmp), task_names=["a"], causal_lm_chunk_size=-8),
        ValueError,
        "causal_lm_chunk_size must be >= 0",
    ),  # fmt: skip
    ("lora r 0", lambda tmp: LoraArguments(lora_r=0), ValueError, "lora_r must be a positive integer"),
    ("lora dropout", lambda tmp: LoraArguments(lora_dropout=math.inf), ValueError, "lora_dropout must be a finite"),
    ("weighting nan", lambda tmp: build_weighting("minimax", 3, alpha=math.nan), ValueError, "alpha must be a finite"),
    ("dro inf", lambda tmp: build_weighting("group_dro", 3, dro_step_size=math.inf), ValueError, "dro_step_size"),
    ("ema nan", lambda tmp: build_weighting("minimax", 3, loss_ema=math.nan), ValueError, "loss_ema"),
    (
        "mlm collator nan",
        lambda tmp: TaskGroupedMLMCollator(_tiny_tokenizer(), mlm_probability=math.nan),
        ValueError,
        "mlm_probability",
    ),  # fmt: skip
    (
        "vision collator",
        lambda tmp: ModalityMaskCollator(num_visible_tokens=0, patch_size=4),
        ValueError,
        "num_visible_tokens",
    ),  # fmt: skip
    (
        "vision collator nan",
        lambda tmp: ModalityMaskCollator(num_visible_tokens=4, patch_size=4, alpha=math.nan),
        ValueError,
        "alpha must be > 0",
    ),  # fmt: skip
    ("processor depth", lambda tmp: MultiMAEImageProcessor(depth_scale=math.inf), ValueError, "depth_scale"),
    ("processor std", lambda tmp: MultiMAEImageProcessor(image_std=[1.0, math.nan, 1.0]), ValueError, "image_std"),
    ("processor flip", lambda tmp: MultiMAEImageProcessor(flip_probability=2.0), ValueError, "flip_probability"),
    # issue 29 items 5 and 6
    (
        "task id -1",
        lambda tmp: _one_step(tmp, _task_one_as(-1, "task_ids")),
        ValueError,
        "task_ids: a labelled element has a negative task id other than -100",
    ),  # fmt: skip
    (
        "label = vocabulary size",
        lambda tmp: _one_step(tmp, _task_one_as(VOCAB, "labels")),
        ValueError,
        f"labels: a target's class id is outside 0..{VOCAB - 1}",
    ),  # fmt: skip
    (
        "model without logits",
        lambda tmp: _one_step(tmp, lambda batch: batch, NoLogits()),
        ValueError,
        "NoLogits returned no `logits` (its outputs: ['last_hidden_state'])",
    ),  # fmt: skip
    (
        "task_names a string",
        lambda tmp: MinimaxTrainingArguments(str(tmp), task_names="verb"),
        ValueError,
        "task_names must be a sequence of strings",
    ),  # fmt: skip
    (
        "task_names numbers",
        lambda tmp: MinimaxTrainingArguments(str(tmp), task_names=[1, 2]),
        ValueError,
        "task_names must be a sequence of strings",
    ),  # fmt: skip
    (
        "reference losses, raw",
        lambda tmp: MinimaxTrainingArguments(str(tmp), task_names=["a", "b"], reference_losses=[1.0, 2.0]),
        ValueError,
        "reference_losses: only used with loss_normalization='excess' (this run has 'raw')",
    ),  # fmt: skip
    (
        "alpha_auto_k above T",
        lambda tmp: MinimaxTrainingArguments(str(tmp), task_names=["a", "b"], alpha_auto_k=2.5),
        ValueError,
        "alpha_auto_k 2.5 exceeds the 2 tasks",
    ),  # fmt: skip
    # issue 39: the Python API
    (
        "task_names None",
        lambda tmp: MinimaxTrainingArguments(str(tmp), task_names=None),
        ValueError,
        "task_names must be a sequence of strings, e.g. ['verb', 'noun'], got None",
    ),  # fmt: skip
    (
        "float task ids",
        lambda tmp: _one_step(tmp, lambda batch: {**batch, "task_ids": batch["task_ids"].float()}),
        ValueError,
        "task_ids must be integers (0..2, or -100), got torch.float32",
    ),  # fmt: skip
    (
        "decoder label = vocabulary size",
        lambda tmp: _decoder_trainer(
            tmp, lambda ex: {**ex, "labels": ex["labels"].where(ex["labels"] < 0, DECODER_VOCAB)}
        ).train(),
        ValueError,
        f"labels: a target's class id is outside 0..{DECODER_VOCAB - 1}",
    ),  # fmt: skip
    (
        "every label -100",
        lambda tmp: _decoder_trainer(tmp, lambda ex: {**ex, "labels": torch.full_like(ex["labels"], -100)}),
        ValueError,
        "labels: every label of the training data is -100 (ignored): there is nothing to train on",
    ),  # fmt: skip
    (
        "importance weight 0",
        lambda tmp: MinimaxTrainingArguments(
            str(tmp), task_sampling="fixed", task_sampling_weights=[0, 1, 1], importance_weighting=True
        ),
        ValueError,
        "task_sampling_weights: importance weighting draws every task, but task 0: 0 (normalised) is below",
    ),  # fmt: skip
    (
        "importance weight 1e-30",
        lambda tmp: MinimaxTrainingArguments(
            str(tmp),
            task_names=TASKS,
            task_sampling="fixed",
            task_sampling_weights=[1e-30, 1, 1],
            importance_weighting=True,
        ),
        ValueError,
        "but verb: 5e-31 (normalised) is below 0.000333 = 0.001 / 3 tasks",
    ),  # fmt: skip
    (
        "online proportional",
        lambda tmp: MinimaxTrainingArguments(str(tmp), task_sampling="online", weighting="proportional"),
        ValueError,
        "weighting='proportional' cannot drive task sampling: its weights are the batch's own task shares",
    ),  # fmt: skip
]


def _decoder_trainer(tmp: Path, change: Callable[[dict], dict]) -> MinimaxTrainer:
    """A tiny decoder's trainer (2 steps) on domain examples changed by ``change``, writing beside ``tmp``."""
    from tiny_causal_lm import domain_examples, make_args, tiny_llama
    from tiny_training import as_dataset

    args = make_args(str(tmp.parent / "trainer"), max_steps=2, per_device_train_batch_size=4)
    return MinimaxTrainer(model=tiny_llama(), args=args, train_dataset=as_dataset(change(domain_examples(12))))


@pytest.fixture(scope="module")
def mmae_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("mmae")
    MultiMAEForPreTraining(tiny_config()).save_pretrained(folder)
    return folder


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """The files the cases name; the output directory holds a user's file."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    (tmp_path / "file.txt").write_text("a file, not a directory\n")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text("\n" * 4)
    for name, weights in (("overflow", 1e308), ("strings", "0.5"), ("booleans", True)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"weights": {"web": weights, "mail": weights}}))
    (tmp_path / "binary.txt").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not parquet at all")
    (tmp_path / "typo.yaml").write_text("max_stepz: 3\n")
    (tmp_path / "weights.json").write_text('{"weights": {"news": 1.0}}')
    (tmp_path / "zero.json").write_text('{"weights": {"web": 0, "mail": 1}}')
    (tmp_path / "two.json").write_text('{"weights": {"web": 1, "mail": 1}}')
    (tmp_path / "ds.json").write_text('{"train_batch_size": "auto"}')
    (tmp_path / "train.txt").write_text("The cat sat on the mat .\nDogs run quickly in the park .\n" * 12)
    (tmp_path / "reference").mkdir()  # a finished run of other tasks than the demo's
    other_tasks = {"tasks": ["verb", "noun", "numeral"], "eval_task_loss": {"verb": 1.0, "noun": 2.0, "numeral": 3.0}}
    (tmp_path / "reference" / "task_report.json").write_text(json.dumps(other_tasks))
    return tmp_path


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def _fill(token: str, tmp: Path, mmae: Path, images: Path | None = None) -> str:
    return token.format(tmp=tmp, out=tmp / "out", mmae=mmae, images=images)


def _write_frames(split_dir: Path, depth_mm: int, classes: tuple[int, int], with_depth: bool = True) -> None:
    """Two 16x16 frames: random rgb, depth of ``depth_mm`` (16-bit PNG, mm), semseg ids in ``classes`` (min, max)."""
    rng = np.random.default_rng(0)
    for modality in ("rgb", "depth", "semseg"):
        (split_dir / modality).mkdir(parents=True, exist_ok=True)  # an empty depth/ folder: no frame has depth
    for stem in ("f0", "f1"):
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(split_dir / "rgb" / f"{stem}.png")
        if with_depth:
            Image.fromarray(np.full((16, 16), depth_mm, np.uint16)).save(split_dir / "depth" / f"{stem}.png")
        semseg = rng.integers(classes[0], classes[1] + 1, (16, 16), dtype=np.uint8)
        Image.fromarray(semseg).save(split_dir / "semseg" / f"{stem}.png")


@pytest.fixture(scope="module")
def image_folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``plain`` (depth 2 m, classes 0..2), ``far_held_out`` (held-out depth 7 m), ``unlabelled`` (semseg all 0),
    ``raw_labels`` (classes 1..3, NYUv2 style), ``no_training_depth`` (no training frame has depth); train and test."""
    root = tmp_path_factory.mktemp("images")
    layouts = {
        "plain": ((2000, (0, 2), True), (2000, (0, 2), True)),
        "far_held_out": ((2000, (0, 2), True), (7000, (0, 2), True)),
        "unlabelled": ((2000, (0, 0), True), (2000, (0, 0), True)),
        "raw_labels": ((2000, (1, 3), True), (2000, (1, 3), True)),
        "no_training_depth": ((2000, (0, 2), False), (2000, (0, 2), True)),
    }
    for name, (train, test) in layouts.items():
        _write_frames(root / name / "train", *train)
        _write_frames(root / name / "test", *test)
    return root


@pytest.mark.parametrize(
    ("script", "options", "fragments"),
    CONSOLE_CASES,
    ids=[f"{script}:{' '.join(options)[:60]}" for script, options, _ in CONSOLE_CASES],
)
def test_console_refuses_bad_input(
    script: str,
    options: list[str],
    fragments: list[str],
    workspace: Path,
    mmae_checkpoint: Path,
    image_folders: Path,
    capsys,
    monkeypatch,
) -> None:
    main, prog, base = SCRIPTS[script]

    def no_run(command, **kwargs):
        raise AssertionError(f"a run was started: {command}")

    monkeypatch.setattr(compare.subprocess, "run", no_run)
    argv = [_fill(token, workspace, mmae_checkpoint, image_folders) for token in [*base, *options]]
    before = snapshot(workspace)
    capsys.readouterr()
    status = main(argv)
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err, err
    lines = err.rstrip("\n").split("\n")
    first = next(i for i, line in enumerate(lines) if line.startswith(f"{prog}: error: "))
    message = lines[first:]
    assert 1 <= len(message) <= 3 and all(line.startswith(f"{prog}: error: ") for line in message), err
    text = " ".join(message)
    for fragment in fragments:
        assert _fill(fragment, workspace, mmae_checkpoint) in text, (fragment, text)
    assert snapshot(workspace) == before


@pytest.mark.parametrize(("name", "build", "error", "fragment"), API_CASES, ids=[case[0] for case in API_CASES])
def test_api_objects_refuse_bad_values(
    name: str, build: Callable[[Path], object], error: type[Exception], fragment: str, tmp_path: Path
) -> None:
    with pytest.raises(error, match=re.escape(fragment)):
        build(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_matrix_is_large_enough() -> None:
    scripts = {script for script, _, _ in CONSOLE_CASES}
    assert scripts == set(SCRIPTS)
    assert len(CONSOLE_CASES) + len(API_CASES) >= 80


# ----------------------------------------------------------------------------- issue 29: warnings, quiet refusals
def test_a_worst_case_over_one_task_warns(tmp_path: Path, caplog) -> None:
    """One task (or domain) under a worst-case strategy is plain training: a warning line says so; the plain mean
    over one task needs none."""
    with caplog.at_level(logging.WARNING, logger="robust_pretrain.trainer.training_args"):
        MinimaxTrainingArguments(str(tmp_path / "out"), task_names=["web"], weighting="minimax")
    assert "task_names ['web']: one task, so weighting='minimax' has no other task" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="robust_pretrain.trainer.training_args"):
        MinimaxTrainingArguments(str(tmp_path / "out"), task_names=["web"], weighting="average")
        MinimaxTrainingArguments(str(tmp_path / "out"), task_names=["web", "mail"], weighting="minimax")
    assert "one task" not in caplog.text


def test_the_one_task_warning_is_said_once_and_a_task_without_data_warns(tmp_path: Path, caplog) -> None:
    """The arguments bound again to the same task (as recipe and trainer do) warn once; a trainer whose training data
    has no example of a task warns, naming it, and trains on (it has weight 0)."""
    from tiny_causal_lm import domain_examples, make_args, tiny_llama
    from tiny_training import as_dataset

    with caplog.at_level(logging.WARNING):
        args = MinimaxTrainingArguments(str(tmp_path / "out"), task_names=["web"], weighting="minimax")
        args.bind_tasks(["web"])
        args.bind_tasks(["web"])
    assert caplog.text.count("one task, so weighting='minimax'") == 1
    caplog.clear()
    examples = domain_examples(12)
    examples["task_ids"] = examples["task_ids"] % 2  # no example of the third domain, web
    with caplog.at_level(logging.WARNING, logger="robust_pretrain.trainer"):
        MinimaxTrainer(model=tiny_llama(), args=make_args(str(tmp_path / "run")), train_dataset=as_dataset(examples))
    assert "task(s) web: no example in the training data (task_ids): they train at weight 0" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="robust_pretrain.trainer"):
        examples["task_ids"] = domain_examples(12)["task_ids"]
        MinimaxTrainer(model=tiny_llama(), args=make_args(str(tmp_path / "all")), train_dataset=as_dataset(examples))
    assert "no example in the training data" not in caplog.text


def test_fine_tuning_without_the_label_reduction_of_pretraining_warns(tmp_path: Path, caplog) -> None:
    """A checkpoint whose saved image processor reduced the labels (0 = unlabelled): a semseg fine-tuning without
    --do_reduce_labels is warned; with it, or for another task, or a checkpoint without reduction, nothing is said."""
    reduced, plain = tmp_path / "reduced", tmp_path / "plain"
    MultiMAEImageProcessor(do_reduce_labels=True).save_pretrained(reduced)
    MultiMAEImageProcessor().save_pretrained(plain)
    with caplog.at_level(logging.WARNING, logger="robust_pretrain.vision.finetune.recipe"):
        dense_finetune.warn_reduced_labels(str(reduced), "semseg", do_reduce_labels=False)
    assert f"{reduced} was pre-trained with --do_reduce_labels (0 = unlabelled)" in caplog.text
    assert "pass --do_reduce_labels true" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="robust_pretrain.vision.finetune.recipe"):
        dense_finetune.warn_reduced_labels(str(reduced), "semseg", do_reduce_labels=True)
        dense_finetune.warn_reduced_labels(str(reduced), "depth", do_reduce_labels=False)
        dense_finetune.warn_reduced_labels(str(plain), "semseg", do_reduce_labels=False)
    assert caplog.text == ""


def test_a_full_disk_while_saving_is_one_line(workspace: Path, capsys, monkeypatch) -> None:
    """safetensors' error for a full disk during training or saving: one line naming --output_dir, exit status 2."""
    from safetensors import SafetensorError

    def full_disk(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(MinimaxTrainer, "train", full_disk)
    out = workspace / "run"
    domains = [token.format(tmp=workspace) for token in TWO_DOMAINS]
    status = causal_lm.main(["--config", "decoder_demo", "--output_dir", str(out), *domains])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err, err
    message = [line for line in err.splitlines() if line.startswith("robust-pretrain-causal-lm: error: ")]
    assert len(message) == 1 and f"no space left on the device of --output_dir {out} while saving" in message[0]
    assert "rerun the same command: it resumes from the last complete checkpoint" in message[0]


def test_a_full_disk_while_fine_tuning_is_one_line_that_says_the_run_starts_over(
    workspace: Path, mmae_checkpoint: Path, image_folders: Path, capsys, monkeypatch
) -> None:
    """Fine-tuning does not resume: the same line, saying a rerun starts over."""
    from safetensors import SafetensorError
    from transformers import Trainer

    def full_disk(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(Trainer, "train", full_disk)
    out = workspace / "dense"
    argv = ["--model_name_or_path", str(mmae_checkpoint), "--task", "semseg", "--output_dir", str(out)]
    status = dense_finetune.main([*argv, *DENSE, str(image_folders / "plain")])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err, err
    message = [line for line in err.splitlines() if line.startswith("robust-pretrain-finetune-dense: error: ")]
    assert len(message) == 1 and f"no space left on the device of --output_dir {out} while saving" in message[0]
    assert "rerun the same command: the run starts over (" in message[0]


@pytest.mark.parametrize(
    ("module", "options", "fragment"),
    [
        ("pos_mlm", ["--config", "demo", "--train_file", "{tmp}/foreign.txt"], "contains no word of the tasks"),
        ("causal_lm", ["--config", "decoder_demo", *TWO_DOMAINS[:2], "blank={tmp}/blank.txt"], "domain blank"),
        (
            "pos_mlm",
            ["--config", "demo", "--loss_normalization", "excess", "--reference_model", "{tmp}/untokenized"],
            "untokenized: records no tokenizer",
        ),
    ],
    ids=["non-English text", "blank domain", "reference model without tokenizer"],
)
def test_a_refusal_after_data_loading_is_all_of_stderr(module: str, options: list[str], fragment: str, workspace):
    """In a fresh process (the console's own logging), a refusal after the data are loaded and tokenised is all of
    stderr, one line: no progress bars or caching chatter of ``datasets``, no model or tokenizer log of
    ``transformers`` (issue 39: the model is built after the data's checks, and transformers says only warnings until
    the trainer is built)."""
    (workspace / "foreign.txt").write_text("Съешь же ещё этих мягких французских булок да выпей чаю .\n" * 40)
    (workspace / "untokenized").mkdir()
    (workspace / "untokenized" / "config.json").write_text('{"model_type": "bert", "vocab_size": 8000}')
    argv = [_fill(token, workspace, workspace) for token in [*options, "--output_dir", "{tmp}/run", "--max_steps", "1"]]
    code = f"import sys; from robust_pretrain.pretraining.{module} import recipe; sys.exit(recipe.main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=checkout_env())
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    errors = [line for line in lines if line.startswith("robust-pretrain-")]
    assert len(errors) == 1 and errors == lines and fragment in errors[0], done.stderr
    noise = ("examples/s", "Generating train split", "Caching", "Downloading", "custom data configuration")
    assert not [line for line in lines if any(word in line for word in noise)], done.stderr


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        (["--task_sampling", "fixed", "--task_sampling_weights", "web=1", "news=1"], "no task named ['news']"),
        (["--task_sampling", "fixed", "--task_sampling_weights", "=1", "web=1"], "no task named ['']"),
        (["--task_sampling", "fixed", "--task_sampling_weights", "1", "2", "3"], "one weight per task (2"),
        (["--domain_weights", "{tmp}/weights.json"], "unknown domain(s) ['news'], missing domain(s) ['web', 'mail']"),
    ],
)
def test_weights_naming_other_domains_than_domain_files_are_refused_before_reading(
    options: list[str], fragment: str, workspace: Path, monkeypatch, capsys
) -> None:
    """``--domain_files`` names the domains: weights by other names are refused before any data is read."""

    def no_reading(*args, **kwargs):
        raise AssertionError("the data was read")

    monkeypatch.setattr(causal_lm, "load_domain_texts", no_reading)
    main, prog, base = SCRIPTS["causal-lm"]
    argv = [_fill(token, workspace, None, None) for token in [*base, *TWO_DOMAINS, *options]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{prog}: error: ") and len(err.strip().splitlines()) == 1 and fragment in err, err
