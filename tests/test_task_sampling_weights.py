"""``task_sampling_weights`` by name (``{task: weight}``, ``name=weight`` tokens, a JSON object or file, a config
mapping) and the decoder recipe's ``--domain_weights FILE`` as a loader of that mapping (the trainer's options built
with it, never rewritten after parsing)."""

from __future__ import annotations

import json

import pytest
import torch
from test_task_sampling import _draw_enumeration_trainer, _every_draw, _step_gradient
from transformers import HfArgumentParser

from robust_pretrain import MinimaxTrainingArguments
from robust_pretrain.cli import UsageError
from robust_pretrain.config import OptionParser, parse_with_config
from robust_pretrain.pretraining.causal_lm import recipe as causal_lm


def fixed(tmp_path, weights, **options) -> MinimaxTrainingArguments:
    return MinimaxTrainingArguments(
        str(tmp_path), task_sampling="fixed", task_sampling_weights=weights, report_to=[], **options
    )


def test_a_mapping_is_ordered_by_the_tasks_and_equals_the_list(tmp_path):
    args = fixed(tmp_path, {"b": 3, "a": 1, "c": 0.5}, task_names=["a", "b", "c"])
    assert args.task_sampling_weights == {"b": 3.0, "a": 1.0, "c": 0.5}
    assert args.sampling_weights() == [1.0, 3.0, 0.5]
    unbound = fixed(tmp_path, {"b": 3, "a": 1})
    unbound.bind_tasks(["b", "a"])
    assert unbound.sampling_weights() == [3.0, 1.0]
    assert fixed(tmp_path, [1, 3], task_names=["a", "b"]).sampling_weights() == [1.0, 3.0]  # in task order


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ({"a": 1, "c": 2}, r"the tasks are \['a', 'b'\]; no weight for \['b'\]; no task named \['c'\]"),
        ({"a": 1}, r"no weight for \['b'\]"),
        ({"a": -1, "b": 1}, "task_sampling_weights must be >= 0, got -1.0"),
        ({"a": float("nan"), "b": 1}, "the weight of a must be finite"),
        ({"a": "0.5", "b": 1}, "the weight of a must be a number, got '0.5'"),
        ({"a": True, "b": 1}, "the weight of a must be a number, got True"),
        ({}, "expected {task: weight} with one or more tasks"),
        (["a=1", "2"], "every task as name=weight, or weights in task order"),
        (["a=1", "a=2"], "a task named twice"),
        ({"a": 0, "b": 0}, "not all 0"),
        ([1, 2, 3], r"one weight per task \(2"),
        ({"a": 1e308, "b": 1e308}, "the weights' sum overflows"),  # the draws would all go to b
    ],
)
def test_bad_weights_are_refused_naming_the_option(tmp_path, weights, message):
    with pytest.raises(ValueError, match=message):
        fixed(tmp_path, weights, task_names=["a", "b"])


def test_weights_assigned_after_construction_are_read_and_checked_when_the_tasks_bind(tmp_path):
    args = fixed(tmp_path, [1, 1])
    args.task_sampling_weights = ["b=1", "a=4"]
    args.bind_tasks(["a", "b"])
    assert args.sampling_weights() == [4.0, 1.0]
    args = fixed(tmp_path, [1, 1])
    args.task_sampling_weights = {"x": 1, "y": 1}
    with pytest.raises(ValueError, match="no weight for"):
        args.bind_tasks(["a", "b"])


def test_every_command_line_spelling_gives_the_same_mapping(tmp_path):
    file = tmp_path / "domain_weights.json"
    file.write_text(json.dumps({"weights": {"a": 0.25, "b": 0.75}, "provenance": {"tokenizer": "t"}}))
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"a": 0.25, "b": 0.75}))
    config = tmp_path / "run.yaml"
    config.write_text(f"output_dir: {tmp_path}\ntask_sampling: fixed\ntask_sampling_weights: {{a: 0.25, b: 0.75}}\n")
    base = ["--output_dir", str(tmp_path), "--task_sampling", "fixed", "--task_sampling_weights"]
    parser = OptionParser(MinimaxTrainingArguments)
    spellings = [
        [*base, "a=0.25", "b=0.75"],
        [*base, "b=0.75", "a=0.25"],
        [*base, '{"a": 0.25, "b": 0.75}'],
        [*base, str(file)],
        [*base, str(plain)],
        ["--config", str(config)],
    ]
    for argv in spellings:
        (args,) = parse_with_config(parser, argv)
        assert args.task_sampling_weights == {"a": 0.25, "b": 0.75}, argv
    (args,) = parse_with_config(parser, [*base, "0.25", "0.75"])
    assert args.task_sampling_weights == [0.25, 0.75]  # by position, as before
    (args,) = HfArgumentParser(MinimaxTrainingArguments).parse_args_into_dataclasses([*base, str(file)])
    assert args.task_sampling_weights == {"a": 0.25, "b": 0.75}  # plain HfArgumentParser: one token, a file or JSON


def test_bad_command_line_weights_are_one_usage_line(tmp_path):
    parser = OptionParser(MinimaxTrainingArguments)
    base = ["--output_dir", str(tmp_path), "--task_sampling", "fixed", "--task_sampling_weights"]
    for tokens, message in (
        (["a=x"], "the weight of a must be a number, got 'x'"),
        (["a=-1", "b=1"], "task_sampling_weights must be >= 0, got -1.0"),
        ([str(tmp_path / "missing.json")], "expected a JSON object of task -> weight"),
        (["[1, 2]"], "expected a JSON object of task -> weight"),
    ):
        with pytest.raises(UsageError, match=message):
            parse_with_config(parser, [*base, *tokens])
    config = tmp_path / "run.yaml"
    config.write_text(f"output_dir: {tmp_path}\nlearning_rate: {{a: 1}}\n")
    with pytest.raises(UsageError, match="option 'learning_rate' is a mapping"):
        parse_with_config(parser, ["--config", str(config)])


def test_a_mapping_trains_as_the_same_weights_in_a_list(tmp_path):
    """The trainer draws with, and importance-weights by, a mapping given in another order exactly as by the list."""
    q, w = [0.8, 0.2], [0.3, 0.7]
    by_list, sequences = _draw_enumeration_trainer(tmp_path / "list", q, w)
    by_name, _ = _draw_enumeration_trainer(tmp_path / "name", {"b": 0.2, "a": 0.8}, w)
    assert by_name.task_schedule.weights_at(5).tolist() == by_list.task_schedule.weights_at(5).tolist()
    by_name.model.load_state_dict(by_list.model.state_dict())
    for _, picked in _every_draw(sequences, q, rows=2)[:4]:
        batch = by_list.data_collator.pad([sequences[i] for i in picked])
        loss, gradient = _step_gradient(by_list, batch)
        loss_by_name, gradient_by_name = _step_gradient(by_name, batch)
        assert loss_by_name.item() == loss.item()
        assert all(torch.equal(a, b) for a, b in zip(gradient, gradient_by_name, strict=True))


def domain_weights_file(tmp_path, weights: dict) -> str:
    path = tmp_path / "domain_weights.json"
    path.write_text(json.dumps({"weights": weights}))
    return str(path)


def test_domain_weights_load_the_trainers_sampling_options(tmp_path):
    file = domain_weights_file(tmp_path, {"en": 1, "fi": 3})
    _, data_args, args = causal_lm.parse_arguments(["--output_dir", str(tmp_path / "run"), "--domain_weights", file])
    assert (args.task_sampling, args.task_sampling_weights) == ("fixed", {"en": 1.0, "fi": 3.0})
    assert data_args.domain_weights == file
    streamed = ["--streaming", "true", "--domain_files", "en=a.txt", "--max_steps", "5"]
    _, _, args = causal_lm.parse_arguments(["--output_dir", str(tmp_path / "run"), "--domain_weights", file, *streamed])
    assert (args.task_sampling, args.task_sampling_weights) == ("none", None)  # the streams draw from the file


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--task_sampling", "online"], "--domain_weights are the fixed sampling weights: they exclude"),
        (["--task_sampling", "fixed", "--task_sampling_weights", "en=1"], "they exclude --task_sampling online and"),
        (
            ["--task_sampling", "fixed", "--importance_weighting", "true"],
            "--domain_weights .*: importance weighting draws every task, but en: 0",
        ),
    ],
)
def test_domain_weights_contradicted_are_refused_while_parsing(tmp_path, options, message):
    file = domain_weights_file(tmp_path, {"en": 0, "fi": 3})
    with pytest.raises(UsageError, match=message):
        causal_lm.parse_arguments(["--output_dir", str(tmp_path / "run"), "--domain_weights", file, *options])
