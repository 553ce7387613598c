"""benchmarks/verdicts.py: the benchmarks say a speed target is met only when the noise lets them."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from verdicts import median_interval, verdict


@pytest.mark.parametrize("rounds", [6, 9, 15, 30])
@pytest.mark.parametrize("noise", ["normal", "skewed"])
def test_the_interval_holds_the_true_median_as_often_as_it_says(rounds, noise):
    # Ratios with a known median (1.04), noisy as a busy machine's: symmetric, or with the long
    # right tail of runs slowed by something else on the machine.
    rng = random.Random(rounds)

    def draw() -> float:
        if noise == "normal":
            return rng.gauss(1.04, 0.02)
        return 1.04 - 0.02 * 0.6931 + rng.expovariate(1 / 0.02)  # exponential, shifted to median 1.04

    trials, held, said = 4000, 0, []
    for _ in range(trials):
        low, high, coverage = median_interval([draw() for _ in range(rounds)])
        held += low <= 1.04 <= high
        said.append(coverage)
    assert min(said) >= 0.95
    assert held / trials >= min(said) - 0.015  # sampling error of 4000 trials: about 0.004


def test_too_few_rounds_give_no_interval_and_no_verdict():
    assert median_interval([1.0, 1.01, 1.02, 1.03, 1.04]) is None
    said = verdict([1.0, 1.01, 1.02, 1.03, 1.04], target=1.05)
    assert said.startswith("can't tell") and "at least 6" in said


def test_a_verdict_is_met_or_not_met_only_when_the_whole_interval_is_on_one_side():
    under = [1.01, 1.03, 1.02, 1.04, 1.03, 1.02, 1.01, 1.03, 1.02]
    over = [r + 0.05 for r in under]
    astride = [1.03, 1.06, 1.04, 1.07, 1.05, 1.02, 1.06, 1.04, 1.03]
    assert verdict(under, 1.05).startswith("met: the median of 9 rounds is 1.020x")
    assert verdict(over, 1.05).startswith("not met:")
    said = verdict(astride, 1.05)
    assert said.startswith("can't tell:") and "holds 1.05x" in said
    # the median alone (1.04x) is under the target, but the rounds cannot tell it from 1.05x
