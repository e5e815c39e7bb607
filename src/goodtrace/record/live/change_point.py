"""The slowdown rule: a change point in one process's own time per step (docs/semantics.md
section 7.1), in the standard library only, so that the report (goodtrace.analysis.slowdown),
``goodtrace watch`` and the live line (record/live/slowdown.py) apply the same rule.

Over a series of times per execution, in order: the split that best separates a lower level
before from a higher level after (the largest shift of the mean, weighted by the sizes of both
sides, on times clipped at a high quantile so that one spike cannot make a split). It is a
slowdown when it is

- **sustained**: at least ``MIN_SIDE`` (10) executions on each side, and at least 90% of those
  from the onset above the midpoint of the two levels (a spike is not a change point);
- **large**: the median after exceeds the median before by ``MIN_INCREASE`` (10%) and by 3x
  the noise within the two sides (1.4826 x their pooled MAD);
- **its own** (:func:`its_own`): with other ranks, larger by ``MIN_INCREASE`` than the other
  ranks' median change at the same step (a job-wide slowdown, or every rank waiting for one,
  names nobody).

Linear in the series, but for the medians and the quantile (on an array, a selection of the order
statistics they need; on the live line's short history, a sort). The rule is written
once, in the standard library, for the live path; a numpy array (the report's series, millions
of executions long) takes the same operations on arrays, in the same order, so that the
results are equal to the bit (``tests/analysis/test_change_point_arrays.py``) while holding 8
bytes an execution instead of a Python float object each.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import statistics
from collections.abc import Sequence
from typing import Any, NamedTuple

__all__ = ["MIN_INCREASE", "MIN_SIDE", "Levels", "OwnSlowdown", "Verdict", "change_at", "change_point", "interpolate",
           "its_own", "judge", "own_slowdown",
           "slower_since"]

MIN_SIDE = 10  # executions on each side of a change point: a level held for 10 steps
MIN_INCREASE = 0.10  # the level after is at least 10% above the level before
SUSTAINED = 0.9  # share of the executions from the onset on above the midpoint
NOISE_FACTOR = 3.0
CLIP_QUANTILE = 0.95  # times are clipped here before the split is searched
MAD_TO_SIGMA = 1.4826  # makes a median absolute deviation comparable to a standard deviation


def interpolate(low: float, high: float, fraction: float) -> float:
    """The value ``fraction`` of the way from ``low`` to ``high``, as NumPy's default (linear)
    quantile interpolates between two order statistics, to the bit (from the upper one when
    the fraction is 0.5 or more): the one rule of every quantile goodtrace reports."""
    d = high - low
    return high - d * (1 - fraction) if fraction >= 0.5 else low + d * fraction


def _quantile(x: Sequence[float], q: float) -> float:
    """The ``q`` quantile with linear interpolation between order statistics (NumPy's default)."""
    ordered = sorted(x)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return interpolate(ordered[low], ordered[high], position - low)


def _weights(n: int) -> list[float]:
    """sqrt(k (n - k) / n) for each split k of ``n``; kept for short series (the live
    history's ``n`` repeats), not for a report's long ones."""
    return _short_weights(n) if n <= 4096 else _weights_of(n)


def _weights_of(n: int) -> list[float]:
    return [math.sqrt(k * (n - k) / n) for k in range(MIN_SIDE, n - MIN_SIDE + 1)]


_short_weights = functools.lru_cache(maxsize=8)(_weights_of)


def _is_array(x: object) -> bool:
    return hasattr(x, "dtype")  # a numpy array: numpy is imported by whoever made it


def _median(x: Any) -> float:
    """statistics.median: the middle value, or the mean of the two middle ones ((a + b) / 2)."""
    if not _is_array(x):
        return float(statistics.median(x))
    import numpy as np

    n = len(x)
    middle = np.partition(x, [(n - 1) // 2, n // 2])
    return float(middle[n // 2]) if n % 2 else float((middle[n // 2 - 1] + middle[n // 2]) / 2)


def _change_point_array(x: Any) -> int | None:
    """:func:`change_point` on a numpy array: the same operations, element by element."""
    import numpy as np

    n = len(x)
    position = CLIP_QUANTILE * (n - 1)
    low = math.floor(position)
    high = min(low + 1, n - 1)
    # the two order statistics the quantile needs (the values a full sort puts there), in linear time
    ordered = np.partition(x, [low, high])
    cap = float(ordered[low]) + (float(ordered[high]) - float(ordered[low])) * (position - low)
    del ordered
    cumulative = np.cumsum(np.where(x < cap, x, cap))  # add.accumulate: one addition after another
    total = float(cumulative[-1])
    k = np.arange(MIN_SIDE, n - MIN_SIDE + 1, dtype=np.int64)
    before = cumulative[MIN_SIDE - 1:MIN_SIDE - 1 + len(k)]
    del cumulative
    weight = np.sqrt((k * (n - k)) / n)
    scores = ((total - before) / (n - k) - before / k) * weight
    best = int(np.argmax(scores))  # the first of equal scores
    return best + MIN_SIDE if scores[best] > 0 else None


def change_point(x: Sequence[float]) -> int | None:
    """The index of the first execution at the higher level, where the weighted shift of the
    mean of the clipped times is largest; None for no upward shift."""
    n = len(x)
    if n < 2 * MIN_SIDE:
        return None
    if _is_array(x):
        return _change_point_array(x)
    cap = _quantile(x, CLIP_QUANTILE)
    cumulative = list(itertools.accumulate([v if v < cap else cap for v in x]))
    total = cumulative[-1]
    # the shift of the mean at each split k, weighted by sqrt(k (n - k) / n): positive weights,
    # so the best score is positive exactly when its shift is
    scores = [((total - before) / (n - k) - before / k) * weight
              for k, before, weight in zip(range(MIN_SIDE, n - MIN_SIDE + 1), cumulative[MIN_SIDE - 1:], _weights(n),
                                           strict=False)]
    best = max(range(len(scores)), key=scores.__getitem__)  # the first of equal scores
    return best + MIN_SIDE if scores[best] > 0 else None


class Levels(NamedTuple):
    """The medians on each side of a change point."""

    before: float
    after: float


class OwnSlowdown(NamedTuple):
    """One process's slowdown: the first step at the higher level and the two levels."""

    onset_step: int
    before: float
    after: float


class Verdict(NamedTuple):
    """Whether a slowdown is a rank's own, and the other ranks' median change (None without others)."""

    own: bool
    others_median: float | None


def judge(x: Sequence[float], k: int) -> Levels | None:
    """(median before, median after) when the split at ``k`` is a sustained, large shift."""
    before: Any = x[:k]
    after: Any = x[k:]
    low, high = _median(before), _median(after)
    if low <= 0 or high < low * (1 + MIN_INCREASE):
        return None
    if _is_array(x):
        import numpy as np

        deviations: Any = np.concatenate((np.abs(before - low), np.abs(after - high)))
    else:
        deviations = [abs(v - low) for v in before] + [abs(v - high) for v in after]
    noise = MAD_TO_SIGMA * _median(deviations)
    del deviations
    if high - low <= NOISE_FACTOR * noise:
        return None
    midpoint = (low + high) / 2
    above = int((after > midpoint).sum()) if _is_array(after) else sum(1 for v in after if v > midpoint)
    if above < SUSTAINED * len(after):
        return None
    return Levels(float(low), float(high))


def own_slowdown(steps: Sequence[int], x: Sequence[float]) -> OwnSlowdown | None:
    """One process's own slowdown in its times per execution ``x`` (steps alongside, in
    order): (onset step, median before, median after), or None. Without the comparison with
    other ranks (:func:`its_own`)."""
    k = change_point(x)
    levels = None if k is None else judge(x, k)
    if k is None or levels is None:
        return None
    return OwnSlowdown(int(steps[k]), levels.before, levels.after)


def change_at(steps: Sequence[int], x: Sequence[float], onset_step: int) -> float | None:
    """Another rank's change at a step: its median from there on / before, - 1 (None without
    ``MIN_SIDE`` executions on each side)."""
    if isinstance(steps, range) and steps.step > 0:
        k = bisect.bisect_left(steps, onset_step)
    elif _is_array(steps):
        import numpy as np

        values: Any = steps
        ordered = len(values) < 2 or bool((values[1:] >= values[:-1]).all())
        reached = values >= onset_step
        k = int(np.searchsorted(values, onset_step, side="left")) if ordered else \
            int(np.argmax(reached)) if bool(reached.any()) else len(values)
    elif all(a <= b for a, b in itertools.pairwise(steps)):
        k = bisect.bisect_left(steps, onset_step)
    else:
        k = next((i for i, s in enumerate(steps) if s >= onset_step), len(steps))
    if k < MIN_SIDE or len(x) - k < MIN_SIDE:
        return None
    low = _median(x[:k])
    return float(_median(x[k:])) / low - 1 if low > 0 else None


def its_own(increase: float, others: Sequence[float]) -> Verdict:
    """Whether a rank's ``increase`` is its own against the other ranks' changes at its onset
    (all of them, whatever their own verdict), and their median (None without others)."""
    if not others:
        return Verdict(True, None)
    median = float(statistics.median(others))
    return Verdict(increase - median >= MIN_INCREASE, median)


def slower_since(measure: str, increase: float, onset_step: int) -> str:
    """The words: "computes 30% slower since step 15" ("steps ..." for the step time)."""
    verb = "computes" if measure == "compute" else "steps"
    return f"{verb} {increase:.0%} slower since step {onset_step}"
