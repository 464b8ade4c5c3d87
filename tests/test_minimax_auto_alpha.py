"""minimax with ``alpha_auto`` (issue 18, item 2): alpha chosen each step so that the effective number of tasks
``exp(H(w))`` of the weights actually used equals the target ``k``."""

import json
import math

import pytest
import torch
from test_trainer import first_step_grads, manual_objective, max_relative_difference, task_means_by_hand
from tiny_training import TASKS, masked_examples
from transformers import HfArgumentParser

from robust_pretrain import MinimaxTrainingArguments
from robust_pretrain.weighting import build_weighting
from robust_pretrain.weighting.minimax import ALPHA_AUTO_MAX_LOGIT, effective_number_of_tasks, solve_alpha

ALL = torch.ones(5, dtype=torch.bool)


def auto(num_tasks=5, **options):
    return build_weighting("minimax", num_tasks, alpha_auto=True, **options)


def neff_at(alpha: float, losses: torch.Tensor, floor: float = 0.0) -> float:
    """exp(H) of the floored softmax, written out independently of the library (float64)."""
    p = torch.softmax(alpha * losses.double(), dim=0)
    p = (1 - floor) * p + floor / losses.numel()
    return math.exp(-sum(float(x * math.log(x)) for x in p if x > 0))


@pytest.mark.parametrize("floor", [0.0, 0.2])
@pytest.mark.parametrize("k", [1.05, 1.5, 2.0, math.sqrt(5), 3.7, 4.99])
def test_target_is_met_by_the_weights_actually_used(k, floor):
    generator = torch.Generator().manual_seed(int(k * 100) + int(floor * 10))
    for _ in range(5):
        losses = torch.rand(5, generator=generator) * 3
        w = auto(alpha_auto_k=k, weight_floor=floor).weights(losses, ALL)
        reachable = neff_at(ALPHA_AUTO_MAX_LOGIT / float(losses.max() - losses.min()), losses, floor)
        assert abs(float(w.sum()) - 1) < 1e-6
        if k > reachable:
            assert abs(effective_number_of_tasks(w) - k) <= 1e-4
        else:  # not reachable with this floor: the cap, the closest approach
            assert effective_number_of_tasks(w) == pytest.approx(reachable, abs=1e-5)


def test_default_target_is_sqrt_of_the_present_tasks():
    strategy = auto()
    w = strategy.weights(torch.tensor([0.3, 2.0, 1.1, 0.7, 9.0]), torch.tensor([1, 1, 1, 0, 0], dtype=torch.bool))
    assert w[3] == 0 and w[4] == 0
    assert abs(effective_number_of_tasks(w[:3]) - math.sqrt(3)) <= 1e-4
    assert strategy.log_values()["minimax_alpha"] > 0


def test_root_finder_direction_and_tolerance():
    """A flipped bisection (moving the wrong end) or a loose tolerance misses these by far more than 1e-4; the
    chosen alpha falls as the target rises (more tasks need a flatter softmax)."""
    losses = torch.tensor([0.1, 0.5, 0.9, 2.0, 2.1], dtype=torch.float64)
    alphas = [solve_alpha(losses, k) for k in (1.2, 2.0, 3.0, 4.5)]
    assert all(a > b > 0 for a, b in zip(alphas, alphas[1:], strict=False))
    for k, alpha in zip((1.2, 2.0, 3.0, 4.5), alphas, strict=True):
        assert abs(neff_at(alpha, losses) - k) <= 1e-9
        # the root is unique: a little either side misses the target in the right direction
        assert neff_at(alpha * (1 - 1e-4), losses) > k > neff_at(alpha * (1 + 1e-4), losses)


def test_k_equal_to_the_number_of_tasks_gives_uniform_weights_and_alpha_zero():
    for k in (5.0, 7.0):
        strategy = auto(alpha_auto_k=k)
        w = strategy.weights(torch.tensor([0.3, 2.0, 1.1, 0.7, 9.0]), ALL)
        assert torch.allclose(w, torch.full((5,), 0.2), atol=1e-7)
        assert strategy.log_values() == {"minimax_alpha": 0.0}


def test_equal_losses_give_uniform_weights_for_any_target():
    strategy = auto(alpha_auto_k=1.0)
    w = strategy.weights(torch.full((5,), 1.7), ALL)
    assert torch.allclose(w, torch.full((5,), 0.2)) and strategy.log_values() == {"minimax_alpha": 0.0}


def test_k_to_one_approaches_hardmax_with_a_finite_alpha():
    losses = torch.tensor([0.3, 2.0, 1.1, 0.7, 1.9])
    previous = 0.0
    for k in (1.5, 1.1, 1.01, 1.001):
        w = auto(alpha_auto_k=k).weights(losses, ALL)
        assert float(w[1]) > previous
        previous = float(w[1])
    assert previous > 0.999
    strategy = auto(alpha_auto_k=1.0)
    w = strategy.weights(losses, ALL)
    alpha = strategy.log_values()["minimax_alpha"]
    assert math.isfinite(alpha) and alpha == pytest.approx(ALPHA_AUTO_MAX_LOGIT / 1.7, rel=1e-6)
    assert torch.equal(w, torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0]))


def test_weights_do_not_depend_on_the_loss_unit_or_offset():
    losses = torch.tensor([0.3, 2.0, 1.1, 0.7, 1.9])
    w = auto().weights(losses, ALL)
    assert torch.allclose(auto().weights(losses * 100, ALL), w, atol=1e-6)
    assert torch.allclose(auto().weights(losses + 5, ALL), w, atol=1e-6)


def test_resume_is_exact_through_json_state():
    generator = torch.Generator().manual_seed(0)
    a = auto(alpha_auto_k=2.5, loss_ema=0.9, loss_normalization="relative", weight_floor=0.05)
    for _ in range(4):
        a.weights(torch.rand(5, generator=generator) + 0.5, ALL)
    b = auto(alpha_auto_k=2.5, loss_ema=0.9, loss_normalization="relative", weight_floor=0.05)
    b.load_state_dict(json.loads(json.dumps(a.state_dict(), allow_nan=False)))
    assert b.log_values() == a.log_values()
    losses = torch.rand(5, generator=generator) + 0.5
    assert torch.equal(a.weights(losses, ALL), b.weights(losses, ALL))
    assert a.log_values() == b.log_values() and a.state_dict() == b.state_dict()


def test_options_name_alpha_auto_only_when_on():
    """A checkpoint written before alpha_auto existed records the same options as a run without it."""
    assert "alpha_auto" not in build_weighting("minimax", 3).options()
    assert auto(3).options()["alpha_auto"] is True and auto(3).options()["alpha_auto_k"] is None


def test_a_state_without_last_alpha_still_loads():
    state = build_weighting("minimax", 5).state_dict()
    del state["last_alpha"]
    strategy = auto()
    strategy.load_state_dict(state)
    assert strategy.log_values() == {}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"alpha_auto": True, "alpha_schedule": "sqrt"}, "alpha_schedule='sqrt' does not apply with alpha_auto"),
        ({"alpha_auto": True, "alpha": 2.0}, "alpha=2.0 does not apply with alpha_auto"),
        ({"alpha_auto_k": 2.0, "alpha_schedule": "sqrt"}, "alpha_schedule='sqrt' does not apply with alpha_auto"),
        ({"alpha_auto": True, "alpha_auto_k": 0.5}, "alpha_auto_k must be >= 1, got 0.5"),
    ],
)
def test_incoherent_combinations_are_refused(options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("'", "'")):
        build_weighting("minimax", 3, **options)


def test_a_target_alone_turns_alpha_auto_on():
    """So that ``compare --sweep alpha_auto_k=1.5,2`` needs nothing else."""
    strategy = build_weighting("minimax", 3, alpha_auto_k=2.0)
    assert strategy.alpha_auto and strategy.options()["alpha_auto"] is True
    w = strategy.weights(torch.tensor([0.1, 1.0, 3.0]), torch.ones(3, dtype=torch.bool))
    assert abs(effective_number_of_tasks(w) - 2.0) <= 1e-4


def test_compare_sweeps_the_target():
    from robust_pretrain.pretraining import compare

    runs = compare.plan_runs(["proportional", "minimax"], ["alpha_auto_k=1.5,2"])
    assert [name for name, _, _ in runs][1:] == ["minimax-alpha_auto_k=1.5", "minimax-alpha_auto_k=2"]


def test_only_minimax_takes_the_options(tmp_path):
    with pytest.raises(ValueError, match="alpha_auto: not used by weighting='average'"):
        MinimaxTrainingArguments(str(tmp_path), task_names=["a", "b"], weighting="average", alpha_auto=True)


def test_the_options_parse_from_the_command_line(tmp_path):
    parser = HfArgumentParser(MinimaxTrainingArguments)
    (args,) = parser.parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--task_names", "a", "b", "--alpha_auto", "--alpha_auto_k", "1.5"]
    )
    assert args.weighting_options()["alpha_auto"] is True and args.weighting_options()["alpha_auto_k"] == 1.5
    assert args.build_weighting().alpha_auto


def test_trainer_gradient_is_the_softmax_weighted_gradient_at_the_chosen_alpha(tmp_path):
    grads, trainer = first_step_grads(tmp_path, weighting=auto(len(TASKS), alpha_auto_k=2.0))
    alpha = float(trainer.weighting.last_alpha[0])
    logged = [entry for entry in trainer.state.log_history if "minimax_alpha" in entry]
    assert logged and logged[0]["minimax_alpha"] == alpha
    losses = task_means_by_hand(masked_examples(8)).double()
    weights = torch.softmax(alpha * losses, dim=0)  # by hand, at the alpha the trainer chose
    assert abs(math.exp(-float((weights * weights.log()).sum())) - 2.0) <= 1e-4
    assert torch.allclose(trainer.step_weights.double(), weights, atol=1e-5)
    expected = manual_objective(masked_examples(8), weights.float().tolist())
    assert max_relative_difference(expected, grads) <= 1e-5
