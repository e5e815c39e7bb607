"""The HTML report's two per-rank charts: the rank x step heat map and the gantt chart.

Both are filled one session at a time (:meth:`Heatmap.add`, :meth:`Gantt.add`) as the page's
data is assembled, so memory holds the heat map's cells and the gantt range's spans only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from goodtrace import schema
from goodtrace.analysis.intervals import StepInterval, StepSummary
from goodtrace.analysis.selection import StepRange
from goodtrace.read.sessions import Session

__all__ = ["GANTT_STEPS", "MAX_GANTT_ITEMS", "MAX_HEATMAP_COLUMNS", "Gantt", "Heatmap", "choose_gantt_range", "rounded"]

GANTT_STEPS = 20  # default width of the gantt chart's step range
MAX_HEATMAP_COLUMNS = 240  # more step executions than this are averaged into bins
MAX_GANTT_ITEMS = 600_000  # past this the gantt keeps the first ranks and says so
DEVICE_CATEGORY = schema.DEVICE_CATEGORY


def rounded(value: float, digits: int = 3) -> float:
    return round(value, digits)


class Heatmap:
    """Rank x step-execution matrices of step time and compute time (ms), binned when wide.

    The columns come from the sessions' step summaries; each session's intervals are added
    as its records are read (in session order, so the sums are those of one pass)."""

    def __init__(self, sessions: Sequence[Session], summaries: Mapping[str, StepSummary]) -> None:
        keys = sorted({(s.attempt, step) for s in sessions for step in summaries[s.session_id].steps})
        self.ranks = sorted({s.rank for s in sessions})
        width = max(1, math.ceil(len(keys) / MAX_HEATMAP_COLUMNS))
        self.column_of = {key: i // width for i, key in enumerate(keys)}
        self.width = width
        columns = []
        for start in range(0, len(keys), width):
            group = keys[start:start + width]
            (a0, s0), (a1, s1) = group[0], group[-1]
            label = f"{s0}" if len(group) == 1 else f"{s0}-{s1}"
            if len({a for a, _ in keys}) > 1:
                label = f"a{a0}:{label}" if a0 == a1 else f"a{a0}:{s0}-a{a1}:{s1}"
            columns.append(label)
        self.columns = columns
        self.row_of = {rank: i for i, rank in enumerate(self.ranks)}
        n = len(columns)
        self.sums = {name: [[0.0] * n for _ in self.ranks] for name in ("step", "compute")}
        self.counts = [[0] * n for _ in self.ranks]
        self.hosts: dict[int, str] = {}
        for session in sessions:
            self.hosts.setdefault(session.rank, str(session.header.get(schema.H_HOST)))

    def add(self, session: Session, intervals: Iterable[StepInterval]) -> None:
        row = self.row_of[session.rank]
        steps, compute, counts = self.sums["step"][row], self.sums["compute"][row], self.counts[row]
        for iv in intervals:
            col = self.column_of[(session.attempt, iv.step)]
            steps[col] += iv.duration_ns / 1e6
            compute[col] += iv.compute_ns / 1e6
            counts[col] += 1

    def result(self) -> dict[str, Any]:
        def matrix(name: str) -> list[list[float | None]]:
            return [[rounded(v / c, 3) if c else None for v, c in zip(values, count_row, strict=True)]
                    for values, count_row in zip(self.sums[name], self.counts, strict=True)]

        has_compute = any(v for row in self.sums["compute"] for v in row)
        return {"ranks": self.ranks, "hosts": [self.hosts.get(r, "?") for r in self.ranks],
                "columns": self.columns, "bin": self.width, "step_ms": matrix("step"),
                "compute_ms": matrix("compute") if has_compute else None}


def choose_gantt_range(
    steps: dict[str, Any], executed: Mapping[int, set[int]],
    gantt_steps: StepRange | None, gantt_attempt: int | None,
) -> tuple[int, int, int] | None:
    """(attempt, first step, last step): the asked range (in the last attempt that ran any of
    it, unless ``gantt_attempt`` says which), else 20 steps around the slowest step that is not
    the first of its attempt, else the last 20 steps. ``executed``: the steps of each attempt."""
    if not executed:
        return None
    if gantt_steps is not None:
        low, high = gantt_steps
        lo = -(2**62) if low is None else low
        hi = 2**62 if high is None else high
        candidates = [a for a in sorted(executed) if any(lo <= s <= hi for s in executed[a])]
        if gantt_attempt is not None:
            candidates = [a for a in candidates if a == gantt_attempt]
        if not candidates:
            return None
        inside = [s for s in executed[candidates[-1]] if lo <= s <= hi]
        return candidates[-1], min(inside), max(inside)
    totals = [sum(col) for col in zip(*steps["series"].values(), strict=True)] if steps["series"]["productive"] else []
    attempt, centre = max(executed), max(executed[max(executed)])
    if gantt_attempt is not None and gantt_attempt in executed:
        attempt, centre = gantt_attempt, max(executed[gantt_attempt])
    best = -1.0
    for i, total in enumerate(totals):
        a = steps["attempts"][i]
        if gantt_attempt is not None and a != gantt_attempt:
            continue
        if i > 0 and steps["attempts"][i - 1] == a and total > best and a in executed:
            best, attempt, centre = total, a, steps["steps"][i]
    numbers = sorted(executed[attempt])
    pos = numbers.index(centre) if centre in numbers else len(numbers) - 1
    lo = max(0, min(pos - GANTT_STEPS // 2, len(numbers) - GANTT_STEPS))
    chosen = numbers[lo:lo + GANTT_STEPS]
    return attempt, chosen[0], chosen[-1]


# One span kept for the gantt: t0, t1 (its session's clock), category, thread, name, step.
_GanttSpan = tuple[int, int, str, Any, str, Any]


@dataclasses.dataclass
class _GanttRow:
    session: Session  # as indexed: header and attempt only
    w0: int
    w1: int
    marks: list[tuple[int, int]]  # (t0, step) of each interval in the range
    spans: list[_GanttSpan] | None  # None: dropped, the row is past MAX_GANTT_ITEMS


class Gantt:
    """The gantt chart of every rank's spans for the chosen (attempt, first, last) range.

    Sessions come in any order, one at a time; only their spans inside the range are kept.
    Rows are laid out in rank order at the end, up to MAX_GANTT_ITEMS spans: a row that
    certainly lies past that limit (the rows of lower rank already hold more) is dropped at
    once, so memory stays bounded for any range."""

    def __init__(self, chosen: tuple[int, int, int] | None) -> None:
        self.chosen = chosen
        self.rows: dict[int, _GanttRow] = {}
        self.kept = 0
        self._strings: dict[str, str] = {}

    def add(self, indexed: Session, session: Session, intervals: Sequence[StepInterval]) -> None:
        if self.chosen is None or indexed.attempt != self.chosen[0]:
            return
        _, first, last = self.chosen
        ivs = [iv for iv in intervals if iv.step >= first and iv.first_step <= last]
        if not ivs:
            return
        w0, w1 = ivs[0].t0, ivs[-1].t1
        intern = self._strings.setdefault
        spans: list[_GanttSpan] = [
            (int(r[schema.F_T0]), int(r[schema.F_T1]), intern(str(r.get(schema.F_CATEGORY)), str(r.get(schema.F_CATEGORY))),
             r.get(schema.F_THREAD), intern(str(r.get(schema.F_NAME)), str(r.get(schema.F_NAME))), r.get(schema.F_STEP))
            for r in session.records
            if r.get(schema.F_KIND) == schema.SPAN and int(r[schema.F_T1]) > w0 and int(r[schema.F_T0]) < w1
        ]
        self.rows[indexed.rank] = _GanttRow(indexed, w0, w1, [(iv.t0, iv.step) for iv in ivs], spans)
        self.kept += len(spans)
        if self.kept > MAX_GANTT_ITEMS:
            self._drop_rows_past_the_limit()

    def _drop_rows_past_the_limit(self) -> None:
        before = 0
        for rank in sorted(self.rows):
            row = self.rows[rank]
            if before > MAX_GANTT_ITEMS and row.spans is not None:
                self.kept -= len(row.spans)
                row.spans, row.marks = None, []
            before += len(row.spans or ())

    def result(self, to_wall: Mapping[str, Callable[[int], int]]) -> dict[str, Any] | None:
        if self.chosen is None or not self.rows:
            return None
        attempt, first, last = self.chosen
        picked = [self.rows[rank] for rank in sorted(self.rows)]
        origin = min(to_wall[p.session.session_id](p.w0) for p in picked)
        names: dict[str, int] = {}
        categories: dict[str, int] = {}
        items: list[list[float | int]] = []
        rows: list[str] = []
        marks: list[list[Any]] = []
        truncated = False
        for row, picked_row in enumerate(picked):
            if len(items) > MAX_GANTT_ITEMS:
                truncated = True
                break
            session, spans = picked_row.session, picked_row.spans
            assert spans is not None  # dropped rows lie past the limit
            clock = to_wall[session.session_id]
            rows.append(f"rank {session.rank} ({session.header.get(schema.H_HOST)})")
            main_tid = session.header.get("main_tid")
            if row == 0:
                marks = [[rounded((clock(t0) - origin) / 1e6), f"step {step}"] for t0, step in picked_row.marks]
            spans.sort(key=lambda r: (r[0], -r[1]))
            stacks: dict[Any, list[int]] = {}
            for t0, t1, category, tid, name, step in spans:
                lane = 2 if category == DEVICE_CATEGORY else (0 if tid == main_tid else 1)
                stack = stacks.setdefault((lane, tid), [])
                while stack and stack[-1] <= t0:
                    stack.pop()
                depth = len(stack)
                stack.append(t1)
                items.append([
                    row, rounded((clock(t0) - origin) / 1e6), rounded((clock(t1) - origin) / 1e6),
                    names.setdefault(name, len(names)), categories.setdefault(category, len(categories)),
                    step if isinstance(step, int) else -1, min(depth, 5), lane,
                ])
        return {"attempt": attempt, "steps": [first, last], "rows": rows, "names": list(names),
                "categories": list(categories), "items": items, "marks": marks, "truncated": truncated}
