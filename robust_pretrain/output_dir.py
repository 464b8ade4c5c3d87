"""One output-directory policy for every recipe.

* ``--output_dir`` must be a directory or creatable, and writable (checked with the other options, before any work).
* A pre-training run resumes: :func:`resume_or_refuse` continues the run an ``output_dir`` holds when its settings
  (``run_config.json``) are the same, extends it when only ``max_steps`` grew, and refuses anything else, naming each
  difference. ``run_config.json`` binds only once the run saved something (a checkpoint or a model): an attempt that
  failed or was refused before that does not block its corrected rerun.
* A fine-tuning run does not resume: :func:`claim_for_new_run` refuses an ``output_dir`` holding files unless
  ``--overwrite_output_dir``, and then deletes only what an earlier run wrote (checkpoints, weights, predictions).
* Nothing else in the directory is ever deleted or overwritten: a user's own files stay.
"""

from __future__ import annotations

import errno
import json
import logging
import re
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from transformers import TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from robust_pretrain.cli import UsageError
from robust_pretrain.reporting import TASK_REPORT_NAME

logger = logging.getLogger(__name__)

RUN_CONFIG_NAME = "run_config.json"
# Files a pre-training run leaves in output_dir once it has saved something.
RUN_OUTPUTS = ("config.json", "model.safetensors", "adapter_config.json", TASK_REPORT_NAME, "trainer_state.json")
# What an earlier fine-tuning run leaves that must not survive beside a new model (the rest is overwritten file by
# file).
FINETUNING_OUTPUTS = ("checkpoint-*", "*.safetensors", "model.safetensors.index.json", "adapter_config.json", "*.bin")


def last_complete_checkpoint(output_dir: str | Path) -> str | None:
    """The newest ``checkpoint-N`` with ``trainer_state.json`` (written last): a run killed while saving leaves a
    partial checkpoint, which the Trainer cannot resume from."""
    checkpoints = {}
    for path in Path(output_dir).iterdir():
        match = re.fullmatch(r"checkpoint-(\d+)", path.name)
        if match and path.is_dir():
            checkpoints[int(match.group(1))] = path
    for step in sorted(checkpoints, reverse=True):
        if (checkpoints[step] / "trainer_state.json").is_file():
            return str(checkpoints[step])
        logger.warning("skipping %s: incomplete (no trainer_state.json), interrupted while saving", checkpoints[step])
    return None


def _differences(previous: dict[str, Any], current: dict[str, Any]) -> list[str]:
    keys = [k for k in {**previous, **current} if k != "max_steps" and previous.get(k) != current.get(k)]
    return [f"{k}: {previous.get(k)!r} -> {current.get(k)!r}" for k in keys]


def _saved_outputs(output_dir: Path) -> list[str]:
    """What a run saved in ``output_dir``: its final files and checkpoints."""
    last = get_last_checkpoint(str(output_dir))
    return [name for name in RUN_OUTPUTS if (output_dir / name).exists()] + ([Path(last).name] if last else [])


def checkpoint_to_resume(output_dir: str | Path, current: dict[str, Any], overwrite: bool) -> str | None:
    """The checkpoint to resume from, or None (a fresh run). Refuses, before anything trains, an output_dir that holds
    another run: one whose saved settings (``run_config.json``) differ from ``current`` (each difference is named), a
    smaller ``max_steps``, a run that is already complete, or checkpoints and models this recipe did not write.
    A larger ``max_steps`` extends the run from its last checkpoint."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir() or overwrite:
        return None
    saved = output_dir / RUN_CONFIG_NAME
    found = _saved_outputs(output_dir)
    if not saved.is_file():
        if found:
            raise UsageError(
                f"--output_dir {output_dir} holds {', '.join(found)} of a run this recipe did not start; choose "
                "another --output_dir or pass --overwrite_output_dir true (which deletes its checkpoints)"
            )
        return None
    if not found:  # an attempt that failed before saving anything: its settings bind nothing
        logger.info("%s: an earlier attempt saved no checkpoint; starting afresh with this run's settings", saved)
        return None
    previous = json.loads(saved.read_text())
    differences = _differences(previous, current)
    old_steps, new_steps = previous.get("max_steps"), current.get("max_steps")
    if old_steps != new_steps and not (isinstance(old_steps, int) and isinstance(new_steps, int) and old_steps > 0):
        differences.append(f"max_steps: {old_steps!r} -> {new_steps!r}")
    if differences:
        raise UsageError(
            f"--output_dir {output_dir} holds a run with other settings ({'; '.join(differences)}); resuming it would "
            "mix two runs. Choose another --output_dir, or pass --overwrite_output_dir true to start afresh there."
        )
    checkpoint = last_complete_checkpoint(output_dir)
    done = int(Path(checkpoint).name.split("-")[1]) if checkpoint else 0
    if new_steps > 0 and new_steps < old_steps:
        raise UsageError(
            f"--max_steps {new_steps} is smaller than the {old_steps} steps of the run in --output_dir {output_dir}; "
            "a run can be extended, not shortened. Choose another --output_dir or pass --overwrite_output_dir true."
        )
    if new_steps > old_steps:
        logger.warning(
            "Extending the run in %s from max_steps %d to %d (resuming at step %d; the learning-rate schedule now "
            "ends at step %d)",
            output_dir,
            old_steps,
            new_steps,
            done,
            new_steps,
        )
    elif checkpoint is not None and (output_dir / TASK_REPORT_NAME).is_file() and done >= new_steps > 0:
        raise UsageError(
            f"the run in --output_dir {output_dir} is complete ({done} steps): nothing to train. Pass a larger "
            "--max_steps to extend it, another --output_dir, or --overwrite_output_dir true to start afresh."
        )
    return checkpoint


def resume_or_refuse(training_args: TrainingArguments, current: dict[str, Any], overwrite: bool) -> str | None:
    """Pre-training: check ``output_dir`` against this run (:func:`checkpoint_to_resume`); with ``overwrite`` delete
    its checkpoints (the main process). The checkpoint to resume from (``--resume_from_checkpoint`` first)."""
    last_checkpoint = checkpoint_to_resume(training_args.output_dir, current, overwrite)
    resume_checkpoint = training_args.resume_from_checkpoint or last_checkpoint
    if resume_checkpoint is not None:
        logger.info("Resuming from checkpoint %s (pass --overwrite_output_dir true to start afresh)", resume_checkpoint)
    if overwrite and Path(training_args.output_dir).is_dir() and training_args.should_save:
        for checkpoint in Path(training_args.output_dir).glob("checkpoint-*"):
            shutil.rmtree(checkpoint)
    return resume_checkpoint


def write_run_config(training_args: TrainingArguments, config: dict[str, Any]) -> None:
    """Save the run's settings (``run_config.json``, main process): what a resume must match once it saved something."""
    if training_args.should_save:
        Path(training_args.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(training_args.output_dir) / RUN_CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")


def claim_for_new_run(
    output_dir: str | Path, overwrite: bool, delete_outputs: bool = True, recipe_outputs: Sequence[str] = ()
) -> None:
    """Fine-tuning: refuse an ``output_dir`` holding files unless ``overwrite``; then (if ``delete_outputs``: the main
    process) delete what an earlier run wrote there (:data:`FINETUNING_OUTPUTS` and the recipe's ``recipe_outputs``
    patterns), which would otherwise remain beside the new model. Other files are kept."""
    path = Path(output_dir)
    existing = sorted(child.name for child in path.iterdir()) if path.is_dir() else []
    if existing and not overwrite:
        shown = ", ".join(existing[:5]) + (", ..." if len(existing) > 5 else "")
        raise UsageError(
            f"--output_dir {path} already holds files of an earlier run ({shown}); choose another --output_dir or "
            "pass --overwrite_output_dir true (deletes its checkpoint-* folders, weights and predictions first)"
        )
    for pattern in (*FINETUNING_OUTPUTS, *recipe_outputs) if existing and delete_outputs else ():
        for earlier in path.glob(pattern):
            shutil.rmtree(earlier) if earlier.is_dir() else earlier.unlink()
    path.mkdir(parents=True, exist_ok=True)


@contextmanager
def disk_full_is_one_line(output_dir: str | Path, resumes: bool = True) -> Iterator[None]:
    """Turn a full disk while saving (an ``OSError`` ENOSPC, or safetensors' ``SafetensorError`` wrapping it) into one
    :class:`UsageError` line: a rerun of the same command resumes from the last complete checkpoint (``resumes``), or
    starts over (a fine-tuning run, which does not resume)."""
    from safetensors import SafetensorError

    try:
        yield
    except (OSError, SafetensorError) as err:
        if getattr(err, "errno", None) != errno.ENOSPC and "No space left on device" not in str(err):
            raise
        raise UsageError(
            f"no space left on the device of --output_dir {output_dir} while saving ({type(err).__name__}); free "
            "space and rerun the same command: "
            + ("it resumes from the last complete checkpoint" if resumes else "the run starts over")
        ) from err
