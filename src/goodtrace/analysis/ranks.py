"""Per-rank spread and stragglers (pure functions).

Spread: the partition of DESIGN.md section 4 computed on each detail rank's own timeline
(every rank in small runs, a sample including the slowest and fastest in large ones), beside
the step-time figures that SQL computed for every rank. Stragglers: (a) relative compute
speed = median over ranks of the median compute span ÷ this rank's median compute span;
(b) arrival lateness at each step's sync point against the earliest rank of that attempt.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from goodtrace.read.loaded import RankSummary, SessionInfo

NS = 1e9
SLOW_SPEED = 0.9  # a rank computing at < 90% of the reference speed is named
LATE_FRACTION = 0.5  # ... or one that is the last to arrive at more than half the sync points


@dataclasses.dataclass(frozen=True)
class RankFigure:
    rank: int
    host: str
    goodput: float | None  # None when the rank was not analysed record by record
    step_time_median_s: float | None
    step_time_p90_s: float | None
    compute_median_s: float | None
    relative_speed: float | None
    lateness_median_s: float | None
    late_fraction: float | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Straggler:
    rank: int
    host: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class RankSpread:
    ranks: int
    analysed: int  # ranks whose full partition was computed
    goodput_min: float | None
    goodput_median: float | None
    goodput_max: float | None
    step_time_median_min_s: float | None
    step_time_median_max_s: float | None
    per_rank: tuple[RankFigure, ...]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"per_rank": [r.to_dict() for r in self.per_rank]}


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def rank_figures(
    sessions: Sequence[SessionInfo],
    summaries: dict[int, RankSummary],
    goodput_by_rank: dict[int, float],
) -> list[RankFigure]:
    """One figure per rank over the given sessions (a rank's sessions combined by median)."""
    by_rank: dict[int, list[SessionInfo]] = {}
    for s in sessions:
        by_rank.setdefault(s.rank, []).append(s)
    compute = {
        r: _median([summaries[s.index].compute_median_ns for s in ss if s.index in summaries])
        for r, ss in by_rank.items()
    }
    reference = _median(list(compute.values()))
    figures = []
    for rank in sorted(by_rank):
        ss = by_rank[rank]
        sums = [summaries[s.index] for s in ss if s.index in summaries]
        c = compute[rank]
        step_med = _median([x.step_time_median_ns for x in sums])
        step_p90 = _median([x.step_time_p90_ns for x in sums])
        late = _median([x.lateness_median_ns for x in sums])
        figures.append(
            RankFigure(
                rank=rank,
                host=ss[-1].host,
                goodput=goodput_by_rank.get(rank),
                step_time_median_s=None if step_med is None else step_med / NS,
                step_time_p90_s=None if step_p90 is None else step_p90 / NS,
                compute_median_s=None if c is None else c / NS,
                relative_speed=None if c is None or reference is None or c <= 0 else reference / c,
                lateness_median_s=None if late is None else late / NS,
                late_fraction=_median([x.late_fraction for x in sums]),
            )
        )
    return figures


def spread_of(figures: Sequence[RankFigure]) -> RankSpread:
    goodputs = [f.goodput for f in figures if f.goodput is not None]
    medians = [f.step_time_median_s for f in figures if f.step_time_median_s is not None]
    return RankSpread(
        ranks=len(figures),
        analysed=len(goodputs),
        goodput_min=min(goodputs) if goodputs else None,
        goodput_median=statistics.median(goodputs) if goodputs else None,
        goodput_max=max(goodputs) if goodputs else None,
        step_time_median_min_s=min(medians) if medians else None,
        step_time_median_max_s=max(medians) if medians else None,
        per_rank=tuple(figures),
    )


def find_stragglers(figures: Sequence[RankFigure], ideal_step_s: float | None) -> list[Straggler]:
    """Ranks that compute slower than the others, or arrive last at most sync points."""
    if len(figures) < 2:
        return []
    floor = max(0.001, 0.02 * (ideal_step_s or 0.0))
    found = []
    for f in figures:
        reasons = []
        if f.relative_speed is not None and f.relative_speed < SLOW_SPEED:
            reasons.append(f"computes at {f.relative_speed:.0%} of the median rank's speed")
        if (
            f.late_fraction is not None and f.late_fraction > LATE_FRACTION
            and f.lateness_median_s is not None and f.lateness_median_s > floor
        ):
            reasons.append(
                f"last to arrive at {f.late_fraction:.0%} of sync points, "
                f"{f.lateness_median_s * 1e3:.1f} ms late (median)"
            )
        if reasons:
            found.append(Straggler(f.rank, f.host, "; ".join(reasons)))
    return found
