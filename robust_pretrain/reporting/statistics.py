"""Statistics that match a nested evidence design: pre-training runs, each fine-tuned with several seeds.

The unit that differs between pre-training objectives is the pre-training run, so fine-tuning seeds are averaged
within each run first (:func:`run_means`), objectives are compared paired by pre-training seed (same seed = same data
order and masks; :func:`paired_interval`) and every interval is a Student-t interval with ``n - 1`` degrees of
freedom, ``n`` the number of pre-training runs (or pairs) it rests on, which it reports.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from scipy.optimize import brentq
from scipy.stats import nct as noncentral_t
from scipy.stats import t as student_t

# Verdicts of :func:`verdict`.
HELPS, HURTS, NO_EFFECT_OF_THAT_SIZE, INCONCLUSIVE = "helps", "hurts", "no effect of that size", "inconclusive"


def t_quantile(probability: float, df: int) -> float:
    """The ``probability`` quantile of Student's t distribution with ``df >= 1`` degrees of freedom."""
    if df < 1:
        raise ValueError(f"a t quantile needs at least 1 degree of freedom, got {df}")
    return float(student_t.ppf(probability, df))


@dataclass(frozen=True)
class Interval:
    """Mean of ``n`` values with its sample std and two-sided ``confidence`` t-interval (df = n - 1); ``low`` and
    ``high`` are None for a single value. ``seeds`` names the pre-training seeds the values come from."""

    mean: float
    std: float | None
    n: int
    df: int
    t: float | None
    low: float | None
    high: float | None
    confidence: float
    seeds: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seeds": list(self.seeds)}


def mean_interval(values: Sequence[float], confidence: float = 0.95, seeds: Sequence[str] = ()) -> Interval:
    """The mean of independent ``values`` (one per pre-training run) and its t-interval with ``len(values) - 1`` df."""
    if not values:
        raise ValueError("no values to summarise")
    mean, n = statistics.fmean(values), len(values)
    if n == 1:
        return Interval(mean, None, 1, 0, None, None, None, confidence, tuple(seeds))
    std = statistics.stdev(values)
    quantile = t_quantile(0.5 + confidence / 2, n - 1)
    half = quantile * std / math.sqrt(n)
    return Interval(mean, std, n, n - 1, quantile, mean - half, mean + half, confidence, tuple(seeds))


def run_means(scores: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Per pre-training run (key), the mean of its fine-tuning seeds' scores: the run's one value in any comparison."""
    return {run: statistics.fmean(values) for run, values in scores.items()}


def paired_interval(
    baseline: Mapping[str, float], other: Mapping[str, float], confidence: float = 0.95
) -> tuple[Interval, list[str]]:
    """``other - baseline`` paired by pre-training seed (the mappings' keys): the mean difference over the seeds both
    have, its t-interval with ``pairs - 1`` df, and the seeds that only one of them has (left out, to be reported)."""
    common = [seed for seed in baseline if seed in other]
    if not common:
        raise ValueError(f"no pre-training seed in common: {sorted(baseline)} vs {sorted(other)}")
    unpaired = sorted({*baseline, *other} - set(common))
    differences = [other[seed] - baseline[seed] for seed in common]
    return mean_interval(differences, confidence, common), unpaired


def verdict(interval: Interval, smallest_effect: float) -> str:
    """The pre-registered reading of a difference's interval (higher is better): :data:`HELPS` if it lies above 0,
    :data:`HURTS` if below 0, :data:`NO_EFFECT_OF_THAT_SIZE` if its upper end is below ``smallest_effect`` (> 0),
    else :data:`INCONCLUSIVE`. Also inconclusive: a single pair (no interval) and differences without any spread
    (identical in every pair, as when every run sits at a majority-class floor): a zero-width interval says nothing
    about the variability between pre-training runs."""
    if smallest_effect <= 0:
        raise ValueError(f"smallest_effect must be > 0, got {smallest_effect}")
    if interval.low is None or interval.high is None or interval.std == 0:
        return INCONCLUSIVE
    if interval.low > 0:
        return HELPS
    if interval.high < 0:
        return HURTS
    if interval.high < smallest_effect:
        return NO_EFFECT_OF_THAT_SIZE
    return INCONCLUSIVE


def detectable_difference(std: float, n: int, confidence: float = 0.95, power: float = 0.8) -> float:
    """The smallest mean paired difference that ``n`` pairs with spread ``std`` detect with probability ``power`` in a
    two-sided t-test at ``confidence``, exactly: the ``d`` at which the noncentral t (df ``n - 1``, noncentrality
    ``d * sqrt(n) / std``) falls beyond ``+-t_{(1+confidence)/2, n-1}`` with probability ``power``. (The textbook
    ``(t_{(1+confidence)/2} + t_{power}) * std / sqrt(n)`` understates it: by 5 % at 3 pairs, 16 % at 2.)"""
    if n < 2:
        raise ValueError(f"a detectable difference needs at least 2 pairs, got {n}")
    if std == 0:
        return 0.0
    critical, df, scale = t_quantile(0.5 + confidence / 2, n - 1), n - 1, std / math.sqrt(n)

    def shortfall(effect: float) -> float:
        noncentrality = effect / scale
        # the lower tail by symmetry: scipy's cdf far below a large noncentrality is NaN
        rejected = noncentral_t.sf(critical, df, noncentrality) + noncentral_t.sf(critical, df, -noncentrality)
        return float(rejected) - power

    high = (critical + t_quantile(power, df)) * scale
    while shortfall(high) < 0:
        high *= 2
    return float(brentq(shortfall, 0.0, high, xtol=1e-12 * high))


def pairs_to_detect(std: float, effect: float, confidence: float = 0.95, power: float = 0.8, most: int = 1000) -> int:
    """The fewest pairs whose :func:`detectable_difference` at spread ``std`` is at most ``effect`` (> 0), up to
    ``most``; ``most + 1`` when even ``most`` pairs do not reach it."""
    if effect <= 0:
        raise ValueError(f"effect must be > 0, got {effect}")
    for n in range(2, most + 1):
        if detectable_difference(std, n, confidence, power) <= effect:
            return n
    return most + 1


def mean_std(values: Sequence[float]) -> dict[str, float]:
    """``{"mean", "std"}`` of ``values``: the sample standard deviation, 0 for a single value."""
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def worst_task(scores: Mapping[str, float], higher_is_better: bool) -> str:
    """The task with the worst score: the lowest if higher is better, else the highest (the first on a tie)."""
    return (min if higher_is_better else max)(scores, key=scores.__getitem__)
