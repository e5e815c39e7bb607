"""Per-rank spread and stragglers (pure functions over every rank's cut sessions).

Every rank is analysed: its goodput (its own partition, in totals), its step times and its
outermost compute time per execution come from the same cut as the reference rank's. A rank is
compared with the median of the *other* ranks, never with a median that includes itself (with
two ranks that would hide the slow one):

- relative compute speed = the other ranks' median compute time per execution ÷ this rank's;
- arrival lateness at sync points: when its steps became ready on the aligned clock, minus the
  other ranks' median, and how often it was the last;
- span-start lateness: how long after entering a sampled step it entered each span of that step,
  minus the other ranks' median, per span name. With a collective inside the step every rank
  finishes (and starts the next step) together, but the slow rank enters the span that holds the
  collective late. Offsets within the rank's own step need no clock alignment, so ranks that run
  independently and drift apart are not named for it.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from goodtrace.analysis.clock import SessionClock
from goodtrace.analysis.executions import SessionSteps
from goodtrace.read.loaded import SessionInfo, SessionRecords

NS = 1e9
SLOW_SPEED = 0.9  # a rank computing at < 90% of the other ranks' speed is named
LATE_FRACTION = 0.5  # ... or one that is the last to arrive at more than half the sync points


@dataclasses.dataclass(frozen=True)
class RankFigure:
    rank: int
    host: str
    goodput: float | None
    step_time_median_s: float | None
    step_time_p90_s: float | None
    compute_median_s: float | None
    relative_speed: float | None  # the other ranks' median compute time / this rank's
    lateness_median_s: float | None  # sync points, vs the other ranks' median
    late_fraction: float | None  # share of sync points where this rank was the last
    start_lateness_s: float | None = None  # the largest median span-start lateness, by span name
    late_span: str | None = None  # ... of this span

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
    analysed: int  # ranks whose partition was computed (all of them)
    goodput_min: float | None
    goodput_median: float | None
    goodput_max: float | None
    step_time_median_min_s: float | None
    step_time_median_max_s: float | None
    per_rank: tuple[RankFigure, ...]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"per_rank": [r.to_dict() for r in self.per_rank]}


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _leave_one_out(values: dict[int, float]) -> dict[int, float]:
    """Per key, the median of the other keys' values (keys with a value only, at least two)."""
    import numpy as np

    if len(values) < 2:
        return {}
    keys = np.fromiter(values.keys(), dtype=np.int64, count=len(values))
    v = np.fromiter(values.values(), dtype=np.float64, count=len(values))
    order = np.argsort(v, kind="stable")
    s = v[order]
    n = len(s) - 1  # the others
    i = np.arange(len(s))

    def at(j: int) -> Any:  # element j of the sorted values without position i, for every i
        return np.where(j < i, s[j], s[min(j + 1, len(s) - 1)])

    others = at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2
    return dict(zip(keys[order].tolist(), others.tolist(), strict=True))


SAMPLE_STEPS = 32  # sync points sampled per session for lateness (the loader samples span starts so)


def _stride(cut: SessionSteps) -> tuple[int, int]:
    """(first step, stride) of a session's sample: about SAMPLE_STEPS steps of its range."""
    steps = cut.exec_step
    if not steps:
        return 0, 1
    lo, hi = min(steps), max(steps)
    return lo, max(1, (hi - lo) // SAMPLE_STEPS)


def rank_figures(
    sessions: Sequence[SessionInfo],
    cuts: dict[int, SessionSteps],
    records: dict[int, SessionRecords],
    attempt_of: dict[int, int],
    clocks: dict[int, SessionClock],
    goodput_by_rank: dict[int, float],
) -> list[RankFigure]:
    """One figure per rank over the given sessions (a rank's sessions combined)."""
    by_rank: dict[int, list[SessionInfo]] = {}
    for s in sessions:
        by_rank.setdefault(s.rank, []).append(s)
    import numpy as np

    step_times: dict[int, Any] = {}
    compute: dict[int, float] = {}
    arrivals: dict[tuple[int, int], dict[int, int]] = {}  # (attempt, step) -> rank -> aligned sync time
    starts: dict[tuple[int, int, str], dict[int, int]] = {}  # (attempt, step, name) -> rank -> ns after step entry
    for rank, members in by_rank.items():
        times: list[Any] = []
        per_execution: list[Any] = []
        for s in members:
            cut = cuts.get(s.index)
            if cut is None:
                continue
            clock = clocks.get(s.index)
            attempt = attempt_of[s.index]
            starts_w, ends_w, counts_w, firsts_w, steps_e = cut.win_start, cut.win_end, cut.win_count, cut.win_first, cut.exec_step
            counts = np.frombuffer(counts_w, dtype=np.int64)
            if len(counts):
                lengths = np.frombuffer(ends_w, dtype=np.int64) - np.frombuffer(starts_w, dtype=np.int64)
                times.append(np.repeat(lengths / counts / NS, counts))
            lo, stride = _stride(cut)
            if len(counts):
                w_step = np.frombuffer(steps_e, dtype=np.int64)[np.frombuffer(firsts_w, dtype=np.int64)]
                sampled = np.flatnonzero((counts == 1) & ((w_step - lo) % stride == 0))
                for step, t in zip(w_step[sampled].tolist(), np.frombuffer(ends_w, dtype=np.int64)[sampled].tolist(),
                                   strict=True):
                    arrivals.setdefault((attempt, step), {})[rank] = clock.to_reference(t) if clock else t
            if len(cut.exec_compute):
                ns = np.frombuffer(cut.exec_compute, dtype=np.int64)
                per_execution.append(ns[ns > 0])
            rec = records.get(s.index)
            if rec is not None and rec.starts and len(steps_e):
                # each sampled step's entry: its first execution's (np.unique keeps the first index)
                numbers, first = np.unique(np.frombuffer(steps_e, dtype=np.int64), return_index=True)
                entered = np.frombuffer(cut.exec_t0, dtype=np.int64)[first]
                wanted = np.fromiter((step for step, _, _ in rec.starts), dtype=np.int64, count=len(rec.starts))
                at = np.minimum(np.searchsorted(numbers, wanted), len(numbers) - 1)
                found = (numbers[at] == wanted).tolist()
                for (step, name, t0), ok, e in zip(rec.starts, found, entered[at].tolist(), strict=True):
                    if ok:
                        starts.setdefault((attempt, step, name), {})[rank] = t0 - e
        step_times[rank] = np.concatenate(times) if times else np.zeros(0)
        joined = np.concatenate(per_execution) if per_execution else np.zeros(0, dtype=np.int64)
        if len(joined):
            compute[rank] = float(np.median(joined))
    others_compute = _leave_one_out(compute)
    late: dict[int, list[float]] = {}
    last: dict[int, list[bool]] = {}
    for ranks in arrivals.values():
        if len(ranks) < 2:
            continue
        others = _leave_one_out({r: float(t) for r, t in ranks.items()})
        latest = max(ranks.values())
        for r, t in ranks.items():
            late.setdefault(r, []).append((t - others[r]) / NS)
            last.setdefault(r, []).append(t == latest)
    start_late: dict[int, dict[str, list[float]]] = {}
    for (_, _, name), ranks in starts.items():
        if len(ranks) < 2:
            continue
        others = _leave_one_out({r: float(t) for r, t in ranks.items()})
        for r, t in ranks.items():
            start_late.setdefault(r, {}).setdefault(name, []).append((t - others[r]) / NS)
    figures = []
    for rank in sorted(by_rank):
        c = compute.get(rank)
        reference = others_compute.get(rank)
        worst: tuple[float, str] | None = None
        for name, values in sorted(start_late.get(rank, {}).items()):
            median = statistics.median(values)
            if worst is None or median > worst[0]:
                worst = (median, name)
        flags = last.get(rank, [])
        figures.append(
            RankFigure(
                rank=rank,
                host=by_rank[rank][-1].host,
                goodput=goodput_by_rank.get(rank),
                step_time_median_s=float(np.median(step_times[rank])) if len(step_times[rank]) else None,
                step_time_p90_s=float(np.quantile(step_times[rank], 0.9)) if len(step_times[rank]) else None,
                compute_median_s=None if c is None else c / NS,
                relative_speed=None if c is None or reference is None or c <= 0 else reference / c,
                lateness_median_s=_median(late.get(rank, [])),
                late_fraction=sum(flags) / len(flags) if flags else None,
                start_lateness_s=None if worst is None else worst[0],
                late_span=None if worst is None else worst[1],
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
    """Ranks that compute slower than the others, arrive last at most sync points, or enter a
    span consistently later than the others."""
    if len(figures) < 2:
        return []
    floor = max(0.001, 0.02 * (ideal_step_s or 0.0))
    found = []
    for f in figures:
        reasons = []
        if f.relative_speed is not None and f.relative_speed < SLOW_SPEED:
            reasons.append(f"computes at {f.relative_speed:.0%} of the other ranks' speed")
        if (
            f.late_fraction is not None and f.late_fraction > LATE_FRACTION
            and f.lateness_median_s is not None and f.lateness_median_s > floor
        ):
            reasons.append(
                f"last to arrive at {f.late_fraction:.0%} of sync points, "
                f"{f.lateness_median_s * 1e3:.1f} ms after the other ranks (median)"
            )
        if f.start_lateness_s is not None and f.start_lateness_s > max(floor, 0.05 * (ideal_step_s or 0.0)):
            reasons.append(f"enters {f.late_span!r} {f.start_lateness_s * 1e3:.1f} ms after the other ranks (median)")
        if reasons:
            found.append(Straggler(f.rank, f.host, "; ".join(reasons)))
    return found
