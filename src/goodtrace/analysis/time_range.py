"""The part of a job a report shows: ``--since``/``--until`` edges resolved on the timeline.

An edge is a wall-clock instant, seconds from the job start (negative: from its end), or a step
(``since``: the start of the interval of the first execution of a step at or after it;
``until``: the end of the interval of the last execution of a step at or before it).
:func:`resolve_range` turns two edges into [a, b) on the job's wall clock, or says in one line
why it cannot (after the end, before the start, empty, no such step).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from goodtrace.analysis.anomalies import Anomaly
from goodtrace.analysis.goodput import NS, AnalysisError
from goodtrace.analysis.over_time import iso
from goodtrace.analysis.steps import StepTable

__all__ = ["RangeEdge", "in_range", "resolve_range", "restrict_to_range"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RangeEdge:
    """One edge of a time range: exactly one of ``wall_ns`` (ns since the Unix epoch), ``offset_s``
    (seconds from the job start; negative from its end; infinite: the end itself) or ``step``.
    ``text`` is what the user wrote (for messages)."""

    wall_ns: int | None = None
    offset_s: float | None = None
    step: int | None = None
    text: str = ""

    def __post_init__(self) -> None:
        given = sum(v is not None for v in (self.wall_ns, self.offset_s, self.step))
        if given != 1:
            raise ValueError("a time range edge is one of a wall time, an offset or a step")
        if self.offset_s is not None and math.isnan(self.offset_s):
            raise ValueError("a time range offset cannot be NaN")

    def describe(self) -> str:
        if self.text:
            return self.text
        if self.step is not None:
            return f"step:{self.step}"
        if self.wall_ns is not None:
            return iso(self.wall_ns)
        return f"{self.offset_s:g}s"


def _edge(edge: RangeEdge, which: str, start: int, end: int, table: StepTable) -> int:
    if edge.wall_ns is not None:
        return edge.wall_ns
    if edge.offset_s is not None:
        seconds = edge.offset_s
        if math.isinf(seconds):
            return end if seconds > 0 else start
        return start + round(seconds * NS) if seconds >= 0 else end + round(seconds * NS)
    assert edge.step is not None
    steps, starts, ends = table.intervals()
    if which == "since":
        after = steps >= edge.step
        if not after.any():
            highest = f" (the highest step is {int(steps.max())})" if len(steps) else ""
            raise AnalysisError(f"--since {edge.describe()}: no step at or after {edge.step} ran{highest}")
        return int(starts[after].min())
    before = steps <= edge.step
    if not before.any():
        lowest = f" (the lowest step is {int(steps.min())})" if len(steps) else ""
        raise AnalysisError(f"--until {edge.describe()}: no step at or before {edge.step} ran{lowest}")
    return int(ends[before].max())


def resolve_range(since: RangeEdge | None, until: RangeEdge | None, start: int, end: int,
                 table: StepTable) -> tuple[int, int]:
    """[a, b) on the wall clock for the job [start, end) and its step table; edges past the job
    are clipped to it, a time range outside it or empty is an error."""
    a = start if since is None else _edge(since, "since", start, end, table)
    b = end if until is None else _edge(until, "until", start, end, table)
    if since is not None and a >= end:
        raise AnalysisError(f"--since {since.describe()} is at or after the end of the job ({iso(end)}, "
                            f"{(end - start) / NS:g} s after its start)")
    if until is not None and b <= start:
        raise AnalysisError(f"--until {until.describe()} is at or before the start of the job ({iso(start)})")
    a, b = max(a, start), min(b, end)
    if b <= a:
        what = " ".join(f"--{name} {edge.describe()}" for name, edge in (("since", since), ("until", until))
                        if edge is not None)
        raise AnalysisError(f"{what}: the time range is empty (it must end after it starts)")
    return a, b


def in_range(starts: Any, ends: Any, a: int, b: int) -> Any:
    """Which step intervals [start, end) overlap [a, b) (a zero-length one: lies in it), as a
    boolean column."""
    return ((starts < b) & (ends > a)) | ((starts == ends) & (starts >= a) & (starts < b))


def restrict_to_range(table: StepTable, anomalies: list[Anomaly], time_range: tuple[int, int]) -> tuple[
    StepTable, list[Anomaly]
]:
    """The step executions whose interval overlaps ``time_range``, and the anomalies among them (found
    over the whole job first, so that a time range does not move the anomaly threshold)."""
    _, starts, ends = table.intervals()
    kept = table.take(in_range(starts, ends, *time_range))
    keys = set(zip(kept.attempt.tolist(), kept.seq.tolist(), strict=True))
    return kept, [x for x in anomalies if (x.attempt, x.seq) in keys]
