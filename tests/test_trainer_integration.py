"""MinimaxTrainer inside the Trainer's machinery: version floor, columns, evaluation, metrics, Trainer options."""

import json
import subprocess
import sys

import pytest
import torch
from ports import free_port
from processes import checkout_env
from test_trainer import SCRIPT, DictLossModel, GradRecorder, make_args, max_relative_difference, one_step
from tiny_training import TASKS, TaskLossBert, as_dataset, evaluate_both_modes, masked_examples, tiny_bert
from transformers import PretrainedConfig, Trainer, TrainingArguments

from robust_pretrain import MinimaxTrainer


class PerTokenModel(torch.nn.Module):
    """A token's logits depend only on that token; ``forward`` has neither ``labels`` nor ``**kwargs``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(64, 8)
        self.out = torch.nn.Linear(8, 64)

    def forward(self, input_ids, attention_mask=None):
        return {"logits": self.out(self.embed(input_ids))}


def trained_grads(tmp_path, model, dataset, **overrides):
    trainer = MinimaxTrainer(model=model, args=make_args(tmp_path, **overrides), train_dataset=dataset)
    recorder = GradRecorder()
    recorder.trainer = trainer
    trainer.add_callback(recorder)
    trainer.train()
    return recorder.grads


@pytest.mark.slow
def test_accumulation_without_loss_kwargs_matches_one_big_batch(tmp_path):
    """A forward without ``**kwargs`` (the Trainer's rule would divide by GA again) at GA = 2 equals one batch of 8."""
    dataset = as_dataset(masked_examples(8))
    options = dict(weighting="average", remove_unused_columns=False)
    full = trained_grads(tmp_path / "a", PerTokenModel(), dataset, **options)
    options.update(per_device_train_batch_size=4, gradient_accumulation_steps=2)
    accumulated = trained_grads(tmp_path / "b", PerTokenModel(), dataset, **options)
    assert max_relative_difference(full, accumulated) <= 1e-5


def test_a_trainer_without_loss_is_scaled_for_ga_is_refused(tmp_path, monkeypatch):
    """transformers < 5.19 has no ``Trainer.loss_is_scaled_for_ga`` and would divide the loss by GA a second time."""
    monkeypatch.delattr(Trainer, "loss_is_scaled_for_ga")
    with pytest.raises(ImportError, match=r"transformers>=5\.19"):
        MinimaxTrainer(model=PerTokenModel(), args=make_args(tmp_path))


@pytest.mark.slow
def test_labels_are_kept_with_task_ids_when_forward_has_no_labels_parameter(tmp_path):
    dataset = as_dataset(masked_examples(8))
    kept = trained_grads(tmp_path / "a", PerTokenModel(), dataset)  # remove_unused_columns=True
    reference = trained_grads(tmp_path / "b", PerTokenModel(), dataset, remove_unused_columns=False)
    assert max_relative_difference(reference, kept) == 0.0


def test_evaluation_computes_task_losses_for_a_model_without_labels_parameter(tmp_path):
    """The Trainer evaluates a loss only for models taking ``labels`` or ``return_loss``; MinimaxTrainer always can."""
    examples = masked_examples(6)
    model = PerTokenModel()
    trainer = MinimaxTrainer(model=model, args=make_args(tmp_path), eval_dataset=as_dataset(examples))
    metrics = trainer.evaluate()
    mask = examples["labels"] != -100
    with torch.no_grad():
        losses = torch.nn.functional.cross_entropy(
            model(examples["input_ids"])["logits"][mask], examples["labels"][mask], reduction="none"
        )
    ids = examples["task_ids"][mask]
    for t, name in enumerate(TASKS):
        assert metrics[f"eval_task_loss/{name}"] == pytest.approx(losses[ids == t].mean().item(), rel=1e-6)


def test_label_smoothing_factor_smooths_every_task_loss(tmp_path):
    args = make_args(tmp_path, weighting="average", label_smoothing_factor=0.2)
    trainer = MinimaxTrainer(model=tiny_bert(), args=args)
    batch = masked_examples(4)
    loss = one_step(trainer, batch)
    mask = batch["labels"] != -100
    log_probs = torch.log_softmax(tiny_bert()(input_ids=batch["input_ids"]).logits[mask], -1)
    nll = -log_probs.gather(1, batch["labels"][mask][:, None]).squeeze(1)
    smoothed = 0.8 * nll - 0.2 * log_probs.mean(-1)  # (1 - eps) * NLL + eps * cross-entropy with the uniform
    ids = batch["task_ids"][mask]
    expected = sum(smoothed[ids == t].mean() for t in range(len(TASKS))) / len(TASKS)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_compute_loss_func_is_refused_at_construction(tmp_path):
    with pytest.raises(ValueError, match="compute_loss_func"):
        MinimaxTrainer(model=PerTokenModel(), args=make_args(tmp_path), compute_loss_func=lambda *a, **k: 0)


def test_label_smoothing_with_a_model_returning_task_losses_fails_clearly(tmp_path):
    model = DictLossModel()
    model.config = PretrainedConfig()  # the Trainer reads config.problem_type when label smoothing is on
    trainer = MinimaxTrainer(model=model, args=make_args(tmp_path, label_smoothing_factor=0.1))
    with pytest.raises(ValueError, match="label_smoothing_factor"):
        one_step(trainer, {"x": torch.ones(4)})


def test_compute_metrics_gets_predictions_in_label_layout_with_the_sparse_head(tmp_path):
    examples = masked_examples(6)
    seen_shapes = []

    def argmax(logits, labels):
        seen_shapes.append((tuple(logits.shape[:-1]), tuple(labels.shape)))
        return logits.argmax(-1)

    def accuracy(prediction):
        mask = prediction.label_ids != -100
        return {"accuracy": float((prediction.predictions[mask] == prediction.label_ids[mask]).mean())}

    args = make_args(tmp_path, per_device_eval_batch_size=4)
    trainer = MinimaxTrainer(
        model=tiny_bert(),
        args=args,
        eval_dataset=as_dataset(examples),
        compute_metrics=accuracy,
        preprocess_logits_for_metrics=argmax,
    )
    assert trainer.mlm_head is not None
    metrics = trainer.evaluate()
    assert seen_shapes == [((4, 16), (4, 16)), ((2, 16), (2, 16))]
    with torch.no_grad():
        predicted = tiny_bert()(input_ids=examples["input_ids"]).logits.argmax(-1)
    mask = examples["labels"] != -100
    expected = (predicted[mask] == examples["labels"][mask]).float().mean().item()
    assert metrics["eval_accuracy"] == pytest.approx(expected)


@pytest.mark.slow
def test_two_process_evaluation_of_an_uneven_set_equals_one_process(tmp_path):
    """5 examples, 2 processes x batch 2: the sampler repeats 3 examples to fill the last batches; they never count."""
    env = checkout_env()
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
    out = tmp_path / "two"
    script = [str(SCRIPT), "--out", str(out), "--eval_examples", "5", "--batch_size", "2"]
    subprocess.run([*launch, *script], check=True, env=env)
    single = evaluate_both_modes(make_args(tmp_path, per_device_eval_batch_size=2), 5)
    reference = single["labels"]
    names = [f"eval_task_loss/{t}" for t in TASKS] + ["eval_mean_task_loss", "eval_worst_task_loss"]
    assert set(names) <= reference.keys()
    # a model's task_losses are means: mean * count is the sum up to rounding
    assert [single["task_losses"][n] for n in names] == pytest.approx([reference[n] for n in names], rel=1e-6)
    for rank in (0, 1):
        for mode, metrics in json.loads((out / f"eval-rank{rank}.json").read_text()).items():
            assert [metrics[n] for n in names] == [single[mode][n] for n in names], (rank, mode)


def test_gradnorm_with_a_task_first_seen_after_the_first_micro_batch(tmp_path):
    """GA = 2 and task 2 only in the second micro-batch: GradNorm balances the tasks measured at the first one."""
    examples = masked_examples(8)
    late = examples["task_ids"][:4] == 2
    first = {k: v[:4].clone() for k, v in examples.items()}
    first["labels"][late], first["task_ids"][late] = -100, -100
    second = {k: v[4:] for k, v in examples.items()}
    assert (second["task_ids"] == 2).any()
    args = make_args(tmp_path, weighting="gradnorm", per_device_train_batch_size=4, gradient_accumulation_steps=2)
    trainer = MinimaxTrainer(model=tiny_bert(), args=args)
    trainer.model.train()
    samples, _ = trainer.get_batch_samples(iter([first, second]), 2, torch.device("cpu"))
    trainer.current_gradient_accumulation_steps = 2
    for batch in samples:
        loss = trainer.compute_loss(trainer.model, batch)
        assert torch.isfinite(loss)
        loss.backward()
    assert torch.allclose(trainer.step_weights, torch.full((3,), 1 / 3))  # w = 1 for every present task, / T
    targets, grad = trainer.weighting.last_target_norms, trainer.weighting.task_weights.grad
    # first step: r_t = 1, so both measured tasks share the target mean(g_0, g_1); the unmeasured task is left alone
    assert torch.isfinite(targets).all() and targets[0] == targets[1] > 0 and targets[2] == 0
    g = grad[:2].abs()  # |dL_grad/dw_t| = g_t and the signs oppose around the mean
    assert targets[0] == pytest.approx(g.mean().item(), rel=1e-5) and grad[0] * grad[1] < 0 and grad[2] == 0


def plain_trainer_grads(tmp_path, examples, **overrides):
    """First-step gradients of the plain ``Trainer`` on ``BertForMaskedLM`` (mean loss over all targets)."""
    args = make_args(tmp_path, **overrides)
    plain_fields = {k: v for k, v in args.to_dict().items() if k in TrainingArguments.__dataclass_fields__}
    plain_args = TrainingArguments(**plain_fields)
    dataset = as_dataset({k: v for k, v in examples.items() if k != "task_ids"})
    trainer = Trainer(model=tiny_bert(), args=plain_args, train_dataset=dataset)
    recorder = GradRecorder()
    recorder.trainer = trainer
    trainer.add_callback(recorder)
    trainer.train()
    return recorder.grads


@pytest.mark.slow
@pytest.mark.parametrize("accumulation", [1, 2])
def test_proportional_gives_the_plain_trainer_gradient_on_bert_for_masked_lm(tmp_path, accumulation):
    """Reference: the plain Trainer on one batch of 8 (at GA > 1 it would sum BertForMaskedLM's micro-batch means)."""
    examples = masked_examples(8)
    plain = plain_trainer_grads(tmp_path / "plain", examples)
    options = dict(per_device_train_batch_size=8 // accumulation, gradient_accumulation_steps=accumulation)
    proportional = trained_grads(tmp_path / "p", tiny_bert(), as_dataset(examples), weighting="proportional", **options)
    assert max_relative_difference(plain, proportional) <= 1e-5
    average = trained_grads(tmp_path / "a", tiny_bert(), as_dataset(examples), weighting="average", **options)
    assert max_relative_difference(plain, average) > 1e-2  # the mean of task means is another objective


def test_proportional_with_a_model_returning_task_losses_is_the_mean_over_all_targets(tmp_path):
    examples = masked_examples(4)
    trainer = MinimaxTrainer(model=TaskLossBert(), args=make_args(tmp_path, weighting="proportional"))
    batch = {("target_task_ids" if k == "task_ids" else k): v for k, v in examples.items()}
    loss = one_step(trainer, batch)
    plain = tiny_bert()(**{k: v for k, v in examples.items() if k != "task_ids"}).loss
    assert loss.item() == pytest.approx(plain.item(), rel=1e-6)
