"""DoReMi's domain weights (issue 28 item 1): ``weighting='doremi'`` against an independent implementation of
Algorithm 1 of Xie et al., *DoReMi* (NeurIPS 2023), written here from the paper, step by step on per-token losses
recorded from a real proxy run with a reference model; and the closed form of equal excess, which must keep a rare
domain at its uniform share."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tiny_causal_lm import DOMAINS, domain_examples, make_args, tiny_llama
from tiny_training import as_dataset

from robust_pretrain import MinimaxTrainer
from robust_pretrain.weighting import build_weighting

ETA, C = 1.0, 1e-3


def doremi_algorithm_1(
    steps: list[tuple[np.ndarray, np.ndarray, np.ndarray]], k: int, eta: float, c: float
) -> np.ndarray:
    """Algorithm 1 (DoReMi's domain reweighting), one row ``alpha_t`` per step, from ``alpha_0 = u = 1/k``:

    ``lambda_t[i] = 1 / sum_{x in B_i} |x| * sum_{x in B_i} sum_j max(l_theta,j(x) - l_ref,j(x), 0)``,
    ``alpha'_t = alpha_{t-1} * exp(eta * lambda_t)``, ``alpha_t = (1 - c) alpha'_t / sum_i alpha'_t[i] + c u``.

    ``steps``: per step the proxy's and the reference's per-token losses and each token's domain. The paper's
    batches hold every domain; a domain absent from a step keeps its last ``lambda`` (DoReMi's code), one never seen
    takes the step's largest measured ``lambda``.
    """
    alpha = np.full(k, 1.0 / k)
    lam = np.full(k, np.nan)
    rows = []
    for proxy, reference, domain in steps:
        for i in range(k):
            tokens = domain == i
            if tokens.any():
                lam[i] = np.maximum(proxy[tokens] - reference[tokens], 0.0).sum() / tokens.sum()
        lam = np.where(np.isnan(lam), np.nanmax(lam), lam)
        updated = alpha * np.exp(eta * lam)
        alpha = (1 - c) * updated / updated.sum() + c / k
        rows.append(alpha)
    return np.array(rows)


def token_losses(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """Next-token losses of ``model`` from its full logits, and each target's domain (computed here, not by the
    trainer)."""
    with torch.no_grad():
        logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits.double()
    labels = inputs["labels"][:, 1:]
    mask = labels != -100
    losses = torch.nn.functional.cross_entropy(logits[:, :-1][mask], labels[mask], reduction="none")
    domains = inputs["task_ids"][:, None].expand_as(labels)[mask]
    return losses.numpy(), domains.numpy()


class RecordingTrainer(MinimaxTrainer):
    """Records each optimizer step's per-token losses of the proxy and of the reference (before the step's update)
    and the weights the trainer used."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.recorded: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.used: list[np.ndarray] = []

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training:
            proxy, domains = token_losses(model, inputs)
            reference, _ = token_losses(self.reference.model, inputs)
            self.recorded.append((proxy, reference, domains))
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if model.training:
            self.used.append(self.step_weights.double().numpy().copy())
        return loss


def imbalanced_examples() -> dict[str, torch.Tensor]:
    """18 / 9 / 3 sequences of the three domains: batches of 4 often miss the rare one."""
    examples = domain_examples(60, seed=1)
    keep = torch.cat([torch.nonzero(examples["task_ids"] == t).flatten()[:n] for t, n in enumerate((18, 9, 3))])
    return {name: values[keep] for name, values in examples.items()}


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory) -> RecordingTrainer:
    reference_dir = tmp_path_factory.mktemp("doremi-reference")
    tiny_llama(seed=3).save_pretrained(reference_dir)
    args = make_args(
        str(tmp_path_factory.mktemp("doremi-proxy")),
        weighting="doremi",
        loss_normalization="excess",
        reference_model=str(reference_dir),
        excess_clipping="token",
        dro_step_size=ETA,
        dro_smoothing=C,
        per_device_train_batch_size=4,
        max_steps=8,
        learning_rate=3e-2,
        data_seed=5,
    )
    trainer = RecordingTrainer(model=tiny_llama(), args=args, train_dataset=as_dataset(imbalanced_examples()))
    trainer.train()
    return trainer


def test_the_trainer_follows_algorithm_1_step_by_step(recorded_run: RecordingTrainer) -> None:
    recorded, used = recorded_run.recorded, np.array(recorded_run.used)
    expected = doremi_algorithm_1(recorded, len(DOMAINS), ETA, C)
    assert used.shape == expected.shape == (8, 3)
    difference = np.abs(used - expected).max()
    print(f"max |trainer - Algorithm 1| over 8 steps: {difference:.2e}")
    assert difference <= 1e-5
    # the run means something: the rare domain is missing from some steps, the weights moved away from uniform, and
    # the per-token clip differs from the clip of the domain means (the cheap variant would not pass)
    absent = [not (domains == 2).any() for _, _, domains in recorded]
    assert any(absent) and not all(absent)
    assert np.abs(expected - 1 / 3).max() > 0.05
    per_domain_gap = max(
        abs(np.maximum(p[d == t] - r[d == t], 0).mean() - max((p[d == t] - r[d == t]).mean(), 0))
        for p, r, d in recorded
        for t in range(3)
        if (d == t).any()
    )
    assert per_domain_gap > 0.05
    # the time average (the proxy's output) is over the full vectors, absent steps included
    assert np.allclose(used.sum(axis=1), 1.0, atol=1e-6) and (used[np.array(absent), 2] > 0.01).all()


def time_average(name: str, shares: list[float], batch: int, steps: int, **options) -> np.ndarray:
    """The weights of strategy ``name`` averaged over ``steps`` steps whose batches of ``batch`` sequences are drawn
    with the natural ``shares``, every domain with the same excess (loss 1.5 over a reference of 1.0)."""
    k = len(shares)
    weighting = build_weighting(name, k, loss_normalization="excess", reference_losses=[1.0] * k, **options)
    generator = torch.Generator().manual_seed(0)
    total = torch.zeros(k, dtype=torch.float64)
    for _ in range(steps):
        drawn = torch.multinomial(torch.tensor(shares), batch, replacement=True, generator=generator)
        present = torch.bincount(drawn, minlength=k) > 0
        w = weighting.weights(torch.full((k,), 1.5), present).double()
        total += w / w.sum()  # as the recipe's time average normalises each step's weights
    return (total / steps).numpy()


def test_equal_excess_keeps_a_rare_domain_at_its_uniform_share() -> None:
    """Closed form: with equal excess ``lambda`` for every domain, ``alpha_{t-1} exp(eta lambda)`` is proportional to
    ``alpha_{t-1}``, so ``alpha_t = (1 - c) alpha_{t-1} + c u = u`` at every step: the exported average is 1/4 each,
    however rarely a domain is drawn (natural shares .60/.30/.08/.02, batches of 16: the rarest is absent from about
    72 % of the steps)."""
    shares = [0.60, 0.30, 0.08, 0.02]
    doremi = time_average("doremi", shares, 16, 300, dro_step_size=ETA, dro_smoothing=C)
    print("doremi time average:", np.round(doremi, 6).tolist())
    assert np.abs(doremi - 0.25).max() < 1e-6
    # minimax weighing every domain (the mixture's minimax proxy) keeps them uniform too: softmax of equal losses
    minimax = time_average("minimax", shares, 16, 300, weigh_absent_tasks=True)
    assert np.abs(minimax - 0.25).max() < 1e-6
    # weight 0 while absent (group DRO, Sagawa's, also skips the update; minimax by default) starves the rare domain
    sagawa = time_average("group_dro", shares, 16, 300, dro_step_size=ETA, dro_smoothing=C)
    present_only = time_average("minimax", shares, 16, 300)
    print("group_dro time average:", np.round(sagawa, 4).tolist(), "minimax:", np.round(present_only, 4).tolist())
    assert sagawa[3] < 0.1 and present_only[3] < 0.1


def test_the_step_size_scales_the_exponent() -> None:
    """eta = 0.5, c = 0.1, two domains with excess (ln 4, 0) at both steps (reference 0): ``exp(0.5 ln 4) = 2``, so
    step 1 gives ``0.9 * (2, 1) / 3 + 0.05 = (0.65, 0.35)`` and step 2 ``0.9 * (1.3, 0.35) / 1.65 + 0.05 =
    (0.759091, 0.240909)`` (eta = 1 would give (0.77, 0.23) at step 1)."""
    doremi = build_weighting(
        "doremi", 2, loss_normalization="excess", reference_losses=[0.0, 0.0], dro_step_size=0.5, dro_smoothing=0.1
    )
    losses, both = torch.tensor([np.log(4.0), 0.0]), torch.ones(2, dtype=torch.bool)
    assert doremi.weights(losses, both).tolist() == pytest.approx([0.65, 0.35], abs=1e-6)
    assert doremi.weights(losses, both).tolist() == pytest.approx([0.9 * 1.3 / 1.65 + 0.05, 0.9 * 0.35 / 1.65 + 0.05])


def test_an_unseen_domain_takes_the_largest_known_excess_with_either_reference() -> None:
    """One rule in the held-out (static reference losses) and reference-model paths: domain 2, never measured, takes
    the largest known excess, 2 (losses 3 and 2 against references 1 and 1), whatever its own reference (5 held out:
    the old held-out rule took the largest loss, 3, minus 5: excess 0). eta = 1, c = 0: ``alpha = softmax((2, 1, 2))``
    = (0.4223, 0.1554, 0.4223)."""
    losses, present = torch.tensor([3.0, 2.0, float("nan")]), torch.tensor([True, True, False])
    options = dict(loss_normalization="excess", dro_step_size=1.0, dro_smoothing=0.0)
    held_out = build_weighting("doremi", 3, reference_losses=[1.0, 1.0, 5.0], **options)
    online = build_weighting("doremi", 3, reference_model="ref", **options)
    expected = np.exp([2.0, 1.0, 2.0]) / np.exp([2.0, 1.0, 2.0]).sum()
    assert held_out.weights(losses, present).tolist() == pytest.approx(expected.tolist(), abs=1e-6)
    reference = torch.tensor([1.0, 1.0, float("nan")])
    assert online.weights(losses, present, reference_losses=reference).tolist() == pytest.approx(expected.tolist())


def test_a_resumed_doremi_continues_exactly() -> None:
    """The state (estimates, the smoothed weights) survives JSON: the resumed strategy's next weights are the
    uninterrupted one's, bit for bit."""
    options = dict(loss_normalization="excess", reference_losses=[1.0, 1.0, 1.0], dro_step_size=ETA)
    steps = [([2.0, 1.5, 3.0], [1, 1, 0]), ([2.5, 1.0, 1.2], [1, 0, 1]), ([1.1, 1.9, 2.2], [1, 1, 1])]
    uninterrupted = build_weighting("doremi", 3, **options)
    for losses, present in steps[:2]:
        uninterrupted.weights(torch.tensor(losses), torch.tensor(present).bool())
    resumed = build_weighting("doremi", 3, **options)
    resumed.load_state_dict(json.loads(json.dumps(uninterrupted.state_dict())))
    losses, present = steps[2]
    expected = uninterrupted.weights(torch.tensor(losses), torch.tensor(present).bool())
    assert torch.equal(resumed.weights(torch.tensor(losses), torch.tensor(present).bool()), expected)
