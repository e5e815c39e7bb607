"""Goodput over time: a timeline's buckets per period of a fixed width, in one pass.

:func:`periodic_partitions` cuts [a, b) into periods of ``width`` ns aligned to ``origin``
(the Unix epoch for clock hours, the job start for ``--rolling``) and sums each piece of the
timeline into the periods it touches, with numpy: O(pieces + periods), never a clip of the
whole timeline per period. Each period's buckets add up to its length exactly, and equal
:func:`goodtrace.analysis.goodput.interval_partition` over the same period to the nanosecond.
:func:`goodput_over_time` adds what the report shows: the worst periods by time lost.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from goodtrace import schema
from goodtrace.analysis.goodput import AnalysisError
from goodtrace.analysis.overhead import BLOCK
from goodtrace.analysis.partition import PRODUCTIVE, Timeline

__all__ = [
    "HUMAN_PERIODS_S",
    "MAX_PERIODS",
    "TARGET_PERIODS",
    "GoodputOverTime",
    "Period",
    "default_every_s",
    "goodput_over_time",
    "iso",
    "periodic_partitions",
    "width_ns",
]

NS = 1e9
# the periods a default is chosen from: widths people read on a clock, each at most about three
# times the one before (so the chosen one gives between about 10 and TARGET_PERIODS periods)
HUMAN_PERIODS_S = (
    1.0, 2.0, 5.0, 10.0, 15.0, 30.0,  # seconds
    60.0, 120.0, 300.0, 600.0, 900.0, 1800.0,  # minutes
    3600.0, 7200.0, 3 * 3600.0, 6 * 3600.0, 12 * 3600.0,  # hours
    86_400.0, 2 * 86_400.0, 7 * 86_400.0, 14 * 86_400.0, 30 * 86_400.0, 91 * 86_400.0, 365 * 86_400.0,
)
TARGET_PERIODS = 30  # the default period is the shortest human one that cuts the span into at most this many
MAX_PERIODS = 20_000  # past this the caller is asked for a wider period
WORST = 3  # periods the console names


@dataclasses.dataclass(frozen=True)
class Period:
    """One period of the job: [start, end) on the wall clock (ns since the epoch), its buckets
    (integer ns, adding up to its length), and whether it is shorter than the width (the job's
    first or last period, or a period cut by ``--since``/``--until``)."""

    start_wall_ns: int
    end_wall_ns: int
    buckets_ns: dict[str, int]
    partial: bool

    @property
    def length_ns(self) -> int:
        return self.end_wall_ns - self.start_wall_ns

    @property
    def goodput(self) -> float:
        return self.buckets_ns.get(PRODUCTIVE, 0) / self.length_ns if self.length_ns > 0 else 0.0

    @property
    def lost_ns(self) -> int:
        """Time in the period that was not productive (what the worst periods are ranked by)."""
        return self.length_ns - self.buckets_ns.get(PRODUCTIVE, 0)

    def top_loss(self) -> tuple[str, int] | None:
        """The non-productive bucket that took most of the period (None when none did)."""
        lost = [(ns, name) for name, ns in self.buckets_ns.items() if name != PRODUCTIVE and ns > 0]
        if not lost:
            return None
        ns, name = max(lost, key=lambda item: item[0])  # ties: the first in the report's bucket order
        return name, ns

    def to_dict(self, job_start_ns: int) -> dict[str, Any]:
        length = self.length_ns
        return {
            "start": iso(self.start_wall_ns),
            "end": iso(self.end_wall_ns),
            "start_s": (self.start_wall_ns - job_start_ns) / NS,
            "end_s": (self.end_wall_ns - job_start_ns) / NS,
            "partial": self.partial,
            "goodput": self.goodput,
            "lost_s": self.lost_ns / NS,
            "buckets": {name: {"ns": ns, "seconds": ns / NS, "fraction": ns / length if length else 0.0}
                        for name, ns in self.buckets_ns.items() if ns},
        }


@dataclasses.dataclass(frozen=True)
class GoodputOverTime:
    """The job (or the selected span) cut into periods of ``every_s`` aligned to the UTC clock;
    ``worst`` indexes the periods that lost the most time, worst first."""

    every_s: float
    periods: tuple[Period, ...]
    worst: tuple[int, ...]

    def to_list(self, job_start_ns: int) -> list[dict[str, Any]]:
        """The JSON form: each period's dict, with ``worst`` its place among the worst (1 = the
        worst) or None."""
        place = {k: n + 1 for n, k in enumerate(self.worst)}
        return [p.to_dict(job_start_ns) | {"worst": place.get(k)} for k, p in enumerate(self.periods)]


def iso(wall_ns: int) -> str:
    """``2026-11-24T03:00:00Z`` (to the microsecond when not on a whole second)."""
    seconds, rest = divmod(wall_ns, 1_000_000_000)
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if rest:
        text += f".{rest // 1000:06d}"
    return text + "Z"


def _piece_columns(timeline: Timeline) -> tuple[Any, Any, Any, list[str]]:
    """The timeline's pieces as columns: start, end, label code; and the labels in order."""
    import numpy as np

    c = timeline.columns
    if c is None:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), []
    return c.start, c.end, c.label, list(c.labels)


def width_ns(seconds: float) -> int:
    """A period of ``seconds`` in ns: at least 1, at most 2**62 (longer than any timeline, whose
    times are below 2**61), so that period edges stay in int64."""
    if not seconds > 0:  # also NaN
        raise AnalysisError(f"the period must be a positive duration, got {seconds} s")
    return max(1, round(min(seconds, 2**62 / NS) * NS))


def periodic_partitions(timeline: Timeline, width_ns: int, *, origin: int = 0, a: int | None = None,
                        b: int | None = None) -> list[Period]:
    """The timeline's buckets over [a, b) (the whole job by default) per period of ``width_ns``
    aligned to ``origin`` (period k is [origin + k*width, origin + (k+1)*width), clipped to
    [a, b)). One pass over the pieces: a piece inside one period adds its length there, a piece
    crossing period edges adds its two ends to the first and last period and the whole width to
    every period between (a difference array, summed once)."""
    import numpy as np

    if width_ns <= 0:
        raise AnalysisError("the period width must be positive")
    width_ns = min(width_ns, 2**62)
    lo = timeline.start if a is None else max(a, timeline.start)
    hi = timeline.end if b is None else min(b, timeline.end)
    if hi <= lo:
        return []
    first = (lo - origin) // width_ns
    last = (hi - 1 - origin) // width_ns
    count = int(last - first + 1)
    if count > MAX_PERIODS:
        raise AnalysisError(f"{count:,} periods of {width_ns / NS:g} s: at most {MAX_PERIODS:,} (choose a wider period)")
    if (timeline.columns is None or not len(timeline.columns)) and timeline.buckets:
        raise AnalysisError("a totals-only timeline (pieces=False) cannot be cut into periods")
    starts, ends, labels, names = _piece_columns(timeline)
    # the pieces in [lo, hi) (in time order, disjoint): a slice, clipped at its two ends, a
    # block at a time (a long run has millions, and each step makes temporaries of a block)
    i = max(0, int(np.searchsorted(starts, lo, side="right")) - 1)
    j = max(i, int(np.searchsorted(starts, hi, side="left")))
    edge0 = origin + first * width_ns  # the start of period 0 (may be before lo)
    totals = np.zeros((count, len(names)), dtype=np.int64)
    full = np.zeros((count + 1, len(names)), dtype=np.int64)  # whole periods strictly between
    for block in range(i, j, BLOCK):
        stop = min(block + BLOCK, j)
        _add_periods(totals, full, np.maximum(starts[block:stop], lo), np.minimum(ends[block:stop], hi),
                     labels[block:stop], edge0, width_ns)
    totals += np.cumsum(full, axis=0)[:count]
    out = []
    for k in range(count):
        s = max(lo, int(edge0 + k * width_ns))
        e = min(hi, int(edge0 + (k + 1) * width_ns))
        row = totals[k].tolist()
        out.append(Period(s, e, _ordered({names[j]: row[j] for j in range(len(names)) if row[j]}), e - s < width_ns))
    return out


def _add_periods(totals: Any, full: Any, starts: Any, ends: Any, labels: Any, edge0: int, width_ns: int) -> None:
    """Add pieces to the period totals of :func:`periodic_partitions`: a piece inside one period
    its length there; one crossing period edges its two ends to its first and last period and
    the whole width to every period between (into the difference array ``full``)."""
    import numpy as np

    keep = ends > starts
    if not keep.all():
        starts, ends, labels = starts[keep], ends[keep], labels[keep]
    p_start = starts - edge0
    p_start //= width_ns
    p_end = ends - (1 + edge0)
    p_end //= width_ns
    inside = p_start == p_end
    np.add.at(totals, (p_start[inside], labels[inside]), ends[inside] - starts[inside])
    cross = ~inside
    if cross.any():
        cs, ce, cl = p_start[cross], p_end[cross], labels[cross]
        np.add.at(totals, (cs, cl), edge0 + (cs + 1) * width_ns - starts[cross])
        np.add.at(totals, (ce, cl), ends[cross] - (edge0 + ce * width_ns))
        between = ce - cs > 1
        np.add.at(full, (cs[between] + 1, cl[between]), width_ns)
        np.add.at(full, (ce[between], cl[between]), -width_ns)


def _ordered(buckets: dict[str, int]) -> dict[str, int]:
    """Non-zero buckets in the report's bucket order (the built-in ones first, then by name)."""
    out = {name: buckets[name] for name in schema.BASE_BUCKETS if buckets.get(name)}
    for name in sorted(buckets):
        if name not in out and buckets[name]:
            out[name] = buckets[name]
    return out


def default_every_s(span_s: float) -> float:
    """The period goodput over time uses when none is chosen: the shortest of
    :data:`HUMAN_PERIODS_S` that cuts ``span_s`` seconds into at most :data:`TARGET_PERIODS`
    (a 34 s run: 2 s, 17 periods; a day: 1 h; a week: 6 h), the longest for anything longer.
    Aligned to the clock, the span may touch one period more than that."""
    return next((w for w in HUMAN_PERIODS_S if span_s / w <= TARGET_PERIODS), HUMAN_PERIODS_S[-1])


def goodput_over_time(timeline: Timeline, every_s: float | None = None, *, a: int | None = None,
                      b: int | None = None) -> GoodputOverTime:
    """Goodput per period of ``every_s`` seconds aligned to the UTC clock, over [a, b) or the
    whole job, and the worst periods: those that lost the most time (length minus productive),
    so a short period at either end is ranked by what it actually lost, never by its fraction
    alone; ties go to the earlier period. Without ``every_s``: :func:`default_every_s` of the
    span's length."""
    lo = timeline.start if a is None else max(a, timeline.start)
    hi = timeline.end if b is None else min(b, timeline.end)
    chosen = default_every_s((hi - lo) / NS) if every_s is None else every_s
    periods = periodic_partitions(timeline, width_ns(chosen), origin=0, a=a, b=b)
    ranked = sorted((k for k, p in enumerate(periods) if p.lost_ns > 0), key=lambda k: (-periods[k].lost_ns, k))
    return GoodputOverTime(chosen, tuple(periods), tuple(ranked[:WORST]) if len(periods) > 1 else ())
