"""The weighting state in :class:`~robust_pretrain.trainer.MinimaxTrainer`'s checkpoints: ``weighting_state.json``
beside each saved model (the strategy's state, its options, the step's weights), restored and checked on resume."""

from __future__ import annotations

import json
import os

import torch
from transformers.trainer_utils import get_last_checkpoint
from transformers.utils import logging

logger = logging.get_logger(__package__)  # the trainer's one logger, robust_pretrain.trainer

WEIGHTING_STATE_NAME = "weighting_state.json"


class WeightingCheckpoints:
    """``MinimaxTrainer``'s checkpoint side, mixed into it: the ``save_model`` and ``train`` hooks write and restore
    the weighting state. Reads the trainer's ``task_names``, ``weighting``, ``step_weights`` and, under
    ``weight_update='simultaneous'``, the last step's observation the next step's weights come from."""

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the model as the Trainer does, plus ``weighting_state.json`` (the strategy's state, JSON).

        Under FSDP with sharded checkpoints (``SHARDED_STATE_DICT``) the Trainer writes no model outside
        checkpoints; a direct call (the final model) gathers the full weights into ``model.safetensors`` instead.
        """
        plugin = self.accelerator.state.fsdp_plugin if self.is_fsdp_enabled else None
        sharded = plugin is not None and "SHARDED" in str(plugin.state_dict_type)
        if sharded and not _internal_call:
            plugin.set_state_dict_type("FULL_STATE_DICT")
            try:
                super().save_model(output_dir, _internal_call)
            finally:
                plugin.set_state_dict_type("SHARDED_STATE_DICT")
        else:
            super().save_model(output_dir, _internal_call)
        if self.args.should_save:
            directory = output_dir or self.args.output_dir
            os.makedirs(directory, exist_ok=True)  # sharded FSDP checkpoints: the model files come later
            path = os.path.join(directory, WEIGHTING_STATE_NAME)
            state = {
                "task_names": self.task_names,
                "weighting": self.args.weighting,
                "options": self.weighting.options(),
                "step_weights": self.step_weights.tolist(),
                "state": self.weighting.state_dict(),
            }
            if self._previous_observation is not None:  # weight_update='simultaneous': the next step's weights' input
                state["previous_observation"] = self._previous_observation.tolist()
            with open(path, "w") as f:
                json.dump(state, f, indent=1)

    def load_weighting_state(self, checkpoint_dir: str) -> None:
        """Restore the strategy's state from a checkpoint written by :meth:`save_model`."""
        path = os.path.join(checkpoint_dir, WEIGHTING_STATE_NAME)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path} is missing: {checkpoint_dir} was not written by MinimaxTrainer")
        with open(path) as f:
            state = json.load(f)
        if state["task_names"] != self.task_names:
            raise ValueError(f"checkpoint tasks {state['task_names']} differ from task_names {self.task_names}")
        saved, current = state.get("options"), self.weighting.options()
        if saved is None:
            logger.warning(f"{path} predates saved weighting options: cannot check that this run uses the same ones")
        elif saved != current:
            differ = [name for name in dict.fromkeys([*current, *saved]) if saved.get(name) != current.get(name)]
            raise ValueError(
                f"{checkpoint_dir} was trained with "
                + ", ".join(f"{name}={saved.get(name)!r}" for name in differ)
                + "; this run has "
                + ", ".join(f"{name}={current.get(name)!r}" for name in differ)
                + ": resume with the checkpoint's weighting options, or train into a new output_dir"
            )
        self.weighting.load_state_dict(state["state"])
        self.step_weights = torch.tensor(state["step_weights"])
        previous = state.get("previous_observation")
        self._previous_observation = None if previous is None else torch.tensor(previous, device=self.args.device)

    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        trial=None,
        ignore_keys_for_eval: list[str] | None = None,
    ):
        """``Trainer.train``; when resuming, the weighting state is restored from the checkpoint first."""
        checkpoint = resume_from_checkpoint
        if checkpoint is True:
            checkpoint = get_last_checkpoint(self.args.output_dir)
        if isinstance(checkpoint, str):
            self.load_weighting_state(checkpoint)
        return super().train(resume_from_checkpoint, trial, ignore_keys_for_eval)
