"""robust_pretrain.reporting.statistics: t quantiles, run means, paired t-intervals and the decision rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from robust_pretrain.reporting.statistics import (
    HELPS,
    HURTS,
    INCONCLUSIVE,
    NO_EFFECT_OF_THAT_SIZE,
    Interval,
    detectable_difference,
    mean_interval,
    paired_interval,
    run_means,
    t_quantile,
    verdict,
)


def test_t_quantiles_match_closed_forms_and_tables() -> None:
    # df = 1 is the Cauchy distribution: tan(pi (p - 1/2)); df = 2: (2p - 1) / sqrt(2 p (1 - p)).
    assert t_quantile(0.975, 1) == pytest.approx(math.tan(0.475 * math.pi), rel=1e-9)
    assert t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-4)
    assert t_quantile(0.975, 2) == pytest.approx(0.95 / math.sqrt(2 * 0.975 * 0.025), rel=1e-9)
    assert t_quantile(0.975, 3) == pytest.approx(3.182446, abs=1e-6)  # every t table
    assert t_quantile(0.95, 3) == pytest.approx(2.353363, abs=1e-6)
    assert t_quantile(0.5, 7) == 0.0
    with pytest.raises(ValueError, match="at least 1 degree of freedom"):
        t_quantile(0.975, 0)


def test_fine_tuning_seeds_are_averaged_within_each_pretraining_run() -> None:
    assert run_means({"42": [10.0, 20.0, 30.0], "43": [5.0]}) == {"42": 20.0, "43": 5.0}


def test_paired_interval_by_pretraining_seed() -> None:
    baseline = {"42": 10.0, "43": 12.0, "44": 11.0, "45": 15.0}
    other = {"45": 15.0, "44": 15.0, "43": 13.0, "42": 13.0}
    interval, unpaired = paired_interval(baseline, other)
    # differences 3, 1, 4, 0: mean 2, squared deviations 1 + 1 + 4 + 4 = 10, variance 10 / 3, df 3
    half = 3.182446 * math.sqrt(10 / 3) / 2
    assert (interval.mean, interval.n, interval.df) == (2.0, 4, 3)
    assert interval.std == pytest.approx(math.sqrt(10 / 3))
    assert interval.low == pytest.approx(2 - half, abs=1e-5) and interval.high == pytest.approx(2 + half, abs=1e-5)
    assert interval.seeds == ("42", "43", "44", "45") and unpaired == []
    # Unpaired analysis of the same numbers would ignore that seed 45 is high in both; pairing is what is tested:
    # a constant shift has zero spread, whatever the spread between seeds.
    shifted, _ = paired_interval(baseline, {seed: value + 1.5 for seed, value in baseline.items()})
    assert shifted.mean == 1.5 and shifted.std == 0 and shifted.low == shifted.high == 1.5
    assert verdict(shifted, 4.6) == INCONCLUSIVE  # no spread between runs: a floor, not evidence


def test_unpaired_seeds_are_left_out_and_named() -> None:
    interval, unpaired = paired_interval({"1": 1.0, "2": 2.0, "3": 0.0}, {"2": 4.0, "3": 1.0, "9": 7.0})
    assert interval.seeds == ("2", "3") and unpaired == ["1", "9"]
    # differences 2, 1: mean 1.5, std sqrt(0.5), df 1: half width 12.706 * sqrt(0.5) / sqrt(2) = 12.706 / 2
    assert interval.df == 1 and interval.high - interval.mean == pytest.approx(math.tan(0.475 * math.pi) / 2)
    with pytest.raises(ValueError, match="no pre-training seed in common"):
        paired_interval({"1": 1.0}, {"2": 1.0})


def test_single_run_has_no_interval() -> None:
    interval = mean_interval([3.0], seeds=["42"])
    assert (interval.n, interval.df, interval.low, interval.high, interval.std) == (1, 0, None, None, None)
    assert verdict(interval, 4.6) == INCONCLUSIVE
    assert interval.as_dict()["seeds"] == ["42"]


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [(0.1, 9.0, HELPS), (-3.0, -0.1, HURTS), (-3.0, 4.5, NO_EFFECT_OF_THAT_SIZE), (-3.0, 4.6, INCONCLUSIVE)],
)
def test_decision_rule(low: float, high: float, expected: str) -> None:
    interval = Interval((low + high) / 2, 1.0, 4, 3, 3.18, low, high, 0.95)
    assert verdict(interval, 4.6) == expected
    with pytest.raises(ValueError, match="smallest_effect must be > 0"):
        verdict(interval, 0)


@pytest.mark.parametrize(("pairs", "textbook"), [(3, 3.0965), (8, 1.1528)])
def test_the_detectable_difference_has_the_stated_power_by_simulation(pairs: int, textbook: float) -> None:
    """400,000 simulated paired designs with the returned mean difference (sd 1): a two-sided 5 % t-test rejects in
    80 % of them (binomial se 0.0006); the textbook approximation ``(t_.975 + t_.80) / sqrt(n)`` (tables: 3.0965 at 3
    pairs, 1.1528 at 8) falls short of 80 % at 3 pairs."""
    rng = np.random.default_rng(0)
    critical = t_quantile(0.975, pairs - 1)

    def rejected(effect: float) -> float:
        samples = rng.normal(effect, 1.0, size=(400_000, pairs))
        t = samples.mean(axis=1) / (samples.std(axis=1, ddof=1) / math.sqrt(pairs))
        return float(np.mean(np.abs(t) > critical))

    effect = detectable_difference(1.0, pairs)
    assert rejected(effect) == pytest.approx(0.8, abs=0.003)
    assert effect >= textbook
    if pairs == 3:
        assert rejected(textbook) < 0.79
