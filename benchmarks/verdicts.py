"""Whether a measured ratio meets its target, said with the noise of the machine it was measured on.

The benchmarks time ``fit`` and the loop it is compared with back to back, round after round,
and take each round's ratio. On a busy machine one round's ratio moves by several per cent, as
much as the targets' margins, so a median alone can land on either side of a target from one
run to the next. Here the median of the rounds comes with a distribution-free confidence
interval (two of the sorted rounds, chosen by the binomial distribution: no assumption about
the noise's shape), and the verdict is "met" only when the whole interval is at or under the
target, "not met" only when it is all above, and otherwise says the runs cannot tell.

>>> median_interval([1.0, 1.1, 1.2, 1.3, 1.4, 1.5])
(1.0, 1.5, 0.96875)
>>> verdict([1.01, 1.02, 1.03, 1.02, 1.04, 1.01], target=1.05)
'met: the median of 6 rounds is 1.020x, its 96.9 % interval 1.010x-1.040x'
"""

from __future__ import annotations

import math
import statistics
from typing import Optional, Sequence


def median_interval(values: Sequence[float], confidence: float = 0.95) -> Optional[tuple[float, float, float]]:
    """The narrowest interval of two order statistics, ``(k-th smallest, k-th largest)``, that holds
    the median of whatever distribution gave ``values`` with probability at least ``confidence``,
    and that probability; None when there are too few values for it (fewer than 6 at 95 %)."""
    ordered = sorted(values)
    n = len(ordered)
    # The k-th smallest of n draws is above the median when at most k - 1 draws are below it:
    # a Binomial(n, 1/2) count. The interval misses on either side with that probability.
    below = 0.0
    best = None
    for k in range(1, n // 2 + 1):
        below += math.comb(n, k - 1) / 2**n
        coverage = 1 - 2 * below
        if coverage < confidence:
            break
        best = (ordered[k - 1], ordered[n - k], coverage)
    return best


def verdict(ratios: Sequence[float], target: float, confidence: float = 0.95) -> str:
    """``met``, ``not met`` or ``can't tell`` for ``ratios`` (one per round) against ``target`` (at most)."""
    median = statistics.median(ratios)
    interval = median_interval(ratios, confidence)
    if interval is None:
        # n rounds all on one side of the median: probability 2 / 2**n, which must be at most 1 - confidence.
        fewest = math.ceil(math.log2(2 / (1 - confidence)))
        return (
            f"can't tell: {len(ratios)} rounds give no {confidence * 100:g} % interval for their median "
            f"({median:.3f}x); run at least {fewest}"
        )
    low, high, coverage = interval
    said = (
        f"the median of {len(ratios)} rounds is {median:.3f}x, its {coverage * 100:.1f} % interval "
        f"{low:.3f}x-{high:.3f}x"
    )
    if high <= target:
        return f"met: {said}"
    if low > target:
        return f"not met: {said}"
    return f"can't tell: {said}, which holds {target:g}x; more rounds narrow it"


__all__ = ["median_interval", "verdict"]
