"""Step intervals of one session from its raw records (the trace and the HTML report).

:func:`step_intervals` cuts a session's ``sync`` and ``step`` records into intervals
(T_{k-1}, T_k] with the overhead split of its main-thread spans; :func:`summarise_steps` keeps
only where the intervals lie (:class:`StepSummary`), which a streaming reader computes first.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from goodtrace import schema
from goodtrace.analysis.selection import StepRange
from goodtrace.read.sessions import Run, Session

__all__ = [
    "Bound",
    "StepInterval",
    "StepSummary",
    "in_range",
    "overhead_categories",
    "step_bounds",
    "step_intervals",
    "step_summaries",
    "summarise_steps",
]


@dataclasses.dataclass(frozen=True)
class StepInterval:
    """Step ``step``'s interval (T_{k-1}, T_k] on one session's monotonic clock.

    When completion was sparse, the interval is shared by ``first_step`` .. ``step`` (a window:
    its time is their total, never per-step truth). ``overhead_ns`` maps each overhead category
    to the time its outermost main-thread spans cover inside the interval; ``regions`` lists
    those (t0, t1, category) pieces; ``productive_ns`` is the rest. ``compute_ns`` is the time of
    outermost main-thread ``compute`` spans inside it (0 when the loop records none).
    """

    first_step: int
    step: int
    t0: int
    t1: int
    how: str
    overhead_ns: dict[str, int]
    regions: tuple[tuple[int, int, str], ...]
    compute_ns: int

    @property
    def duration_ns(self) -> int:
        return self.t1 - self.t0

    @property
    def productive_ns(self) -> int:
        return self.duration_ns - sum(self.overhead_ns.values())

    @property
    def is_window(self) -> bool:
        return self.first_step != self.step


def overhead_categories(session: Session) -> frozenset[str]:
    """The built-in overhead categories plus those the session's config declared."""
    extra: set[str] = set()
    config = session.header.get(schema.H_CONFIG)
    for declared in (session.header.get("overhead_categories"),
                     config.get("overhead_categories") if isinstance(config, dict) else None):
        if isinstance(declared, list):
            extra.update(str(c) for c in declared)
    return schema.OVERHEAD_CATEGORIES | extra


def _outermost(spans: Iterable[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Outermost intervals of properly nested (t0, t1, label) spans: a span starting inside an
    earlier kept one is dropped (nested, or overlapping on another thread: counted once)."""
    kept: list[tuple[int, int, str]] = []
    end = -(2**63)
    for t0, t1, label in sorted(spans, key=lambda s: (s[0], -s[1])):
        if t0 >= end:
            kept.append((t0, t1, label))
            end = t1
        elif t1 > end:  # partial overlap: keep the uncovered tail, under the same label
            kept.append((end, t1, label))
            end = t1
    return kept


def _clip_sum(
    pieces: Sequence[tuple[int, int, str]], starts: Sequence[int], t0: int, t1: int
) -> list[tuple[int, int, str]]:
    """Pieces (sorted, disjoint) clipped to (t0, t1]."""
    out: list[tuple[int, int, str]] = []
    index = max(0, bisect.bisect_right(starts, t0) - 1)
    while index < len(pieces):
        a, b, label = pieces[index]
        if a >= t1:
            break
        lo, hi = max(a, t0), min(b, t1)
        if hi > lo:
            out.append((lo, hi, label))
        index += 1
    return out



Bound = tuple[int, int, int, int, str]  # first_step, step, t0, t1, how: one interval without its split


def step_bounds(session: Session) -> list[Bound]:
    """Where the session's step intervals lie, from its ``sync`` and ``step`` records only:
    ``(first_step, step, t0, t1, how)`` per interval, in time order (see :func:`step_intervals`)."""
    return _bounds(session.records)


def _bounds(records: Iterable[dict[str, Any]]) -> list[Bound]:
    syncs: list[tuple[int, int, str]] = []
    entered: list[dict[str, Any]] = []
    for r in records:
        kind = r.get(schema.F_KIND)
        if kind == schema.SYNC:
            if isinstance(r.get(schema.F_T), int) and isinstance(r.get(schema.F_STEP), int):
                syncs.append((int(r[schema.F_T]), int(r[schema.F_STEP]), str(r.get(schema.F_HOW, ""))))
        elif kind == schema.STEP and isinstance(r.get(schema.F_STEP), int):
            entered.append(r)
    if not syncs:
        return []
    syncs.sort()
    step_t0: dict[int, int] = {}
    for r in entered:
        step_t0.setdefault(int(r[schema.F_STEP]), int(r[schema.F_T0]))
    numbers = sorted(step_t0)
    bounds: list[Bound] = []
    previous_t: int | None = None
    previous_step: int | None = None
    for t, step, how in syncs:
        low = 0 if previous_step is None else bisect.bisect_right(numbers, previous_step)
        covered = numbers[low:bisect.bisect_right(numbers, step)]
        first_step = covered[0] if covered else step
        start = previous_t if previous_t is not None else min((step_t0[n] for n in covered), default=t)
        bounds.append((first_step, step, min(start, t), t, how))
        previous_t, previous_step = t, max(step, previous_step if previous_step is not None else step)
    return bounds


def step_intervals(session: Session) -> list[StepInterval]:
    """The session's step intervals in time order, from its ``sync`` and ``step`` records.

    The first interval starts when its first step was entered; each later one at the previous
    sync point. Steps without a sync point of their own share the next one's interval.
    """
    main_tid = session.header.get("main_tid")
    span_kind, sync_kind, step_kind = schema.SPAN, schema.SYNC, schema.STEP
    steps: list[dict[str, Any]] = []  # sync and step records
    main: list[dict[str, Any]] = []  # main-thread spans
    for r in session.records:  # one pass: sessions hold hundreds of thousands of records
        kind = r.get(schema.F_KIND)
        if kind == span_kind:
            if r.get(schema.F_THREAD) == main_tid:
                main.append(r)
        elif kind in (sync_kind, step_kind):
            steps.append(r)
    bounds = _bounds(steps)
    if not bounds:
        return []
    overhead = overhead_categories(session)
    over: list[tuple[int, int, str]] = []
    compute: list[tuple[int, int, str]] = []
    for r in main:
        category = str(r.get(schema.F_CATEGORY))
        if category in overhead:
            over.append((int(r[schema.F_T0]), int(r[schema.F_T1]), category))
        elif category == schema.COMPUTE:
            compute.append((int(r[schema.F_T0]), int(r[schema.F_T1]), category))
    over_pieces = _outermost(over)
    over_starts = [p[0] for p in over_pieces]
    compute_pieces = _outermost(compute)
    compute_starts = [p[0] for p in compute_pieces]
    intervals: list[StepInterval] = []
    for first_step, step, start, t, how in bounds:
        regions = _clip_sum(over_pieces, over_starts, start, t)
        split: dict[str, int] = {}
        for a, b, category in regions:
            split[category] = split.get(category, 0) + (b - a)
        compute_ns = sum(b - a for a, b, _ in _clip_sum(compute_pieces, compute_starts, start, t))
        intervals.append(StepInterval(first_step, step, start, t, how, split, tuple(regions), compute_ns))
    return intervals


@dataclasses.dataclass(frozen=True)
class StepSummary:
    """What the renderers need of a session before its records are read: the step of each of
    its intervals, in order (as arithmetic runs ``(first, stride, count)``: a few numbers for
    any number of steps), and, for the step range ``steps_range``, the window ``(t0, t1)``
    from the first to the last interval in it (None: no interval in the range)."""

    runs: tuple[tuple[int, int, int], ...]
    steps_range: StepRange | None = None
    window: tuple[int, int] | None = None

    @property
    def steps(self) -> Iterator[int]:
        for first, stride, count in self.runs:
            for i in range(count):
                yield first + i * stride


def _runs(values: Iterable[int]) -> tuple[tuple[int, int, int], ...]:
    runs: list[list[int]] = []
    for value in values:
        if runs:
            last = runs[-1]
            if last[2] == 1:
                last[1], last[2] = value - last[0], 2
                continue
            if value == last[0] + last[1] * last[2]:
                last[2] += 1
                continue
        runs.append([value, 0, 1])
    return tuple((a, b, c) for a, b, c in runs)


def in_range(first_step: int, step: int, steps: StepRange | None) -> bool:
    """An interval is in the step range when any step it covers is."""
    if steps is None:
        return True
    first, last = steps
    return (first is None or step >= first) and (last is None or first_step <= last)


def summarise_steps(steps_range: StepRange | None = None) -> Callable[[Session], StepSummary]:
    """The per-session summary the renderers read first (``index_run``'s ``summarise``)."""

    def summarise(session: Session) -> StepSummary:
        bounds = step_bounds(session)
        window = None
        if steps_range is not None:
            chosen = [b for b in bounds if in_range(b[0], b[1], steps_range)]
            window = (chosen[0][2], chosen[-1][3]) if chosen else None
        return StepSummary(_runs(b[1] for b in bounds), steps_range, window)

    return summarise


def step_summaries(
    run: Run, sessions: Iterable[Session], steps_range: StepRange | None = None
) -> dict[str, StepSummary]:
    """Per session id, its :class:`StepSummary` for ``steps_range``: the index's own when it
    was made for that range, else computed (from the records in memory, or read again)."""
    summarise = summarise_steps(steps_range)
    result: dict[str, StepSummary] = {}
    for session in sessions:
        summary = getattr(session, "summary", None)
        if not isinstance(summary, StepSummary) or (steps_range is not None and summary.steps_range != steps_range):
            summary = summarise(run.load(session))
        result[session.session_id] = summary
    return result
