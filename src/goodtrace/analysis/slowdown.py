"""A rank that became slower than it was: a change point in its own compute (or step) time
per execution, with the onset step and the size (docs/semantics.md section 7.1).

Per session (one process of one rank), over its steady-state executions in order: the split
that best separates a lower level before from a higher level after (the largest shift of the
mean, weighted by the sizes of both sides, on times clipped at a high quantile so that one
spike cannot make a split). A rank is named when the shift is

- **sustained**: at least ``MIN_SIDE`` (10) executions on each side, and at least 90% of those from
  the onset above the midpoint of the two levels (a spike is not a change point);
- **large**: the median after exceeds the median before by ``MIN_INCREASE`` (10%) and by 3x
  the noise within the two sides (1.4826 x their pooled MAD);
- **its own**: with other ranks, larger by ``MIN_INCREASE`` than the other ranks' median change at
  the same step (a job-wide slowdown, or every rank waiting for one, names nobody).

Pure functions over the run model's cuts.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from goodtrace.analysis.evidence import MAD_TO_SIGMA
from goodtrace.analysis.executions import SessionSteps
from goodtrace.read.loaded import SessionInfo

__all__ = ["Slowdown", "find_slowdowns", "slowdown_of"]

NS = 1e9
MIN_SIDE = 10  # executions on each side of a change point: a level held for 10 steps
MIN_INCREASE = 0.10  # the level after is at least 10% above the level before
SUSTAINED = 0.9  # share of the executions from the onset on above the midpoint
NOISE_FACTOR = 3.0
CLIP_QUANTILE = 0.95  # times are clipped here before the split is searched


@dataclasses.dataclass(frozen=True)
class Slowdown:
    rank: int
    host: str
    attempt: int
    measure: str  # "compute" (the rank's compute spans per execution) or "step" (step time)
    onset_step: int  # the first step at the higher level
    before_s: float  # median per execution before the onset
    after_s: float  # ... from the onset on
    increase: float  # after / before - 1
    others_increase: float | None  # the other ranks' median change at the same step

    @property
    def reason(self) -> str:
        verb = "computes" if self.measure == "compute" else "steps"
        return (f"{verb} {self.increase:.0%} slower since step {self.onset_step} "
                f"({self.before_s * 1e3:.1f} -> {self.after_s * 1e3:.1f} ms per step)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"reason": self.reason}


def _series(cut: SessionSteps) -> tuple[str, Any, Any] | None:
    """(measure, steps, seconds) per steady-state execution in entry order: compute time where
    the session has compute spans, else the step time (:meth:`SessionSteps.step_ns`)."""
    import numpy as np

    steps = np.frombuffer(cut.exec_step, dtype=np.int64)
    window = np.frombuffer(cut.exec_window, dtype=np.int64)
    if len(steps) < 2 * MIN_SIDE + 1:
        return None
    compute = np.frombuffer(cut.exec_compute, dtype=np.int64) if len(cut.exec_compute) == len(steps) else None
    keep = np.arange(len(steps)) > 0  # the first execution (compile, warm-up) is not steady state
    if compute is not None and (compute[keep] > 0).mean() > 0.9:
        keep &= compute > 0
        return "compute", steps[keep], compute[keep] / NS
    keep &= window >= 0
    return "step", steps[keep], cut.step_ns()[window[keep]] / NS


def _change_point(x: Any) -> int | None:
    """The index of the first execution at the higher level, where the weighted shift of the
    mean of the clipped times is largest; None for no upward shift."""
    import numpy as np

    n = len(x)
    if n < 2 * MIN_SIDE:
        return None
    clipped = np.minimum(x, np.quantile(x, CLIP_QUANTILE))
    total = clipped.sum()
    k = np.arange(MIN_SIDE, n - MIN_SIDE + 1)
    before = np.cumsum(clipped)[k - 1]
    shift = (total - before) / (n - k) - before / k
    score = shift * np.sqrt(k * (n - k) / n)
    best = int(np.argmax(score))
    return int(k[best]) if shift[best] > 0 else None


def _judge(x: Any, k: int) -> tuple[float, float] | None:
    """(median before, median after) when the split at ``k`` is a sustained, large shift."""
    import numpy as np

    before, after = x[:k], x[k:]
    low, high = float(np.median(before)), float(np.median(after))
    if low <= 0 or high < low * (1 + MIN_INCREASE):
        return None
    noise = MAD_TO_SIGMA * float(np.median(np.concatenate([np.abs(before - low), np.abs(after - high)])))
    if high - low <= NOISE_FACTOR * noise:
        return None
    if (after > (low + high) / 2).mean() < SUSTAINED:
        return None
    return low, high


def _change_at(x: Any, steps: Any, onset_step: int) -> float | None:
    """Another rank's change at the same step: its median from there on / before, - 1."""
    import numpy as np

    k = int(np.searchsorted(steps, onset_step)) if np.all(np.diff(steps) >= 0) else int(np.argmax(steps >= onset_step))
    if k < MIN_SIDE or len(x) - k < MIN_SIDE:
        return None
    low = float(np.median(x[:k]))
    return float(np.median(x[k:])) / low - 1 if low > 0 else None


def slowdown_of(steps: Any, seconds: Any) -> tuple[int, float, float] | None:
    """One process's own slowdown in a series of times per execution (numpy arrays, in order):
    (onset step, median before, median after), or None. Without the comparison with other
    ranks (see :func:`find_slowdowns`)."""
    k = _change_point(seconds)
    levels = None if k is None else _judge(seconds, k)
    if k is None or levels is None:
        return None
    return int(steps[k]), levels[0], levels[1]


def find_slowdowns(
    sessions: Sequence[SessionInfo], cuts: Mapping[int, SessionSteps], attempt_of: Mapping[int, int],
) -> list[Slowdown]:
    """The sessions whose own time per execution rose by a sustained margin, with the onset."""
    series: dict[int, tuple[str, Any, Any]] = {}
    for info in sessions:
        cut = cuts.get(info.index)
        found = _series(cut) if cut is not None else None
        if found is not None:
            series[info.index] = found
    slowdowns = []
    for info in sessions:
        if info.index not in series:
            continue
        measure, steps, x = series[info.index]
        own = slowdown_of(steps, x)
        if own is None:
            continue
        onset, levels = own[0], own[1:]
        attempt = attempt_of.get(info.index, 0)
        others = [c for i, (m, s, y) in series.items()
                  if i != info.index and attempt_of.get(i, 0) == attempt and m == measure
                  and (c := _change_at(y, s, onset)) is not None]
        others_increase = statistics.median(others) if others else None
        increase = levels[1] / levels[0] - 1
        if others_increase is not None and increase - others_increase < MIN_INCREASE:
            continue
        slowdowns.append(Slowdown(info.rank, info.host, attempt, measure, onset, levels[0], levels[1], increase,
                                  others_increase))
    return sorted(slowdowns, key=lambda s: (s.attempt, s.onset_step, s.rank))
