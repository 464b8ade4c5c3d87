"""Every option is declared once: the weighting and LoRA options have one dataclass each, every other declaration
(recipe dataclasses, ``MinimaxTrainingArguments``, the strategies' constructors) reads it, and every declared default
is itself accepted (issue 23)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from pathlib import Path

import pytest

from robust_pretrain.options import Accepted, LoraArguments, declared, declared_defaults, option_problems
from robust_pretrain.trainer.training_args import MinimaxTrainingArguments
from robust_pretrain.weighting import WEIGHTINGS, Weighting, WeightingArguments, accepted_options

OPTION_MODULES = (
    "robust_pretrain.options",
    "robust_pretrain.trainer.training_args",
    "robust_pretrain.weighting.arguments",
    "robust_pretrain.pretraining.pos_mlm.arguments",
    "robust_pretrain.pretraining.multimae.arguments",
    "robust_pretrain.pretraining.causal_lm.arguments",
    "robust_pretrain.glue.finetune",
    "robust_pretrain.glue.probe",
    "robust_pretrain.vision.finetune.arguments",
    "robust_pretrain.evaluation.suite",
    "robust_pretrain.vision.pseudo_label",
)
# A subclass may give another default where the models differ: ViT's attention projections are not BERT's.
INTENDED_OVERRIDES = {("DenseLoraArguments", "lora_target_modules")}


def option_dataclasses() -> list[type]:
    """Every dataclass of options the console scripts parse."""
    found = []
    for name in OPTION_MODULES:
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if dataclasses.is_dataclass(cls) and cls.__module__ == name and cls not in found:
                found.append(cls)
    return found


def shared_declarations() -> dict[str, dataclasses.Field]:
    return {f.name: f for source in (WeightingArguments, LoraArguments) for f in dataclasses.fields(source)}


def test_every_weighting_and_lora_option_is_declared_once() -> None:
    """A dataclass that has a weighting or LoRA option has the one declared field itself (inherited), not a copy."""
    shared = shared_declarations()
    copies = [
        f"{cls.__name__}.{each.name}"
        for cls in option_dataclasses()
        for each in dataclasses.fields(cls)
        if each.name in shared and each is not shared[each.name] and (cls.__name__, each.name) not in INTENDED_OVERRIDES
    ]
    assert copies == []
    assert len(option_dataclasses()) >= 10


def test_strategy_constructors_take_the_declared_defaults() -> None:
    defaults = declared_defaults(WeightingArguments)
    disagreements = []
    for name, cls in {**WEIGHTINGS, "base": Weighting}.items():
        for parameter in inspect.signature(cls.__init__).parameters.values():
            if parameter.name in defaults and parameter.default != defaults[parameter.name]:
                disagreements.append(f"{name}.{parameter.name}: {parameter.default!r} != {defaults[parameter.name]!r}")
            if parameter.name not in ("self", "num_tasks", "kwargs"):
                assert parameter.name in defaults, f"{name} takes {parameter.name}, which WeightingArguments lacks"
    assert disagreements == []
    assert set(defaults) == set().union(*(accepted_options(name) for name in WEIGHTINGS))


def test_two_declarations_of_one_option_agree() -> None:
    """Wherever a weighting or LoRA option appears (dataclass field or constructor parameter), its default is the
    same: the test that fails when a copy drifts (as lora_dropout 0.05 vs 0.1 once did)."""
    shared = declared_defaults(WeightingArguments) | declared_defaults(LoraArguments)
    seen: dict[str, set[str]] = {}
    for cls in option_dataclasses():
        for name, default in declared_defaults(cls).items():
            if name in shared and (cls.__name__, name) not in INTENDED_OVERRIDES:
                seen.setdefault(name, set()).add(repr(default))
    for cls in (*WEIGHTINGS.values(), Weighting):
        for parameter in inspect.signature(cls.__init__).parameters.values():
            if parameter.name in shared:
                seen.setdefault(parameter.name, set()).add(repr(parameter.default))
    assert {name: values for name, values in seen.items() if len(values) > 1} == {}
    assert LoraArguments().lora_dropout == 0.1  # one value for every recipe (was 0.05 in pos-mlm, 0.1 elsewhere)


@pytest.mark.parametrize("cls", option_dataclasses(), ids=lambda cls: cls.__name__)
def test_every_declared_default_is_accepted(cls: type) -> None:
    defaults = {k: v for k, v in declared_defaults(cls).items() if k != "output_dir"}
    assert option_problems(cls, defaults, check_paths=False) == []


def test_declarations_reach_the_help_and_the_checks(tmp_path: Path) -> None:
    alpha = MinimaxTrainingArguments.__dataclass_fields__["alpha"]
    assert "Accepted: > 0." in alpha.metadata["help"]
    assert declared(MinimaxTrainingArguments)["alpha"] == Accepted(above=0)
    assert declared(MinimaxTrainingArguments)["per_device_train_batch_size"] == Accepted(minimum=1)
    assert option_problems(WeightingArguments, {"alpha": float("inf"), "dwa_window": 0}) == [
        "--alpha must be a finite number > 0, got inf",
        "--dwa_window must be a positive integer, got 0",
    ]
    args = MinimaxTrainingArguments(str(tmp_path), task_names=["a"])
    assert args.output_dir == str(tmp_path)  # output_dir stays the first positional field
    expected = {"alpha": 1.0, "alpha_schedule": "constant", "alpha_auto": False, "alpha_auto_k": None}
    expected |= {"weight_floor": 0.0, "loss_ema": 0.0}
    expected |= {"loss_normalization": "raw", "reference_losses": None, "reference_model": None}
    expected |= {"excess_clipping": "domain", "weigh_absent_tasks": False}
    assert args.weighting_options() == expected
