"""Device->host synchronisations of one optimizer step, counted on the CPU (issue 19 item 1, issue 31 item 4).

:mod:`sync_counting` follows which tensors would live on a CUDA device and counts the ops on them that make the host
wait (``.item()``, ``nonzero``, boolean-mask indexing, ``bincount``, ``.cpu()`` ...). The best plain-HF practice, the
plain ``Trainer`` with a sparse-prediction MLM head (hidden states gathered where ``labels != -100`` before the head),
sets the budget: ``MinimaxTrainer`` may add at most 2 per optimizer step (accumulation 2), whatever the strategy; on
the MM-MAE model (which returns ``task_losses``) and on a decoder the budget is the plain ``Trainer`` on the same
model. The targets' positions are found on the host by the training collator
(:class:`~robust_pretrain.task_losses.HostTargets`), so no micro-batch makes a sync of its own.
"""

from __future__ import annotations

import sys

import pytest
import torch
from processes import REPO_ROOT
from sync_counting import DeviceSyncCounter, count_step_syncs, mark_on_device
from tiny_training import TASKS, as_dataset, masked_examples, tiny_bert
from tiny_vision import BatchExamples, random_batch, tiny_config
from transformers import Trainer, TrainingArguments

from robust_pretrain import MinimaxTrainer, MinimaxTrainingArguments
from robust_pretrain.task_losses import HOST_TARGET_COLUMNS, HostTargets, TaskTargets, next_token_targets
from robust_pretrain.vision import MultiMAEForPreTraining

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
from baselines import SparsePredictionBertForMaskedLM  # noqa: E402

#: how many syncs MinimaxTrainer may add to the plain sparse-head step's
ALLOWANCE = 2
STEP = dict(
    per_device_train_batch_size=4,
    gradient_accumulation_steps=2,
    max_steps=2,  # the second step is counted: the first one's lazy set-up (optimizer state) is not a step's cost
    learning_rate=1e-3,
    report_to=[],
    use_cpu=True,
    disable_tqdm=True,
    save_strategy="no",
    logging_steps=100,
)


def plain_sparse_head_syncs(tmp_path) -> DeviceSyncCounter:
    torch.manual_seed(0)
    model = SparsePredictionBertForMaskedLM(tiny_bert().config)
    args = TrainingArguments(output_dir=str(tmp_path / "plain"), **STEP)
    return count_step_syncs(Trainer(model=model, args=args, train_dataset=as_dataset(masked_examples(16))))


def minimax_trainer_syncs(tmp_path, weighting: str) -> DeviceSyncCounter:
    args = MinimaxTrainingArguments(output_dir=str(tmp_path / weighting), task_names=TASKS, weighting=weighting, **STEP)
    trainer = MinimaxTrainer(model=tiny_bert(), args=args, train_dataset=as_dataset(masked_examples(16)))
    return count_step_syncs(trainer)


@pytest.fixture(scope="module")
def plain_sparse_head(tmp_path_factory) -> DeviceSyncCounter:
    counter = plain_sparse_head_syncs(tmp_path_factory.mktemp("plain"))
    # the model's own: the boolean gather of the hidden states (forward, backward) and of the labels, per micro-batch;
    # the rest is the Trainer loop's (its non-finite loss check of each micro-batch: isnan, isinf ...)
    assert counter.counts["index (boolean mask)"] == 4 and counter.counts["index_put (boolean mask)"] == 2
    assert set(counter.counts) == {"index (boolean mask)", "index_put (boolean mask)", "_local_scalar_dense"}
    return counter


@pytest.mark.parametrize("weighting", ["minimax", "average", "proportional", "group_dro", "dwa"])
def test_minimax_trainer_step_syncs_within_the_plain_sparse_head_step(tmp_path, plain_sparse_head, weighting):
    counter = minimax_trainer_syncs(tmp_path, weighting)
    assert counter.total <= plain_sparse_head.total + ALLOWANCE, dict(counter.counts)
    # Exactly: the Trainer loop's own scalar reads and two host transfers (the weighting's inputs at the first
    # micro-batch, the later micro-batches' finiteness at the last); the targets' positions come from the host (no
    # nonzero): any sync added to the hot path fails here.
    loop_reads = plain_sparse_head.counts["_local_scalar_dense"]
    assert dict(counter.counts) == {"_local_scalar_dense": loop_reads, "cpu()": 2}


def multimae_step_args(output_dir: str, **minimax: object) -> dict:
    return dict(output_dir=output_dir, remove_unused_columns=False, **STEP, **minimax)


def test_multimae_minimax_step_syncs_within_the_plain_trainer_step(tmp_path):
    data = BatchExamples(random_batch(batch=16))
    torch.manual_seed(0)
    plain = Trainer(
        model=MultiMAEForPreTraining(tiny_config()),
        args=TrainingArguments(**multimae_step_args(str(tmp_path / "plain"))),
        train_dataset=data,
    )
    plain_count = count_step_syncs(plain)
    torch.manual_seed(0)
    model = MultiMAEForPreTraining(tiny_config())
    args = MinimaxTrainingArguments(
        **multimae_step_args(str(tmp_path / "minimax"), task_names=model.config.task_names, weighting="minimax")
    )
    minimax_count = count_step_syncs(MinimaxTrainer(model=model, args=args, train_dataset=data))
    assert minimax_count.total <= plain_count.total + ALLOWANCE, (dict(minimax_count.counts), dict(plain_count.counts))
    # the model's and the loop's syncs, plus the trainer's two host transfers
    assert minimax_count.counts - plain_count.counts == {"cpu()": 2}, (minimax_count.counts, plain_count.counts)


def test_counter_counts_device_syncs_and_host_transfers_but_not_host_bookkeeping():
    counter = DeviceSyncCounter()
    batch = torch.tensor([[1, -100, 3], [-100, 5, 6]])
    mark_on_device([batch])
    with counter, counter.watching_host_transfers():
        counter.counting = True
        mask = batch != -100  # elementwise: no sync
        batch[mask].sum()  # boolean-mask gather: 1
        int(mask.sum())  # _local_scalar_dense: 1
        host = mask.sum(0).cpu()  # transfer: 1
        host.tolist(), int(host.max()), host[host > 0]  # host tensors: none
        batch.tolist()  # transfer: 1
        torch.zeros(3).index_add_(0, batch.clamp_min(0)[0] % 3, torch.ones(3))  # scatter-add on the device: none
    assert dict(counter.counts) == {"index (boolean mask)": 1, "_local_scalar_dense": 1, "cpu()": 1, "tolist()": 1}


@pytest.mark.parametrize("example_level", [False, True])
def test_task_targets_equal_the_boolean_mask_selection(example_level):
    """Counts, ids, gathered labels and logits of TaskTargets equal the boolean-mask selection they replace."""
    batch = masked_examples(6, seed=3)
    labels = batch["labels"]
    task_ids = torch.tensor([2, -100, 0, 1, 1, 0]) if example_level else batch["task_ids"]
    targets = TaskTargets(labels, task_ids, len(TASKS))
    full_ids = task_ids[:, None].expand_as(labels) if example_level else task_ids
    mask = (full_ids >= 0) & (labels != -100)
    assert torch.equal(targets.mask, mask)
    assert torch.equal(targets.ids, full_ids[mask])
    assert torch.equal(targets.gather(labels), labels[mask])
    logits = torch.randn(*labels.shape, 5)
    assert torch.equal(targets.gather(logits), logits[mask])
    expected = torch.stack([(full_ids[mask] == t).sum() for t in range(len(TASKS))]).float()
    assert torch.equal(targets.counts(), expected)


#: how many syncs MinimaxTrainer adds to the plain Trainer's decoder step, by gradient accumulation: the host transfer
#: of the weighting's inputs (first micro-batch) and, with accumulation, that of the later micro-batches' finiteness
DECODER_ALLOWANCE = {1: 1, 2: 2}


def causal_lm_step_syncs(
    tmp_path, accumulation: int, host_targets: bool = True
) -> tuple[DeviceSyncCounter, DeviceSyncCounter]:
    """The plain Trainer's and MinimaxTrainer's (chunked next-token losses) counts of one step of a tiny Llama;
    ``host_targets=False`` turns the collator's host-side targets off (the device fallback)."""
    from tiny_causal_lm import DOMAINS, domain_examples, tiny_llama

    step = {**STEP, "gradient_accumulation_steps": accumulation}
    plain_data = as_dataset({k: v for k, v in domain_examples(16).items() if k != "task_ids"})
    plain = Trainer(
        model=tiny_llama(), args=TrainingArguments(output_dir=str(tmp_path / "plain"), **step), train_dataset=plain_data
    )
    plain_count = count_step_syncs(plain)
    args = MinimaxTrainingArguments(
        output_dir=str(tmp_path / "minimax"), task_names=DOMAINS, weighting="minimax", **step
    )
    trainer = MinimaxTrainer(model=tiny_llama(), args=args, train_dataset=as_dataset(domain_examples(16)))
    assert trainer.lm_loss is not None  # the chunked path is the one counted
    if not host_targets:
        get_train_dataloader = trainer.get_train_dataloader

        def device_targets():
            dataloader = get_train_dataloader()
            dataloader.collate_fn.enabled = False
            return dataloader

        trainer.get_train_dataloader = device_targets
    minimax_count = count_step_syncs(trainer)
    # the counted step holds forward pass 2 (accumulation 1) or 4 (accumulation 2): a check of the head, on the device
    assert trainer.lm_loss.forward_passes == 2 * accumulation
    return plain_count, minimax_count


@pytest.mark.parametrize("accumulation", [1, 2])
def test_causal_lm_minimax_step_syncs_within_the_plain_trainer_step(tmp_path, accumulation):
    """A decoder (chunked next-token losses): the plain Trainer's own loss needs no target selection, so the trainer's
    budget is its host transfers, one per step at accumulation 1 and two at 2 (plain + 1, plain + 2); the targets'
    positions come from the host and the head's check reads nothing back: no sync per micro-batch."""
    plain_count, minimax_count = causal_lm_step_syncs(tmp_path, accumulation)
    assert minimax_count.total <= plain_count.total + DECODER_ALLOWANCE[accumulation], (
        dict(minimax_count.counts),
        dict(plain_count.counts),
    )
    assert minimax_count.counts - plain_count.counts == {"cpu()": accumulation}, (
        minimax_count.counts,
        plain_count.counts,
    )
    assert not plain_count.counts - minimax_count.counts


def test_a_sync_per_micro_batch_breaks_the_decoder_budget(tmp_path):
    """The budget above is tight: with the targets found on the device instead (one ``nonzero`` per micro-batch, what
    a data loader that splits batches after collation gets), the counts exceed it."""
    plain_count, minimax_count = causal_lm_step_syncs(tmp_path, 2, host_targets=False)
    assert minimax_count.counts - plain_count.counts == {"nonzero": 2, "cpu()": 2}
    assert minimax_count.total > plain_count.total + DECODER_ALLOWANCE[2]


@pytest.mark.parametrize("layout", ["next-token, example-level ids", "next-token, token-level ids", "masked LM"])
def test_host_targets_are_the_targets_found_on_the_device(layout):
    """The collator's host-side positions and task ids (:class:`HostTargets`) equal those :class:`TaskTargets` finds
    by a ``nonzero`` on the same batch, shifted for a next-token loss; so do the per-task counts taken from them."""
    from tiny_causal_lm import DOMAINS, domain_examples

    next_token = layout.startswith("next-token")
    batch = domain_examples(6, seed=1) if next_token else masked_examples(6, seed=3)
    if layout == "next-token, token-level ids":
        batch["task_ids"] = torch.where(
            batch["labels"] != -100, torch.arange(batch["labels"].numel()).view_as(batch["labels"]) % len(DOMAINS), -100
        )
    num_tasks = len(DOMAINS if next_token else TASKS)
    host = HostTargets(lambda features: dict(features[0]), num_tasks, next_token)([batch])
    labels, task_ids = (
        next_token_targets(batch["labels"], batch["task_ids"]) if next_token else (batch["labels"], batch["task_ids"])
    )
    device = TaskTargets(labels, task_ids, num_tasks)
    positions, ids = (host[column] for column in HOST_TARGET_COLUMNS)
    assert torch.equal(positions, device.positions) and torch.equal(ids, device.ids)
    found = TaskTargets(labels, task_ids, num_tasks, found=(positions, ids))
    assert torch.equal(found.counts(), device.counts()) and torch.equal(found.gather(labels), device.gather(labels))


def test_host_targets_refuse_a_bad_task_id_in_the_collator():
    batch = masked_examples(4)
    batch["task_ids"] = torch.where(batch["labels"] != -100, len(TASKS), -100)
    with pytest.raises(ValueError, match="task id is >= the 3 tasks"):
        HostTargets(lambda features: features[0], len(TASKS), next_token=False)([batch])


@pytest.mark.parametrize("dispatch_batches", [False, True])
def test_training_batches_carry_host_targets_unless_accelerate_splits_them_after_collation(tmp_path, dispatch_batches):
    """The training data loader's batches carry the host-side targets; one that Accelerate dispatches (collated on
    one process, then split by rows) does not, and its targets are found on the device."""
    from tiny_causal_lm import DOMAINS, domain_examples, tiny_llama

    args = MinimaxTrainingArguments(
        output_dir=str(tmp_path), task_names=DOMAINS, accelerator_config={"dispatch_batches": dispatch_batches}, **STEP
    )
    trainer = MinimaxTrainer(model=tiny_llama(), args=args, train_dataset=as_dataset(domain_examples(8)))
    batch = next(iter(trainer.get_train_dataloader()))
    assert (HOST_TARGET_COLUMNS[0] in batch) is not dispatch_batches
    assert not hasattr(trainer.data_collator, "enabled")  # the trainer's own collator is left as it was
    trainer.train()  # the extra columns never reach the model
