"""Goodput from a timeline: the partition of a range of time into buckets, and rolling goodput."""

from __future__ import annotations

import dataclasses
from typing import Any

from goodtrace import schema
from goodtrace.analysis.partition import PRODUCTIVE, Timeline

__all__ = ["NS", "STARTUP_PARTS", "AnalysisError", "Partition", "PeriodGoodput", "interval_partition", "rolling_goodput"]

NS = 1e9
STARTUP_PARTS = (schema.INIT, schema.CHECKPOINT_RESTORE, schema.DATA, schema.COMPILE, "other")


class AnalysisError(ValueError):
    """The loaded run cannot be analysed (no sessions, no such job)."""


@dataclasses.dataclass(frozen=True)
class Partition:
    """Every nanosecond of [start, end) in exactly one bucket; ``productive`` is goodput."""

    start_wall_ns: int
    end_wall_ns: int
    buckets_ns: dict[str, int]
    startup_parts_ns: dict[str, int]

    @property
    def total_ns(self) -> int:
        return self.end_wall_ns - self.start_wall_ns

    @property
    def goodput(self) -> float:
        return self.buckets_ns.get(PRODUCTIVE, 0) / self.total_ns if self.total_ns > 0 else 0.0

    def seconds(self, bucket: str) -> float:
        return self.buckets_ns.get(bucket, 0) / NS

    def fraction(self, bucket: str) -> float:
        return self.buckets_ns.get(bucket, 0) / self.total_ns if self.total_ns > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "start_wall_ns": self.start_wall_ns,
            "end_wall_ns": self.end_wall_ns,
            "total_s": self.total_ns / NS,
            "goodput": self.goodput,
            "buckets": {
                name: {"ns": ns, "seconds": ns / NS, "fraction": self.fraction(name)}
                for name, ns in self.buckets_ns.items()
            },
            "startup_parts": {name: {"ns": ns, "seconds": ns / NS} for name, ns in self.startup_parts_ns.items()},
        }


def _ordered(buckets: dict[str, int]) -> dict[str, int]:
    out = {name: buckets.get(name, 0) for name in schema.BASE_BUCKETS}
    for name in sorted(buckets):
        if name not in out:
            out[name] = buckets[name]
    return out


def interval_partition(timeline: Timeline, a_ns: int | None = None, b_ns: int | None = None) -> Partition:
    """The partition clipped to the wall-clock range [a, b) (the whole job by default)."""
    lo = timeline.start if a_ns is None else max(a_ns, timeline.start)
    hi = timeline.end if b_ns is None else min(b_ns, timeline.end)
    hi = max(hi, lo)
    buckets, parts = timeline.totals(lo, hi)
    return Partition(lo, hi, _ordered(buckets), {p: parts.get(p, 0) for p in STARTUP_PARTS} | parts)


@dataclasses.dataclass(frozen=True)
class PeriodGoodput:
    start_s: float  # relative to the job start
    end_s: float
    goodput: float
    productive_s: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def rolling_goodput(timeline: Timeline, width_s: float) -> list[PeriodGoodput]:
    """Interval goodput over consecutive periods of ``width_s`` tiling the job (the last one
    may be shorter): the periods of :func:`goodtrace.analysis.over_time.periodic_partitions`
    aligned to the job start, in one pass over the timeline."""
    from goodtrace.analysis.over_time import periodic_partitions, width_ns

    if not width_s > 0:
        raise AnalysisError("the rolling period must be positive")
    width = width_ns(width_s)
    return [
        PeriodGoodput((p.start_wall_ns - timeline.start) / NS, (p.end_wall_ns - timeline.start) / NS, p.goodput,
                      p.buckets_ns.get(PRODUCTIVE, 0) / NS)
        for p in periodic_partitions(timeline, width, origin=timeline.start)
    ]
