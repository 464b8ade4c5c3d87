"""Each strategy against a hand-computed step, the simplex projection, state round trips and validation."""

import json
import math

import pytest
import torch

from robust_pretrain.weighting import WEIGHTINGS, build_weighting, project_to_simplex

ALL = torch.ones(3, dtype=torch.bool)


def weights_of(name: str, losses, present=ALL, **options) -> torch.Tensor:
    return build_weighting(name, len(losses), **options).weights(torch.tensor(losses), present)


def step_inputs(strategy) -> dict[str, torch.Tensor]:
    """The extra per-step inputs a strategy declares it needs (gradient norms, target counts)."""
    extra = {"grad_norms": torch.rand(strategy.num_tasks)} if strategy.needs_grad_norms else {}
    if strategy.needs_task_counts:
        extra["task_counts"] = torch.randint(1, 50, (strategy.num_tasks,)).float()
    return extra


def test_average_is_uniform_over_present_tasks():
    w = weights_of("average", [1.0, 5.0, 2.0], torch.tensor([True, False, True]))
    assert torch.allclose(w, torch.tensor([0.5, 0.0, 0.5]))


def test_minimax_is_softmax_of_alpha_times_losses():
    w = weights_of("minimax", [1.0, 2.0, 4.0], alpha=0.5)
    e = [math.exp(0.5), math.exp(1.0), math.exp(2.0)]
    assert torch.allclose(w, torch.tensor([x / sum(e) for x in e]), atol=1e-7)


def test_minimax_sqrt_schedule_floor_and_absent_tasks():
    strategy = build_weighting("minimax", 3, alpha=1.0, alpha_schedule="sqrt", weight_floor=0.2)
    present = torch.tensor([True, True, False])
    strategy.weights(torch.tensor([1.0, 1.0, 9.0]), present)  # step 0, alpha_0 = 1
    w = strategy.weights(torch.tensor([1.0, 2.0, 9.0]), present)  # step 1: alpha = sqrt(2)
    a = math.sqrt(2)
    soft = [1 / (1 + math.exp(a)), math.exp(a) / (1 + math.exp(a))]
    expected = [0.8 * soft[0] + 0.1, 0.8 * soft[1] + 0.1, 0.0]
    assert torch.allclose(w, torch.tensor(expected), atol=1e-6)


def test_minimax_ema_of_estimates():
    strategy = build_weighting("minimax", 2, loss_ema=0.75)
    strategy.weights(torch.tensor([4.0, 0.0]), torch.tensor([True, True]))
    strategy.weights(torch.tensor([0.0, 4.0]), torch.tensor([True, True]))
    # est_0 = 0.75*4 + 0.25*0 = 3, est_1 = 0.75*0 + 0.25*4 = 1
    assert strategy.estimates.tolist() == [3.0, 1.0]


def test_absent_task_keeps_its_estimate_and_gets_no_weight():
    strategy = build_weighting("minimax", 3)
    strategy.weights(torch.tensor([1.0, 2.0, 3.0]), ALL)
    w = strategy.weights(torch.tensor([5.0, 6.0, math.nan]), torch.tensor([True, True, False]))
    assert w[2] == 0 and strategy.estimates[2] == 3.0
    assert torch.isclose(w.sum(), torch.tensor(1.0))


def test_weigh_absent_tasks_weighs_an_absent_task_from_its_last_or_the_largest_estimate():
    strategy = build_weighting("minimax", 3, weigh_absent_tasks=True)
    w = strategy.weights(torch.tensor([1.0, 2.0, math.nan]), torch.tensor([True, True, False]))
    assert torch.allclose(w, torch.softmax(torch.tensor([1.0, 2.0, 2.0]), 0))  # never seen: the largest estimate
    w = strategy.weights(torch.tensor([5.0, math.nan, 4.0]), torch.tensor([True, False, True]))
    assert torch.allclose(w, torch.softmax(torch.tensor([5.0, 2.0, 4.0]), 0))  # absent: its last estimate
    assert build_weighting("doremi", 2).weigh_absent_tasks  # always, whatever the option says
    with pytest.raises(ValueError, match=r"'uncertainty' does not take \['weigh_absent_tasks'\]"):
        build_weighting("uncertainty", 2, weigh_absent_tasks=True)


def test_present_but_unobserved_task_uses_last_or_largest_estimate():
    strategy = build_weighting("hardmax", 3)
    observed = torch.tensor([True, True, False])
    w = strategy.weights(torch.tensor([1.0, 2.0, math.nan]), ALL, observed)
    # never seen: assumed as hard as the hardest seen task -> tie with task 1
    assert torch.allclose(w, torch.tensor([0.0, 0.5, 0.5]))


def test_hardmax_splits_ties_evenly():
    w = weights_of("hardmax", [3.0, 1.0, 3.0])
    assert torch.allclose(w, torch.tensor([0.5, 0.0, 0.5]))


def test_group_dro_multiplicative_update():
    strategy = build_weighting("group_dro", 3, dro_step_size=0.5, dro_smoothing=0.1)
    strategy.weights(torch.tensor([1.0, 2.0, 0.0]), ALL)
    w = strategy.weights(torch.tensor([1.0, 0.0, 2.0]), ALL)
    # q proportional to exp(0.5 * cumulative loss) = exp([1, 1, 1]) -> uniform
    assert torch.allclose(w, torch.full((3,), 1 / 3), atol=1e-6)
    w = strategy.weights(torch.tensor([2.0, 0.0, 0.0]), ALL)
    q = torch.tensor([math.exp(2.0), math.exp(1.0), math.exp(1.0)])
    assert torch.allclose(w, 0.9 * q / q.sum() + 0.1 / 3, atol=1e-6)


@pytest.mark.parametrize(
    ("v", "expected"),
    [
        ([0.5, 0.3, 0.2], [0.5, 0.3, 0.2]),  # already on the simplex
        ([1.0, 1.0, 1.0], [1 / 3, 1 / 3, 1 / 3]),  # shift by 2/3
        ([2.0, 0.0, 0.0], [1.0, 0.0, 0.0]),
        ([0.6, 0.6, -1.0], [0.5, 0.5, 0.0]),
        ([0.9, 0.4, 0.1], [0.75, 0.25, 0.0]),  # theta = 0.15, third coordinate clipped
    ],
)
def test_simplex_projection_on_known_vectors(v, expected):
    assert torch.allclose(project_to_simplex(torch.tensor(v)), torch.tensor(expected), atol=1e-6)


def test_simplex_projection_is_the_closest_point():
    torch.manual_seed(0)
    for _ in range(20):
        v = torch.randn(5) * 2
        p = project_to_simplex(v)
        assert p.min() >= 0 and abs(p.sum() - 1) < 1e-5
        for _ in range(50):
            q = torch.distributions.Dirichlet(torch.ones(5)).sample()
            assert (v - p).norm() <= (v - q).norm() + 1e-6


@pytest.mark.parametrize(
    ("v", "dtype", "expected"),
    [
        ([1e8, 0.0], torch.float32, [1.0, 0.0]),  # float32: 1e8 - 1 == 1e8, the sort-based test used to find no support
        ([1e8, 1e8 - 0.5], torch.float64, [0.75, 0.25]),
        ([1e30, -1e30, 3.0], torch.float32, [1.0, 0.0, 0.0]),
        ([3e38, 3e38], torch.float32, [0.5, 0.5]),  # near float32's largest value
        ([-1e20, -1e20 + 2**66, -1e20], torch.float64, [0.0, 1.0, 0.0]),
    ],
)
def test_simplex_projection_of_finite_vectors_of_any_magnitude(v, dtype, expected):
    p = project_to_simplex(torch.tensor(v, dtype=dtype))
    assert p.dtype == dtype
    assert torch.allclose(p, torch.tensor(expected, dtype=dtype), atol=1e-6)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_simplex_projection_refuses_non_finite_values(bad):
    with pytest.raises(ValueError, match="project_to_simplex needs finite values"):
        project_to_simplex(torch.tensor([bad, 0.0]))


def test_morbit_with_a_huge_loss_puts_all_weight_on_that_task():
    strategy = build_weighting("morbit", 3, morbit_step_size=0.01)
    w = strategy.weights(torch.tensor([1e10, 1.0, 0.0]), ALL)
    assert w.tolist() == [1.0, 0.0, 0.0]


def test_morbit_projected_ascent_step():
    strategy = build_weighting("morbit", 3, morbit_step_size=0.5)
    w = strategy.weights(torch.tensor([1.0, 0.0, 0.0]), ALL)
    # lambda = proj([1/3 + 0.5, 1/3, 1/3]) = [1/3+0.5, 1/3, 1/3] - 1/6
    assert torch.allclose(w, torch.tensor([2 / 3, 1 / 6, 1 / 6]), atol=1e-6)
    w = strategy.weights(torch.tensor([2.0, 0.0, 0.0]), ALL)
    assert torch.allclose(w, torch.tensor([1.0, 0.0, 0.0]), atol=1e-6)


def test_dwa_ratio_formula_over_windows():
    strategy = build_weighting("dwa", 2, dwa_window=2, dwa_temperature=2.0)
    both = torch.tensor([True, True])
    for losses in ([4.0, 2.0], [4.0, 2.0], [2.0, 2.0], [2.0, 2.0]):  # windows 0 and 1: uniform
        assert torch.allclose(strategy.weights(torch.tensor(losses), both), torch.tensor([0.5, 0.5]))
    w = strategy.weights(torch.tensor([1.0, 1.0]), both)  # window 2: r = [2/4, 2/2]
    e = [math.exp(0.5 / 2), math.exp(1.0 / 2)]
    assert torch.allclose(w, torch.tensor([e[0] / sum(e), e[1] / sum(e)]), atol=1e-6)


def test_uncertainty_weights_and_regularizer_gradient():
    strategy = build_weighting("uncertainty", 2)
    with torch.no_grad():
        strategy.log_vars.copy_(torch.tensor([0.0, math.log(2.0)]))
    present = torch.tensor([True, True])
    w = strategy.differentiable_weights(strategy.weights(torch.tensor([1.0, 1.0]), present), present)
    assert torch.allclose(w, torch.tensor([0.5, 0.25]))
    losses = torch.tensor([3.0, 2.0])
    ((w * losses).sum() + strategy.regularizer(present)).backward()
    # d/ds (0.5 e^{-s} L + 0.5 s) = -0.5 e^{-s} L + 0.5
    assert torch.allclose(strategy.log_vars.grad, torch.tensor([-1.5 + 0.5, -0.5 + 0.5]))


def test_gradnorm_targets_and_weight_gradient():
    strategy = build_weighting("gradnorm", 2, gradnorm_alpha=1.0)
    both = torch.tensor([True, True])
    strategy.weights(torch.tensor([2.0, 4.0]), both, grad_norms=torch.tensor([1.0, 1.0]))
    strategy.task_weights.grad = None
    w = strategy.weights(torch.tensor([1.0, 4.0]), both, grad_norms=torch.tensor([1.0, 3.0]))
    # Ltilde = [0.5, 1.0], r = [2/3, 4/3]; G = w*g = [1, 3], Gbar = 2 -> targets [4/3, 8/3]
    assert torch.allclose(strategy.last_target_norms, torch.tensor([4 / 3, 8 / 3]))
    # dL/dw = sign(G - target) * g = [-1, +3]
    assert torch.allclose(strategy.task_weights.grad, torch.tensor([-1.0, 3.0]))
    assert torch.allclose(w, torch.tensor([0.5, 0.5]))


def test_gradnorm_renormalises_weights_to_sum_T():
    strategy = build_weighting("gradnorm", 2)
    with torch.no_grad():
        strategy.task_weights.copy_(torch.tensor([3.0, 1.0]))
    w = strategy.weights(torch.tensor([1.0, 1.0]), torch.tensor([True, True]), grad_norms=torch.ones(2))
    assert torch.allclose(strategy.task_weights.detach(), torch.tensor([1.5, 0.5]))
    assert torch.allclose(w, torch.tensor([0.75, 0.25]))


def test_relative_and_excess_normalisation():
    rel = build_weighting("hardmax", 2, loss_normalization="relative")
    rel.weights(torch.tensor([10.0, 1.0]), torch.tensor([True, True]))
    # relative losses [0.5, 0.9]: the small-loss task is now the worst
    assert rel.weights(torch.tensor([5.0, 0.9]), torch.tensor([True, True])).tolist() == [0.0, 1.0]
    exc = build_weighting("hardmax", 2, loss_normalization="excess", reference_losses=[9.0, 0.0])
    assert exc.weights(torch.tensor([10.0, 2.0]), torch.tensor([True, True])).tolist() == [0.0, 1.0]


def test_gradient_identity_softmax_weights_equal_logsumexp_gradient():
    torch.manual_seed(0)
    theta = torch.randn(4, requires_grad=True)
    targets = torch.randn(5, 4)
    alpha = 1.7

    def task_losses():
        return ((theta - targets) ** 2).sum(dim=1) * torch.arange(1, 6)

    strategy = build_weighting("minimax", 5, alpha=alpha)
    losses = task_losses()
    w = strategy.weights(losses.detach(), torch.ones(5, dtype=torch.bool))
    (grad_weighted,) = torch.autograd.grad((w * losses).sum(), theta)
    (grad_smooth_max,) = torch.autograd.grad(torch.logsumexp(alpha * task_losses(), 0) / alpha, theta)
    assert torch.allclose(grad_weighted, grad_smooth_max, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(WEIGHTINGS))
def test_state_round_trips_through_json(name):
    torch.manual_seed(1)
    a, b = build_weighting(name, 4), build_weighting(name, 4)
    present = torch.tensor([True, True, False, True])
    extra = step_inputs(a)
    for _ in range(5):
        a.weights(torch.rand(4) * 3, present, **extra)
    b.load_state_dict(json.loads(json.dumps(a.state_dict(), allow_nan=False)))
    losses = torch.rand(4)
    assert torch.equal(a.weights(losses, present, **extra), b.weights(losses, present, **extra))
    assert a.state_dict() == b.state_dict()


def test_no_present_task_gives_zero_weights():
    for name in WEIGHTINGS:
        strategy = build_weighting(name, 2)
        extra = step_inputs(strategy)
        w = strategy.weights(torch.full((2,), math.nan), torch.zeros(2, dtype=torch.bool), **extra)
        assert torch.equal(w.detach(), torch.zeros(2)), name


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("minimax", {"alpha": 0.0}, "alpha must be > 0"),
        ("minimax", {"alpha_schedule": "linear"}, "alpha_schedule"),
        ("minimax", {"weight_floor": 1.0}, "weight_floor"),
        ("minimax", {"loss_normalization": "excess"}, "reference_losses"),
        ("minimax", {"dro_step_size": 0.1}, "does not take"),
        ("average", {"loss_normalization": "relative"}, "not loss-driven"),
        ("group_dro", {"dro_smoothing": 1.5}, "dro_smoothing"),
        ("dwa", {"dwa_window": 0}, "dwa_window"),
        ("nope", {}, "unknown weighting"),
    ],
)
def test_invalid_options_fail_with_the_option_named(name, options, message):
    with pytest.raises(ValueError, match=message):
        build_weighting(name, 3, **options)


def test_gradnorm_balances_only_the_tasks_with_a_measured_gradient_norm():
    strategy = build_weighting("gradnorm", 3, gradnorm_alpha=1.0)
    observed = torch.tensor([True, True, False])
    norms = torch.tensor([1.0, 3.0, math.nan])
    w = strategy.weights(torch.tensor([2.0, 4.0, math.nan]), ALL, observed, grad_norms=norms)
    # r = [1, 1] over the measured tasks; G = [1, 3], Gbar = 2 -> targets [2, 2]; task 2 keeps w = 1, no gradient
    assert torch.equal(strategy.last_target_norms, torch.tensor([2.0, 2.0, 0.0]))
    assert torch.equal(strategy.task_weights.grad, torch.tensor([-1.0, 3.0, 0.0]))
    assert torch.allclose(w, torch.full((3,), 1 / 3))


def test_proportional_weights_are_the_task_shares_of_the_step_targets():
    strategy = build_weighting("proportional", 3)
    present = torch.tensor([True, False, True])
    w = strategy.weights(torch.tensor([9.0, 1.0, 1.0]), present, task_counts=torch.tensor([30.0, 0.0, 10.0]))
    assert torch.equal(w, torch.tensor([0.75, 0.0, 0.25]))  # the losses play no part
    # sum_t w_t * S_t / N_t = sum_t S_t / N: the mean over all targets
    sums, counts = torch.tensor([60.0, 0.0, 5.0]), torch.tensor([30.0, 0.0, 10.0])
    assert (w * sums / counts.clamp_min(1)).sum() == pytest.approx(float(sums.sum() / counts.sum()))


def test_proportional_needs_the_task_counts():
    with pytest.raises(ValueError, match="task_counts"):
        build_weighting("proportional", 2).weights(torch.ones(2), torch.ones(2, dtype=torch.bool))


@pytest.mark.parametrize("name", sorted(WEIGHTINGS))
def test_what_the_weights_sum_to_as_documented(name):
    strategy = build_weighting(name, 4)
    present = torch.tensor([True, True, False, True])
    extra = step_inputs(strategy)
    for _ in range(3):
        w = strategy.weights(torch.rand(4) * 3, present, **extra)
    assert (w[2] > 0) if name == "doremi" else (w[2] == 0)  # doremi weighs every task, absent or not
    if name == "uncertainty":  # 0.5 * exp(-s_t) over the present tasks: 3/2 with s = 0
        assert w.sum().item() == pytest.approx(1.5)
    elif name == "gradnorm":  # w_t / T with w summing to T over all tasks
        assert w.sum().item() == pytest.approx(float(strategy.task_weights.detach()[present].sum() / 4))
        assert w.sum().item() == pytest.approx(0.75)
    else:
        assert w.sum().item() == pytest.approx(1.0)
