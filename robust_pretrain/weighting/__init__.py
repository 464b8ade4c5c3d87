"""Task-weighting strategies, one per module, and a registry by name."""

from __future__ import annotations

import inspect
from typing import Any

from .arguments import ALPHA_SCHEDULES, LOSS_NORMALIZATIONS, WeightingArguments
from .average import AverageWeighting
from .base import Weighting
from .doremi import DoReMiWeighting
from .dwa import DWAWeighting
from .gradnorm import GradNormWeighting
from .group_dro import GroupDROWeighting
from .hardmax import HardmaxWeighting
from .minimax import MinimaxWeighting
from .morbit import MorbitWeighting, project_to_simplex
from .proportional import ProportionalWeighting
from .uncertainty import UncertaintyWeighting

#: every weighting strategy by its registry name (``--weighting``)
WEIGHTINGS: dict[str, type[Weighting]] = {
    "proportional": ProportionalWeighting,
    "average": AverageWeighting,
    "minimax": MinimaxWeighting,
    "hardmax": HardmaxWeighting,
    "group_dro": GroupDROWeighting,
    "doremi": DoReMiWeighting,
    "morbit": MorbitWeighting,
    "uncertainty": UncertaintyWeighting,
    "gradnorm": GradNormWeighting,
    "dwa": DWAWeighting,
}


def accepted_options(name: str) -> set[str]:
    """Keyword options the strategy ``name`` accepts (its own and the base class's)."""
    if name not in WEIGHTINGS:
        raise ValueError(f"unknown weighting {name!r}; choose one of {sorted(WEIGHTINGS)}")
    cls = WEIGHTINGS[name]
    own = set(inspect.signature(cls.__init__).parameters) - {"self", "num_tasks", "kwargs"}
    base = set(inspect.signature(Weighting.__init__).parameters) - {"self", "num_tasks"}
    return own | (base if cls.loss_driven else set())


def build_weighting(name: str, num_tasks: int, **options: Any) -> Weighting:
    """Instantiate the strategy ``name``; options it does not accept raise a ``ValueError`` naming them."""
    unknown = set(options) - accepted_options(name)
    if unknown:
        accepted = sorted(accepted_options(name))
        raise ValueError(f"weighting {name!r} does not take {sorted(unknown)}; it accepts {accepted}")
    return WEIGHTINGS[name](num_tasks, **options)


__all__ = [
    "ALPHA_SCHEDULES",
    "LOSS_NORMALIZATIONS",
    "WEIGHTINGS",
    "AverageWeighting",
    "DWAWeighting",
    "DoReMiWeighting",
    "GradNormWeighting",
    "GroupDROWeighting",
    "HardmaxWeighting",
    "MinimaxWeighting",
    "MorbitWeighting",
    "ProportionalWeighting",
    "UncertaintyWeighting",
    "Weighting",
    "WeightingArguments",
    "accepted_options",
    "build_weighting",
    "project_to_simplex",
]
