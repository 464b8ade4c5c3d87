"""The options of the weighting strategies, declared once: the strategies' constructors, ``MinimaxTrainingArguments``
(which inherits this dataclass), the recipes and ``robust-pretrain-compare`` all read their defaults and accepted
values from here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from robust_pretrain.options import option, option_problems

LOSS_NORMALIZATIONS = ("raw", "relative", "excess")
ALPHA_SCHEDULES = ("constant", "sqrt")
EXCESS_CLIPPINGS = ("token", "domain")


@dataclass
class WeightingArguments:
    """The options a strategy's constructor takes (each strategy takes a subset: ``accepted_options(name)``)."""

    alpha: float = option(
        1.0,
        "minimax: softmax scale alpha (alpha_0 with the sqrt schedule); leave it unset with alpha_auto, which "
        "chooses alpha each step.",
        above=0,
    )
    alpha_auto: bool = option(
        False,
        "minimax: choose alpha each optimizer step (bisection, alpha >= 0) so that the weights' effective number of "
        "tasks exp(H(w)) over the present tasks equals alpha_auto_k; this makes the weights independent of the "
        "losses' unit. Needs alpha_schedule='constant' and alpha left at its default; the chosen alpha is logged "
        "as minimax_alpha.",
    )
    alpha_auto_k: float | None = option(
        None,
        "minimax: target effective number of tasks k >= 1 of alpha_auto (setting it turns alpha_auto on; 1 = "
        "hardmax, >= the number of present tasks |P| = uniform). Unset: k = sqrt(|P|), the weights' entropy half-way "
        "between hardmax (0) and uniform (log |P|).",
        minimum=1,
        description=">= 1",
    )
    alpha_schedule: str = option(
        "constant",
        "minimax: 'constant' alpha or 'sqrt' (alpha_k = alpha_0 * sqrt(k+1), after Thm 3.1; a heuristic for deep "
        "networks, see the docs' objectives page).",
        choices=ALPHA_SCHEDULES,
    )
    weight_floor: float = option(
        0.0, "minimax: mix eps of the uniform distribution into the weights.", minimum=0, below=1
    )
    loss_ema: float = option(0.0, "Loss-driven strategies: EMA factor of the task-loss estimates.", minimum=0, below=1)
    weigh_absent_tasks: bool = option(
        False,
        "Loss-driven strategies: weigh every task at every step, one absent from the step from its last estimate, "
        "instead of giving it weight 0 (the weights then sum to 1 over all tasks; always on for doremi).",
    )
    loss_normalization: str = option(
        "raw",
        "Loss-driven strategies: 'raw' (the paper), 'relative' (L_t / L_t at the first step) or 'excess' "
        "(max(L_t - reference_t, 0), needs reference_losses, reference_run or reference_model).",
        choices=LOSS_NORMALIZATIONS,
    )
    reference_losses: list[float] | None = option(
        None, "One reference loss per task, for loss_normalization='excess' (finite numbers)."
    )
    reference_model: str | None = option(
        None,
        "loss_normalization='excess' against a frozen reference model (DoReMi's online excess loss): a checkpoint of "
        "the trained model's class with the same vocabulary and tasks, run without gradient in eval mode on each "
        "optimizer step's first micro-batch; its per-task losses on the same targets are the step's reference.",
    )
    excess_clipping: str = option(
        "domain",
        "With reference_model: 'domain' clips the excess of the task's mean loss, max(mean l - mean l_ref, 0) (what "
        "minimax on the excess targets; the only one for a model returning task_losses), 'token' clips per target, "
        "the mean over a task's targets of max(l - l_ref, 0) (DoReMi's; robust-pretrain-mixture's default).",
        choices=EXCESS_CLIPPINGS,
    )
    dro_step_size: float = option(
        0.01, "group_dro, doremi: exponentiated-gradient step eta (DoReMi's: 1.0, the mixture's default).", above=0
    )
    dro_smoothing: float = option(1e-3, "group_dro, doremi: uniform smoothing eps (c).", minimum=0, below=1)
    morbit_step_size: float = option(0.01, "morbit: projected-ascent step gamma.", above=0)
    gradnorm_alpha: float = option(1.5, "gradnorm: asymmetry alpha.", minimum=0)
    dwa_temperature: float = option(2.0, "dwa: temperature tau.", above=0)
    dwa_window: int = option(20, "dwa: optimizer steps per loss-averaging window.", minimum=1)


#: The declared defaults, for the strategies' constructor signatures.
DEFAULTS = WeightingArguments()


def check_weighting_options(**values: Any) -> None:
    """Raise a ``ValueError`` naming every option in ``values`` that its declaration does not accept."""
    problems = option_problems(WeightingArguments, values, style="api", check_paths=False)
    if problems:
        raise ValueError("\n".join(problems))


__all__ = [
    "ALPHA_SCHEDULES",
    "DEFAULTS",
    "EXCESS_CLIPPINGS",
    "LOSS_NORMALIZATIONS",
    "WeightingArguments",
    "check_weighting_options",
]
