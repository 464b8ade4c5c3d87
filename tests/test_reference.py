"""Reference-relative objectives (issue 18 item 1): the online reference model (DoReMi's excess loss, exact under
DDP, accumulation and SIGKILL resume) and the static reference run (provenance recorded and checked)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ports import free_port
from processes import checkout_env
from safetensors.torch import load_file
from test_recipe_pretrain import _one_thread, argv, pretrained_run  # noqa: F401  (fixtures; the shared demo run)
from tiny_training import TASKS, TaskLossBert, masked_examples, one_step_args, tiny_bert

from robust_pretrain import MinimaxTrainer
from robust_pretrain.cli import UsageError
from robust_pretrain.reference import PROVENANCE_ENTRIES, ReferenceRun
from robust_pretrain.task_losses import TargetPositionsHead
from robust_pretrain.weighting import build_weighting

SCRIPT = Path(__file__).with_name("tiny_training.py")


@pytest.fixture(scope="module")
def reference_dir(tmp_path_factory) -> Path:
    """A saved tiny BERT of another initialisation than the trained one (``tiny_bert(seed=0)``)."""
    directory = tmp_path_factory.mktemp("reference-model")
    tiny_bert(seed=3).save_pretrained(directory)
    return directory


def task_means(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per-task mean cross-entropy of ``model`` on the batch's targets, computed here from full logits."""
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    mask = batch["labels"] != -100
    losses = torch.nn.functional.cross_entropy(logits[mask], batch["labels"][mask], reduction="none")
    ids = batch["task_ids"][mask]
    return torch.stack([losses[ids == t].mean() for t in range(len(TASKS))])


# ------------------------------------------------------------------------------------------- the strategy
def test_online_excess_is_the_clipped_difference_of_ema_estimates() -> None:
    weighting = build_weighting(
        "hardmax", 3, loss_normalization="excess", reference_model="ref", loss_ema=0.5
    )  # hardmax: the weight goes to the largest excess, which makes the normalised losses observable
    every = torch.ones(3, dtype=torch.bool)
    w = weighting.weights(torch.tensor([3.0, 2.0, 1.0]), every, reference_losses=torch.tensor([1.0, 1.5, 2.0]))
    assert w.tolist() == [1.0, 0.0, 0.0]  # excess (2, 0.5, 0): raw losses would pick the same, so step again
    w = weighting.weights(torch.tensor([1.0, 4.0, 1.0]), every, reference_losses=torch.tensor([1.0, 0.5, 2.0]))
    # EMA 0.5: losses (2, 3, 1), references (1, 1, 2) -> excess (1, 2, 0): task 1
    assert weighting.estimates.tolist() == [2.0, 3.0, 1.0]
    assert weighting.reference_estimates.tolist() == [1.0, 1.0, 2.0]
    assert w.tolist() == [0.0, 1.0, 0.0]
    state = json.loads(json.dumps(weighting.state_dict()))
    fresh = build_weighting("hardmax", 3, loss_normalization="excess", reference_model="ref", loss_ema=0.5)
    fresh.load_state_dict(state)
    assert fresh.reference_estimates.tolist() == [1.0, 1.0, 2.0]
    assert weighting.options()["reference_model"] == "ref"


def test_online_reference_is_required_exactly_when_declared() -> None:
    online = build_weighting("minimax", 2, loss_normalization="excess", reference_model="ref")
    with pytest.raises(ValueError, match="reference_losses are given at each step with a reference_model"):
        online.weights(torch.ones(2), torch.ones(2, dtype=torch.bool))
    static = build_weighting("minimax", 2, loss_normalization="excess", reference_losses=[1.0, 1.0])
    with pytest.raises(ValueError, match="only then"):
        static.weights(torch.ones(2), torch.ones(2, dtype=torch.bool), reference_losses=torch.ones(2))
    with pytest.raises(ValueError, match="reference_model needs loss_normalization='excess'"):
        build_weighting("minimax", 2, reference_model="ref")


# ------------------------------------------------------------------------------------------- the trainer
def test_reference_model_weights_follow_the_excess_on_the_same_targets(tmp_path, reference_dir) -> None:
    """Step 1's weights are softmax(alpha * max(L - L_ref, 0)), both losses recomputed here from full logits; the
    reference model is frozen, in eval mode, with its own target-only head; the loss is sum_t w_t L_t."""
    args = one_step_args(
        str(tmp_path), TASKS, alpha=20.0, loss_normalization="excess", reference_model=str(reference_dir)
    )
    trainer = MinimaxTrainer(model=tiny_bert(), args=args)
    reference = trainer.reference
    assert not reference.model.training and not any(p.requires_grad for p in reference.model.parameters())
    assert isinstance(reference.head, TargetPositionsHead)
    batch = masked_examples(8)
    trainer.model.train()
    samples, _ = trainer.get_batch_samples(iter([batch]), 1, torch.device("cpu"))
    trainer.current_gradient_accumulation_steps = 1
    loss = trainer.compute_loss(trainer.model, dict(samples[0]))

    trainer.model.eval()  # no dropout in tiny_bert: the same losses
    losses = task_means(trainer.model, batch)
    from transformers import BertForMaskedLM

    reference_losses = task_means(BertForMaskedLM.from_pretrained(reference_dir), batch)
    excess = (losses - reference_losses).clamp_min(0)
    assert excess.max() > 0.01 and excess.min() == 0  # the test means something: some excess, some clipped
    expected = torch.softmax(20.0 * excess, dim=0)
    assert torch.allclose(trainer.step_weights, expected, atol=1e-5)
    assert torch.allclose(trainer.weighting.reference_estimates, reference_losses, atol=1e-5)
    assert loss.item() == pytest.approx(float(expected @ losses), abs=1e-5)


def test_token_clipping_is_the_mean_of_the_per_target_clipped_excess(tmp_path, reference_dir) -> None:
    """``excess_clipping='token'`` (DoReMi's): step 1's weights are softmax(alpha * mean_t max(l - l_ref, 0)) over
    each task's targets, both models' per-target losses recomputed here from full logits (sparse heads in the
    trainer)."""
    args = one_step_args(
        str(tmp_path), TASKS, alpha=20.0, loss_normalization="excess", reference_model=str(reference_dir),
        excess_clipping="token",
    )  # fmt: skip
    trainer = MinimaxTrainer(model=tiny_bert(), args=args)
    batch = masked_examples(8)
    trainer.model.train()
    samples, _ = trainer.get_batch_samples(iter([batch]), 1, torch.device("cpu"))
    trainer.current_gradient_accumulation_steps = 1
    trainer.compute_loss(trainer.model, dict(samples[0]))

    from transformers import BertForMaskedLM

    trainer.model.eval()
    mask = batch["labels"] != -100
    losses = [target_losses(model, batch) for model in (trainer.model, BertForMaskedLM.from_pretrained(reference_dir))]
    clipped = (losses[0] - losses[1]).clamp_min(0)
    ids = batch["task_ids"][mask]
    excess = torch.stack([clipped[ids == t].mean() for t in range(len(TASKS))])
    of_means = torch.stack([(losses[0] - losses[1])[ids == t].mean().clamp_min(0) for t in range(len(TASKS))])
    assert (excess - of_means).abs().max() > 0.01  # clipping per target differs from clipping the means here
    assert torch.allclose(trainer.step_weights, torch.softmax(20.0 * excess, dim=0), atol=1e-5)
    assert trainer.weighting.options()["excess_clipping"] == "token"
    # a model that returns per-task losses only has no per-target losses to clip
    renamed = {("target_task_ids" if k == "task_ids" else k): v for k, v in batch.items()}
    with pytest.raises(ValueError, match="excess_clipping='token' clips per target.*use excess_clipping='domain'"):
        trainer._task_sums(TaskLossBert(), renamed, reference=True)


def target_losses(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``model``'s cross-entropy at each of the batch's targets, from full logits."""
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    mask = batch["labels"] != -100
    return torch.nn.functional.cross_entropy(logits[mask], batch["labels"][mask], reduction="none")


def test_reference_model_runs_only_on_the_first_micro_batch(tmp_path, reference_dir) -> None:
    args = one_step_args(str(tmp_path), TASKS, loss_normalization="excess", reference_model=str(reference_dir))
    trainer = MinimaxTrainer(model=tiny_bert(), args=args)
    calls = []
    trainer.reference.model.register_forward_hook(lambda *_: calls.append(1))
    trainer.model.train()
    batches = [masked_examples(4, seed=s) for s in (0, 1)]
    samples, _ = trainer.get_batch_samples(iter(batches), 2, torch.device("cpu"))
    trainer.current_gradient_accumulation_steps = 2
    for sample in samples:
        trainer.compute_loss(trainer.model, dict(sample))
    assert len(calls) == 1


def test_reference_means_under_accumulation_are_those_of_the_first_micro_batch(tmp_path, reference_dir) -> None:
    """With gradient accumulation the step's weights come from its first micro-batch: the reference model's per-task
    means on its targets (recomputed here from full logits), not its loss sums over the whole step's counts (which a
    1- and a 2-process run would get wrong alike)."""
    args = one_step_args(
        str(tmp_path), TASKS, alpha=20.0, loss_normalization="excess", reference_model=str(reference_dir),
        gradient_accumulation_steps=2,
    )  # fmt: skip
    trainer = MinimaxTrainer(model=tiny_bert(), args=args)
    first, second = masked_examples(8, seed=5), masked_examples(8, seed=6)
    trainer.model.train()
    samples, _ = trainer.get_batch_samples(iter([first, second]), 2, torch.device("cpu"))
    trainer.current_gradient_accumulation_steps = 2
    for sample in samples:
        trainer.compute_loss(trainer.model, dict(sample))

    from transformers import BertForMaskedLM

    reference_losses = task_means(BertForMaskedLM.from_pretrained(reference_dir), first)
    trainer.model.eval()  # no dropout in tiny_bert, and no optimizer step yet: the same losses
    excess = (task_means(trainer.model, first) - reference_losses).clamp_min(0)
    assert excess.max() > 0.01  # the weights depend on the reference means
    assert torch.allclose(trainer.weighting.reference_estimates, reference_losses, atol=1e-5)
    assert torch.allclose(trainer.step_weights, torch.softmax(20.0 * excess, dim=0), atol=1e-5)


def test_a_reference_model_of_another_vocabulary_is_refused(tmp_path) -> None:
    from transformers import BertConfig, BertForMaskedLM

    other = tmp_path / "other"
    BertForMaskedLM(
        BertConfig(vocab_size=80, hidden_size=32, num_hidden_layers=1, num_attention_heads=2)
    ).save_pretrained(other)
    args = one_step_args(str(tmp_path / "out"), TASKS, loss_normalization="excess", reference_model=str(other))
    with pytest.raises(
        UsageError, match=r"--reference_model .*other: its vocab_size 80 differs from the trained model's 64"
    ):
        MinimaxTrainer(model=tiny_bert(), args=args)


@pytest.mark.slow
def test_two_processes_with_accumulation_equal_one_process(tmp_path, reference_dir) -> None:
    """8 examples per step in 2 micro-batches: 1 process x 4 against 2 gloo processes x 2. The weights come from
    the first micro-batch, which pools the same 4 examples in both: weights and gradients agree."""
    env = checkout_env(OMP_NUM_THREADS="1")
    common = ["--max_steps", "3", "--num_examples", "16", "--grad_accum", "2", "--alpha", "20"]
    common += ["--reference_model", str(reference_dir)]
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(single), "--batch_size", "4", *common], check=True, env=env
    )
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
    subprocess.run([*launch, str(SCRIPT), "--out", str(ddp), "--batch_size", "2", *common], check=True, env=env)
    expected = json.loads((single / "weights-rank0.json").read_text())
    assert max(max(step) for step in expected) > 0.6  # the reference shapes the weights (uniform: 1/3)
    for rank in (0, 1):
        weights = json.loads((ddp / f"weights-rank{rank}.json").read_text())
        assert torch.allclose(torch.tensor(weights), torch.tensor(expected), atol=1e-6)
        grads = load_file(ddp / f"grads-rank{rank}.safetensors")
        reference = load_file(single / "grads-rank0.safetensors")
        assert (
            max(float((grads[k] - v).abs().max() / v.abs().max().clamp_min(1e-12)) for k, v in reference.items())
            <= 1e-5
        )


@pytest.mark.slow
def test_resume_after_sigkill_matches_uninterrupted_run(tmp_path, reference_dir) -> None:
    common = ["--num_examples", "32", "--batch_size", "4", "--max_steps", "6", "--save_steps", "3", "--loss_ema", "0.5"]
    common += ["--grad_accum", "2", "--alpha", "20", "--reference_model", str(reference_dir)]
    env = checkout_env()
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(straight), *common], check=True, env=env)
    crashed = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(killed), *common, "--kill_after_save", "3"], env=env
    )
    assert crashed.returncode == -9
    saved = json.loads((killed / "checkpoint-3" / "weighting_state.json").read_text())
    assert (
        saved["options"]["reference_model"] == str(reference_dir) and None not in saved["state"]["reference_estimates"]
    )
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(killed), *common, "--resume"], check=True, env=env)
    a, b = load_file(straight / "final" / "model.safetensors"), load_file(killed / "final" / "model.safetensors")
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-6
    trajectory = json.loads((straight / "weights-rank0.json").read_text())
    assert json.loads((killed / "weights-rank0.json").read_text()) == trajectory[3:]
    assert json.loads((straight / "final" / "weighting_state.json").read_text()) == json.loads(
        (killed / "final" / "weighting_state.json").read_text()
    )


# ------------------------------------------------------------------------------------------- the reference run
def write_report(directory: Path, losses: dict[str, float], provenance: dict | None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    report = {"tasks": list(losses), "eval_task_loss": losses}
    if provenance is not None:
        report["provenance"] = provenance
    (directory / "task_report.json").write_text(json.dumps(report))
    return directory


def test_reference_run_losses_are_taken_by_task_name(tmp_path) -> None:
    """(Its provenance check: tests/test_provenance.py.)"""
    run = ReferenceRun.load(write_report(tmp_path / "ref", {"a": 2.0, "b": 3.0, "c": 1.0}, None))
    assert run.provenance is None
    assert run.reference_losses(["b", "a"]) == [3.0, 2.0]
    with pytest.raises(ValueError, match=r"no held-out loss for task\(s\) \['d'\]"):
        run.reference_losses(["a", "d"])


# ------------------------------------------------------------------------------------------- the recipes
@pytest.mark.slow
def test_text_recipe_trains_against_a_reference_run_and_checks_its_provenance(pretrained_run, tmp_path, capsys):  # noqa: F811
    """The shared demo run is the reference: its report records its provenance; a run of the same recipe on the same
    data takes its held-out losses as reference_losses; another tokenizer is refused, in one line naming each
    differing entry, unless they are overridden."""
    from robust_pretrain.pretraining.pos_mlm import recipe as pos_mlm

    reference_dir, _ = pretrained_run
    reference = json.loads((reference_dir / "task_report.json").read_text())
    provenance = reference["provenance"]
    assert list(provenance) == list(PROVENANCE_ENTRIES) and provenance["tasks"] == reference["tasks"]
    assert len(provenance["held_out_data"]) == len(provenance["training_data"]) == 64
    assert len(provenance["tokenizer"]["sha256"]) == 64

    excess = ["--loss_normalization", "excess", "--reference_run", str(reference_dir)]
    result = pos_mlm.run(argv(tmp_path / "excess", *excess))
    report = result["report"]
    assert report["settings"]["reference_losses"] == [reference["eval_task_loss"][t] for t in reference["tasks"]]
    assert report["provenance"] == provenance

    capsys.readouterr()
    status = pos_mlm.main(argv(tmp_path / "other", *excess, "--vocab_size", "900", "--max_eval_samples", "64"))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("robust-pretrain-pos-mlm: error: ")]
    assert status == 2 and len(lines) == 1, err
    # another vocabulary: another tokenizer, other held-out input ids, another embedding size
    entries = "tokenizer held_out_data model_size"
    assert "tokenizer (" in lines[0] and f"pass --reference_mismatch_ok {entries} to use it anyway" in lines[0]
    allowed = ["--reference_mismatch_ok", *entries.split(), "--max_steps", "1"]
    overridden = pos_mlm.run(argv(tmp_path / "overridden", *excess, "--vocab_size", "900", *allowed))
    assert overridden["report"]["settings"]["reference_losses"] == report["settings"]["reference_losses"]


@pytest.mark.slow
def test_vision_recipe_trains_against_a_reference_model_and_refuses_other_modalities(tmp_path) -> None:
    """MM-MAE: a proportional run is the online reference of a minimax excess run (the reference's losses on the
    same masked patches are in the saved weighting state); a reference with other modalities is refused."""
    import test_recipe_multimae

    from robust_pretrain.pretraining.multimae import recipe as multimae

    def run(name: str, *extra: str) -> dict:
        with test_recipe_multimae.single_thread():
            return multimae.run(test_recipe_multimae.argv(tmp_path / name, *extra))

    reference = run("reference", "--weighting", "proportional")
    assert reference["report"]["provenance"]["tasks"] == ["rgb", "depth", "semseg"]
    excess = ["--loss_normalization", "excess", "--reference_model", str(tmp_path / "reference")]
    run("online", *excess)
    state = json.loads((tmp_path / "online" / "weighting_state.json").read_text())
    assert state["options"]["reference_model"] == str(tmp_path / "reference")
    assert all(value is not None and value > 0 for value in state["state"]["reference_estimates"])
    run("two-modalities", "--weighting", "proportional", "--modalities", "rgb", "depth", "--max_steps", "1")
    other = ["--reference_model", str(tmp_path / "two-modalities"), "--loss_normalization", "excess"]
    with pytest.raises(UsageError, match="--reference_model .*two-modalities: its modalities .* differs"):
        run("refused", *other)


def test_a_non_finite_reference_loss_is_named() -> None:
    weighting = build_weighting("minimax", 3, loss_normalization="excess", reference_model="ref")
    every = torch.ones(3, dtype=torch.bool)
    with pytest.raises(FloatingPointError, match=r"non-finite reference loss for task\(s\) \[1\] at step 0"):
        weighting.weights(torch.ones(3), every, reference_losses=torch.tensor([1.0, float("nan"), 1.0]))
