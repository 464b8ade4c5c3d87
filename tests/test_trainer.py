"""MinimaxTrainer: exactness (DDP, accumulation), weights rule, edge cases, logging, evaluation, resume."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ports import free_port
from processes import checkout_env
from safetensors.torch import load_file
from tiny_training import TASKS, TaskLossBert, as_dataset, masked_examples, one_step_args, tiny_bert
from transformers import BertConfig, BertForSequenceClassification, TrainerCallback

from robust_pretrain import MinimaxTrainer, MinimaxTrainingArguments
from robust_pretrain.weighting import Weighting

SCRIPT = Path(__file__).with_name("tiny_training.py")


def make_args(tmp_path, **overrides) -> MinimaxTrainingArguments:
    return one_step_args(str(tmp_path / "out"), overrides.pop("task_names", TASKS), **overrides)


class FixedWeighting(Weighting):
    """Returns the same non-uniform weights every step (to compare gradients given the same weights)."""

    loss_driven = False

    def _weights(self, losses, present):
        return torch.tensor([0.5, 0.3, 0.2]) * present


class GradRecorder(TrainerCallback):
    def __init__(self):
        self.trainer = None
        self.grads = None

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.grads is None:
            self.grads = {n: p.grad.clone() for n, p in self.trainer.model.named_parameters() if p.grad is not None}


def first_step_grads(tmp_path, weighting=None, **overrides):
    trainer = MinimaxTrainer(
        model=tiny_bert(),
        args=make_args(tmp_path, **overrides),
        train_dataset=as_dataset(masked_examples(8)),
        weighting=weighting,
    )
    recorder = GradRecorder()
    recorder.trainer = trainer
    trainer.add_callback(recorder)
    trainer.train()
    return recorder.grads, trainer


def max_relative_difference(a: dict, b: dict) -> float:
    """``||a - b|| / ||a||`` over all gradients (per tensor it is meaningless where a gradient is ~0: key biases)."""
    assert a.keys() == b.keys()
    diff = torch.cat([(a[k] - b[k]).flatten() for k in a])
    return float(diff.norm() / torch.cat([a[k].flatten() for k in a]).norm())


def manual_objective(examples, weights) -> dict[str, torch.Tensor]:
    """Gradient of sum_t w_t * mean_t computed by hand on the full batch, with the plain model."""
    model = tiny_bert()
    logits = model(input_ids=examples["input_ids"], attention_mask=examples["attention_mask"]).logits
    mask = examples["labels"] != -100
    ce = torch.nn.functional.cross_entropy(logits[mask], examples["labels"][mask], reduction="none")
    ids = examples["task_ids"][mask]
    loss = sum(weights[t] * ce[ids == t].mean() for t in range(len(TASKS)))
    loss.backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def test_gradient_equals_weighted_sum_of_task_means(tmp_path):
    grads, _ = first_step_grads(tmp_path, weighting=FixedWeighting(3))
    expected = manual_objective(masked_examples(8), [0.5, 0.3, 0.2])
    assert max_relative_difference(expected, grads) <= 1e-5


def test_accumulation_matches_one_batch_of_the_union(tmp_path):
    full, _ = first_step_grads(tmp_path / "a", weighting=FixedWeighting(3))
    accumulated, _ = first_step_grads(
        tmp_path / "b", weighting=FixedWeighting(3), per_device_train_batch_size=2, gradient_accumulation_steps=4
    )
    assert max_relative_difference(full, accumulated) <= 1e-5


def test_sparse_mlm_head_matches_full_logits(tmp_path):
    sparse, trainer = first_step_grads(tmp_path / "a")
    assert trainer.mlm_head is not None
    full, trainer = first_step_grads(tmp_path / "b", sparse_mlm_head=False)
    assert trainer.mlm_head is None
    assert max_relative_difference(full, sparse) <= 1e-5


class FirstMicroBatchTrainer(MinimaxTrainer):
    """Remembers the first micro-batch of the first optimizer step."""

    first_micro_batch = None

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        samples, num_items = super().get_batch_samples(epoch_iterator, num_batches, device)
        if self.first_micro_batch is None:
            self.first_micro_batch = samples[0]
        return samples, num_items


def test_weights_come_from_the_first_micro_batch(tmp_path):
    """With accumulation, the step's weights are softmax(alpha * L) of the first micro-batch's task means."""
    args = make_args(tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=2, alpha=2.0)
    trainer = FirstMicroBatchTrainer(model=tiny_bert(), args=args, train_dataset=as_dataset(masked_examples(8)))
    trainer.train()
    first = trainer.first_micro_batch
    logits = tiny_bert()(input_ids=first["input_ids"]).logits
    mask = first["labels"] != -100
    ce = torch.nn.functional.cross_entropy(logits[mask], first["labels"][mask], reduction="none")
    ids = first["task_ids"][mask]
    assert set(ids.tolist()) == {0, 1, 2}
    means = torch.stack([ce[ids == t].mean() for t in range(3)]).detach()
    assert torch.allclose(trainer.step_weights, torch.softmax(2.0 * means, 0), atol=1e-6)


def task_means_by_hand(examples: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per-task mean cross-entropy of the initial ``tiny_bert`` over all of ``examples``."""
    with torch.no_grad():
        logits = tiny_bert()(input_ids=examples["input_ids"], attention_mask=examples["attention_mask"]).logits
    mask = examples["labels"] != -100
    ce = torch.nn.functional.cross_entropy(logits[mask], examples["labels"][mask], reduction="none")
    ids = examples["task_ids"][mask]
    return torch.stack([ce[ids == t].mean() for t in range(len(TASKS))])


@pytest.mark.slow
def test_ddp_two_processes_match_one_process_with_the_concatenated_batch(tmp_path):
    """8 examples, 3 steps (one epoch each): 1 process x 8 against 2 processes x 4 (gloo). Gradients, weights and the
    logged per-task training losses agree; those of step 1 equal the pooled means over all 8 examples by hand."""
    env = checkout_env(OMP_NUM_THREADS="1")
    single, double = tmp_path / "single", tmp_path / "ddp"
    common = ["--max_steps", "3"]
    subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(single), "--batch_size", "8", *common], check=True, env=env
    )
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
    subprocess.run([*launch, str(SCRIPT), "--out", str(double), "--batch_size", "4", *common], check=True, env=env)
    reference = load_file(single / "grads-rank0.safetensors")
    for rank in (0, 1):
        assert max_relative_difference(reference, load_file(double / f"grads-rank{rank}.safetensors")) <= 1e-5
    weights = [json.loads((double / f"weights-rank{r}.json").read_text()) for r in (0, 1)]
    assert weights[0] == weights[1]
    single_weights = json.loads((single / "weights-rank0.json").read_text())
    assert torch.allclose(torch.tensor(weights[0]), torch.tensor(single_weights), atol=1e-6)
    # logged task_loss/*: pooled over both processes before logging (each process alone saw 4 of the 8 examples)
    names = [f"task_loss/{t}" for t in TASKS]

    def logged(run: Path, rank: int) -> list[list[float]]:
        history = json.loads((run / f"run-rank{rank}.json").read_text())["log_history"]
        return [[entry[name] for name in names] for entry in history if "loss" in entry]

    expected = logged(single, 0)
    assert len(expected) == 3
    means = task_means_by_hand(masked_examples(8))
    assert expected[0] == pytest.approx(means.tolist(), abs=1e-6)
    for rank in (0, 1):
        assert torch.allclose(torch.tensor(logged(double, rank)), torch.tensor(expected), atol=2e-6), rank
    first = json.loads((double / "run-rank0.json").read_text())["log_history"][0]
    assert first["loss"] == pytest.approx(float(torch.tensor(weights[0][0]) @ means), abs=1e-4)


@pytest.mark.slow
def test_resume_after_sigkill_matches_uninterrupted_run(tmp_path):
    common = [
        "--num_examples",
        "32",
        "--batch_size",
        "4",
        "--max_steps",
        "8",
        "--save_steps",
        "4",
        "--dropout",
        "0.1",
        "--loss_ema",
        "0.5",
        "--grad_accum",
        "2",
    ]
    env = checkout_env()
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(straight), *common], check=True, env=env)
    crashed = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(killed), *common, "--kill_after_save", "4"], env=env
    )
    assert crashed.returncode == -9
    assert (killed / "checkpoint-4" / "weighting_state.json").is_file()
    assert not (killed / "final").exists()
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(killed), *common, "--resume"], check=True, env=env)
    a = load_file(straight / "final" / "model.safetensors")
    b = load_file(killed / "final" / "model.safetensors")
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-6
    trajectory = json.loads((straight / "weights-rank0.json").read_text())
    assert json.loads((killed / "weights-rank0.json").read_text()) == trajectory[4:]
    state_a = json.loads((straight / "final" / "weighting_state.json").read_text())
    state_b = json.loads((killed / "final" / "weighting_state.json").read_text())
    assert state_a == state_b


def one_step(trainer, batch):
    """Run one optimizer step's loss computation by hand, the way the Trainer's loop calls the hooks."""
    trainer.model.train()
    samples, _ = trainer.get_batch_samples(iter([batch]), 1, torch.device("cpu"))
    trainer.current_gradient_accumulation_steps = 1
    return trainer.compute_loss(trainer.model, dict(samples[0]))


def test_absent_task_gets_no_weight_and_keeps_its_estimate(tmp_path):
    trainer = MinimaxTrainer(model=tiny_bert(), args=make_args(tmp_path))
    batch = masked_examples(4)
    one_step(trainer, batch)
    estimate = trainer.weighting.estimates[2].item()
    without = dict(batch, task_ids=torch.where(batch["task_ids"] == 2, -100, batch["task_ids"]))
    loss = one_step(trainer, without)
    assert trainer.step_weights[2] == 0 and trainer.weighting.estimates[2].item() == estimate
    assert torch.isclose(trainer.step_weights.sum(), torch.tensor(1.0))
    assert torch.isfinite(loss)


def test_step_without_targets_contributes_zero_loss(tmp_path):
    trainer = MinimaxTrainer(model=tiny_bert(), args=make_args(tmp_path))
    batch = masked_examples(4)
    empty = dict(batch, labels=torch.full_like(batch["labels"], -100), task_ids=torch.full_like(batch["labels"], -100))
    loss = one_step(trainer, empty)
    assert loss.item() == 0.0
    loss.backward()
    grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
    assert all(torch.isfinite(g).all() and not g.any() for g in grads)


class PerPositionModel(torch.nn.Module):
    """logits = W e(token): a token's logits depend only on that token (so a NaN stays in its position)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 8)
        self.out = torch.nn.Linear(8, 64)

    def forward(self, input_ids, attention_mask=None):
        return {"logits": self.out(self.embed(input_ids))}


def test_non_finite_task_loss_names_the_task_and_step(tmp_path):
    model = PerPositionModel()
    with torch.no_grad():
        model.embed.weight[4] = math.nan  # token 4 is the mask token: every target turns NaN ...
    trainer = MinimaxTrainer(model=model, args=make_args(tmp_path))
    batch = masked_examples(4)
    batch["input_ids"] = torch.where(batch["task_ids"] == 1, 4, batch["labels"].clamp_min(5))  # ... of task 1 only
    with pytest.raises(FloatingPointError, match=r"\['noun'\] at optimizer step 1"):
        one_step(trainer, batch)


def test_logs_and_evaluation_report_per_task_numbers(tmp_path):
    examples = masked_examples(16)
    trainer = MinimaxTrainer(
        model=tiny_bert(),
        args=make_args(tmp_path, max_steps=2, per_device_train_batch_size=4),
        train_dataset=as_dataset(examples),
        eval_dataset=as_dataset(examples),
    )
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 2
    for entry in logged:
        assert {f"task_weight/{t}" for t in TASKS} | {f"task_loss/{t}" for t in TASKS} <= entry.keys()
        assert sum(entry[f"task_weight/{t}"] for t in TASKS) == pytest.approx(1.0, abs=1e-5)
    metrics = trainer.evaluate()
    losses = [metrics[f"eval_task_loss/{t}"] for t in TASKS]
    assert metrics["eval_worst_task_loss"] == pytest.approx(max(losses))
    assert metrics["eval_mean_task_loss"] == pytest.approx(sum(losses) / 3)
    # eval_loss is the plain mean over all targets: between the best and the worst task
    assert min(losses) <= metrics["eval_loss"] <= max(losses)


@pytest.mark.parametrize("strategy", ["uncertainty", "gradnorm"])
def test_learnable_weightings_are_trained_by_the_optimizer(tmp_path, strategy):
    trainer = MinimaxTrainer(
        model=tiny_bert(),
        train_dataset=as_dataset(masked_examples(16)),
        args=make_args(
            tmp_path, weighting=strategy, max_steps=3, per_device_train_batch_size=4, weighting_learning_rate=0.1
        ),
    )
    (param,) = trainer.weighting.parameters()
    before = param.detach().clone()
    trainer.train()
    assert any(param is p for group in trainer.optimizer.param_groups for p in group["params"])
    assert not torch.equal(before, param.detach())
    assert param.grad is None  # cleared after each optimizer step
    if strategy == "gradnorm":
        assert trainer.weighting.task_weights.sum().item() == pytest.approx(3.0, abs=0.3)


def test_example_level_task_ids_for_sequence_classification(tmp_path):
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=3,
        hidden_dropout_prob=0,
        attention_probs_dropout_prob=0,
    )
    model = BertForSequenceClassification(config)
    batch = {
        "input_ids": torch.randint(5, 64, (6, 8)),
        "labels": torch.tensor([0, 1, 2, 0, 1, 2]),
        "task_ids": torch.tensor([0, 0, 1, 1, 2, 2]),
    }
    trainer = MinimaxTrainer(model=model, args=make_args(tmp_path, weighting="average"))
    loss = one_step(trainer, batch)
    logits = model(input_ids=batch["input_ids"]).logits
    ce = torch.nn.functional.cross_entropy(logits, batch["labels"], reduction="none")
    assert loss.item() == pytest.approx(ce.view(3, 2).mean(1).mean().item(), rel=1e-5)


class DictLossModel(torch.nn.Module):
    """Returns one loss per task, like a multi-modal MAE reconstructing each modality."""

    def __init__(self):
        super().__init__()
        self.theta = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0]))

    def forward(self, x):
        return {"task_losses": {name: (self.theta[i] * x).pow(2).mean() for i, name in enumerate(TASKS)}}


def test_model_returning_a_dict_of_task_losses(tmp_path):
    model = DictLossModel()
    trainer = MinimaxTrainer(model=model, args=make_args(tmp_path, alpha=0.1))
    loss = one_step(trainer, {"x": torch.ones(4)})
    task_losses = torch.tensor([1.0, 4.0, 9.0])
    expected = (torch.softmax(0.1 * task_losses, 0) * task_losses).sum()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_batch_without_task_ids_fails_clearly(tmp_path):
    trainer = MinimaxTrainer(model=tiny_bert(), args=make_args(tmp_path))
    batch = masked_examples(2)
    del batch["task_ids"]
    with pytest.raises(ValueError, match="needs `task_ids`"):
        one_step(trainer, batch)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"task_names": ["a", "a"]}, "unique"),
        ({"task_sampling_weights": [1.0, 1.0, 1.0]}, "task_sampling_weights: the weights of task_sampling='fixed'"),
        ({"task_sampling": "fixed", "task_sampling_weights": [0.0, 0.0, 0.0]}, "not all 0"),
        ({"importance_weighting": True}, "importance_weighting: corrects the draws of task_sampling='fixed'"),
        ({"task_sampling": "online", "weighting": "uncertainty"}, "cannot drive task sampling"),
        ({"task_sampling": "online", "weighting": "gradnorm"}, "cannot drive task sampling"),
        ({"weighting": "best"}, "unknown strategy"),
        ({"alpha": -1.0}, "alpha must be > 0"),
        ({"weighting": "average", "alpha": 2.0}, "alpha: not used by weighting='average'"),
        ({"loss_normalization": "excess"}, "reference_losses"),
        ({"weighting_learning_rate": 0.0}, "weighting_learning_rate"),
    ],
)
@pytest.mark.parametrize("task_names", [TASKS, []], ids=["tasks", "no-tasks"])
def test_invalid_arguments_fail_at_construction(tmp_path, overrides, message, task_names):
    """Checks that do not need the tasks run at construction, with or without task_names."""
    with pytest.raises(ValueError, match=message):
        make_args(tmp_path, **{"task_names": task_names, **overrides})


@pytest.mark.parametrize("weighting", ["proportional", "average", "uncertainty", "gradnorm", "minimax", "dwa"])
def test_valid_arguments_without_task_names_are_accepted(tmp_path, weighting):
    assert make_args(tmp_path, task_names=[], weighting=weighting).task_names == []


class NamedCollator:
    """Stacks pre-masked rows; carries the names of its tasks, as the library's collators do."""

    def __init__(self, task_names: list[str]) -> None:
        self.task_names = task_names

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        return {key: torch.stack([torch.as_tensor(row[key]) for row in rows]) for key in rows[0]}


def test_the_tasks_come_from_the_data_collator(tmp_path):
    args = make_args(tmp_path, task_names=[])
    trainer = MinimaxTrainer(model=tiny_bert(), args=args, data_collator=NamedCollator(TASKS))
    assert trainer.task_names == TASKS and args.task_names == TASKS and trainer.weighting.num_tasks == len(TASKS)


def test_the_tasks_come_from_a_dict_of_losses_model(tmp_path):
    model = DictLossModel()
    model.task_names = TASKS
    trainer = MinimaxTrainer(model=model, args=make_args(tmp_path, task_names=[], alpha=0.1))
    assert trainer.task_names == TASKS


def test_tasks_that_disagree_are_refused_at_construction_naming_both_lists(tmp_path):
    message = "the arguments' task_names ['verb', 'noun', 'adjective'] differ from the data collator's task_names ['a']"
    with pytest.raises(ValueError, match=re.escape(message)):
        MinimaxTrainer(model=tiny_bert(), args=make_args(tmp_path), data_collator=NamedCollator(["a"]))
    model = DictLossModel()
    model.task_names = ["x", "y", "z"]
    with pytest.raises(ValueError, match=re.escape(f"task_names {TASKS} differ from the model's task_names")):
        MinimaxTrainer(model=model, args=make_args(tmp_path, task_names=[]), data_collator=NamedCollator(TASKS))


def test_without_task_names_anywhere_construction_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no task names found"):
        MinimaxTrainer(model=tiny_bert(), args=make_args(tmp_path, task_names=[]))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"loss_normalization": "excess", "reference_losses": [1.0]}, "one value per task"),
        ({"task_sampling": "fixed", "task_sampling_weights": [1.0, 1.0]}, "task_sampling_weights: one weight per task"),
        ({"task_sampling": "fixed"}, "task_sampling='fixed' draws from task_sampling_weights: give one per task"),
    ],
)
def test_checks_that_need_the_tasks_run_when_the_tasks_are_known(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):  # at construction with task_names
        make_args(tmp_path, **overrides)
    args = make_args(tmp_path, task_names=[], **overrides)  # T unknown: accepted, then refused by the trainer
    with pytest.raises(ValueError, match=message):
        MinimaxTrainer(model=tiny_bert(), args=args, data_collator=NamedCollator(TASKS))


def test_task_sampling_needs_a_collator_that_draws_tasks(tmp_path):
    args = make_args(tmp_path, task_sampling="online")
    with pytest.raises(ValueError, match="the data collator \\(NamedCollator\\) cannot draw tasks"):
        MinimaxTrainer(model=tiny_bert(), args=args, data_collator=NamedCollator(TASKS))


def test_bf16_autocast_trains_with_fp32_task_losses(tmp_path):
    _, trainer = first_step_grads(tmp_path, bf16=True)
    entry = next(e for e in trainer.state.log_history if "loss" in e)
    assert math.isfinite(entry["loss"]) and all(math.isfinite(entry[f"task_loss/{t}"]) for t in TASKS)


def test_tensorboard_receives_task_weights_and_losses(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = MinimaxTrainer(
        model=tiny_bert(),
        train_dataset=as_dataset(masked_examples(16)),
        args=make_args(
            tmp_path,
            max_steps=2,
            per_device_train_batch_size=4,
            report_to=["tensorboard"],
        ),
    )
    trainer.train()
    events = EventAccumulator(str(next(tmp_path.rglob("events.out.tfevents.*")).parent))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {f"train/task_weight/{t}" for t in TASKS} | {f"train/task_loss/{t}" for t in TASKS} <= tags
    weights = [events.Scalars(f"train/task_weight/{t}")[-1].value for t in TASKS]
    assert sum(weights) == pytest.approx(1.0, abs=1e-5)


class EmptyTaskModel(torch.nn.Module):
    """Task ``adjective`` has no targets: its loss is the mean of an empty selection (NaN), its count 0."""

    def __init__(self):
        super().__init__()
        self.theta = torch.nn.Parameter(torch.tensor([1.0, 2.0]))

    def forward(self, x):
        empty = x[x < 0]
        return {
            "task_losses": {"verb": (self.theta[0] * x).pow(2).mean(), "noun": (self.theta[1] * x).pow(2).mean(),
                            "adjective": (self.theta.sum() * empty).pow(2).mean()},
            "task_counts": {"verb": x.numel(), "noun": x.numel(), "adjective": 0},
        }  # fmt: skip


def test_a_task_with_count_zero_and_a_nan_mean_is_absent(tmp_path):
    trainer = MinimaxTrainer(
        model=EmptyTaskModel(),
        args=make_args(tmp_path, alpha=0.1, max_steps=2, remove_unused_columns=False),
        train_dataset=as_dataset({"x": torch.ones(16)}),
    )
    loss = one_step(trainer, {"x": torch.ones(4)})
    expected_weights = torch.softmax(0.1 * torch.tensor([1.0, 4.0]), 0)
    assert loss.item() == pytest.approx(float(expected_weights @ torch.tensor([1.0, 4.0])), rel=1e-6)
    assert (
        trainer.step_weights[:2].tolist() == pytest.approx(expected_weights.tolist()) and trainer.step_weights[2] == 0
    )
    loss.backward()
    assert torch.isfinite(trainer.model.theta.grad).all()
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 2 and all(math.isfinite(entry["loss"]) for entry in logged)
    assert all("task_loss/adjective" not in entry and entry["task_weight/adjective"] == 0 for entry in logged)
    assert all(math.isfinite(entry["task_loss/verb"]) and math.isfinite(entry["task_loss/noun"]) for entry in logged)


@pytest.mark.parametrize("count", [-1.0, math.nan, math.inf])
def test_an_invalid_task_count_is_refused(tmp_path, count):
    model = DictLossModel()
    model.forward = lambda x: {"task_losses": {"verb": x.mean()}, "task_counts": {"verb": count}}
    trainer = MinimaxTrainer(model=model, args=make_args(tmp_path))
    with pytest.raises(ValueError, match=r"task_counts\['verb'\] must be a finite number >= 0"):
        one_step(trainer, {"x": torch.ones(4)})


class SequentialTrainer(MinimaxTrainer):
    """Feeds the training examples in order (so the test knows which micro-batch holds which examples)."""

    def _get_train_sampler(self, train_dataset=None):
        return torch.utils.data.SequentialSampler(train_dataset or self.train_dataset)


def test_task_losses_model_with_accumulation_logs_the_effective_weights(tmp_path):
    """GA = 4 micro-batches of 2 examples, ``adjective`` only in the first: the step's gradient is that of
    ``sum_i sum_t w_t mean_{t,i} / 4`` (w from micro-batch 0), so the logged weight of ``adjective`` is ``w / 4``."""
    examples = masked_examples(8)
    in_later = (torch.arange(8) >= 2)[:, None] & (examples["task_ids"] == 2)
    examples["labels"][in_later], examples["task_ids"][in_later] = -100, -100
    renamed = {("target_task_ids" if k == "task_ids" else k): v for k, v in examples.items()}
    args = make_args(tmp_path, per_device_train_batch_size=2, gradient_accumulation_steps=4, alpha=1.0)
    trainer = SequentialTrainer(model=TaskLossBert(), args=args, train_dataset=as_dataset(renamed))
    recorder = GradRecorder()
    recorder.trainer = trainer
    trainer.add_callback(recorder)
    trainer.train()
    # by hand: micro-batch means of the initial model, weights softmax(means of micro-batch 0)
    model = TaskLossBert()
    presence = torch.zeros(3)
    objective = 0.0
    for i in range(4):
        rows = slice(2 * i, 2 * i + 2)
        logits = model.bert(input_ids=examples["input_ids"][rows]).logits
        mask = examples["labels"][rows] != -100
        ce = torch.nn.functional.cross_entropy(logits[mask], examples["labels"][rows][mask], reduction="none")
        ids = examples["task_ids"][rows][mask]
        means = {t: ce[ids == t].mean() for t in range(3) if (ids == t).any()}
        if i == 0:
            assert sorted(means) == [0, 1, 2]
            weights = torch.softmax(torch.stack([means[t] for t in range(3)]).detach(), 0)
        for t, mean in means.items():
            objective = objective + weights[t] * mean / 4
            presence[t] += 1
    assert presence.tolist() == [4, 4, 1]
    objective.backward()
    expected = {f"bert.{n}": p.grad for n, p in model.bert.named_parameters() if p.grad is not None}
    assert max_relative_difference(expected, recorder.grads) <= 1e-5
    effective = weights * presence / 4
    entry = next(e for e in trainer.state.log_history if "loss" in e)
    assert [entry[f"task_weight/{t}"] for t in TASKS] == pytest.approx(effective.tolist(), abs=1e-6)
    assert trainer.step_weights.tolist() == pytest.approx(effective.tolist(), abs=1e-7)


@pytest.mark.slow
@pytest.mark.slow
@pytest.mark.parametrize(
    ("changed", "message"),
    [
        ({"alpha": 2.0}, "trained with alpha=1.0; this run has alpha=2.0"),
        ({"weight_floor": 0.1}, "trained with weight_floor=0.0; this run has weight_floor=0.1"),
        ({"alpha_schedule": "sqrt", "loss_ema": 0.5}, "alpha_schedule='constant', loss_ema=0.0; this run has"),
        ({"weighting": "group_dro", "alpha": None}, r"dro_step_size=None.*this run has.*dro_step_size=0\.01"),
    ],
)
def test_resume_with_other_weighting_options_is_refused_naming_them(tmp_path, changed, message):
    options = dict(max_steps=2, per_device_train_batch_size=4, save_strategy="steps", save_steps=2, alpha=1.0)
    dataset = as_dataset(masked_examples(16))
    MinimaxTrainer(model=tiny_bert(), args=make_args(tmp_path, **options), train_dataset=dataset).train()
    options.update(changed, max_steps=4)
    options = {k: v for k, v in options.items() if v is not None}
    trainer = MinimaxTrainer(model=tiny_bert(), args=make_args(tmp_path, **options), train_dataset=dataset)
    with pytest.raises(ValueError, match=message):
        trainer.train(resume_from_checkpoint=True)
    assert not (tmp_path / "out" / "checkpoint-4").exists()
    same = {k: v for k, v in options.items() if k not in changed} | {"alpha": 1.0}
    resumed = MinimaxTrainer(model=tiny_bert(), args=make_args(tmp_path, **same), train_dataset=dataset)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 4


def test_task_id_out_of_range_is_refused_without_a_host_sync(tmp_path):
    """A target's task id >= T fails the asynchronous device check (on the CPU at once), naming the problem."""
    trainer = MinimaxTrainer(model=tiny_bert(), args=make_args(tmp_path))
    batch = masked_examples(4)
    batch["task_ids"] = torch.where(batch["task_ids"] == 2, len(TASKS), batch["task_ids"])
    with pytest.raises(ValueError, match=r"task_ids: a target's task id is >= the 3 tasks"):
        one_step(trainer, batch)


def test_non_finite_task_loss_in_a_later_micro_batch_is_caught_before_the_step_ends(tmp_path):
    """The later micro-batches' finiteness is read once, at the step's last micro-batch (before its backward)."""
    model = PerPositionModel()
    with torch.no_grad():
        model.embed.weight[4] = math.nan
    trainer = MinimaxTrainer(model=model, args=make_args(tmp_path, gradient_accumulation_steps=3))
    clean, broken = masked_examples(4, seed=1), masked_examples(4, seed=2)
    clean["input_ids"] = clean["labels"].clamp_min(5)  # no mask token: finite everywhere
    broken["input_ids"] = torch.where(broken["task_ids"] == 2, 4, broken["labels"].clamp_min(5))  # adjective: NaN
    trainer.model.train()
    samples, _ = trainer.get_batch_samples(iter([clean, broken, clean]), 3, torch.device("cpu"))
    trainer.current_gradient_accumulation_steps = 3
    trainer.compute_loss(trainer.model, dict(samples[0]))
    trainer.compute_loss(trainer.model, dict(samples[1]))  # flagged on the device, not read yet
    with pytest.raises(FloatingPointError, match=r"\['adjective'\] at optimizer step 1"):
        trainer.compute_loss(trainer.model, dict(samples[2]))
