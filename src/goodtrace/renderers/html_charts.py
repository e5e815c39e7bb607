"""The HTML report's two per-rank charts: the rank x step heat map and the gantt chart.

Both draw from the run model: the heat map's cells are every rank's step executions as the
analysis cut them (step time and outermost compute time per execution), the gantt chart's
rows are every rank's spans inside the chosen steps' intervals, read for those intervals only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from goodtrace import schema
from goodtrace.analysis import RunAnalysis
from goodtrace.analysis.intervals import session_intervals
from goodtrace.columns import distinct_sorted
from goodtrace.read.raw import RawRecord

__all__ = ["MAX_GANTT_ITEMS", "MAX_HEATMAP_COLUMNS", "Gantt", "Heatmap", "rounded"]

MAX_HEATMAP_COLUMNS = 240  # more step executions than this are averaged into bins
MAX_GANTT_ITEMS = 600_000  # past this the gantt keeps the first ranks and says so
READ_ROWS = 512  # the gantt's rows read together (Gantt.wanted)


def rounded(value: float, digits: int = 3) -> float:
    return round(value, digits)


def _execution_columns(analysis: RunAnalysis, session: int) -> tuple[Any, ...]:
    """Each completed execution of a session, as columns: attempt, step, k (the k-th run of that
    step in the session), step time ns (the analysis's :meth:`SessionCut.step_ns`, in whole
    ns) and outermost compute ns."""
    import numpy as np

    cut = analysis.cuts[session]
    steps = np.frombuffer(cut.exec_step, dtype=np.int64)
    k = cut.repeat_index()  # the k-th run of its step in the session
    interval = np.frombuffer(cut.exec_interval, dtype=np.int64)
    done = interval >= 0
    # whole nanoseconds: the floor of the analysis's step time is exact (an interval under 2**53 ns)
    step_ns = np.floor(cut.step_ns()[interval[done]])
    attempt = np.full(int(done.sum()), analysis.attempt_of.get(session, -1), dtype=np.int64)
    return attempt, steps[done], k[done], step_ns, np.frombuffer(cut.exec_compute, dtype=np.int64)[done]


def _unique_rows(rows: Any) -> Any:
    """The distinct rows of an (n, 3) integer array, sorted by column 0, then 1, then 2
    (``np.unique(axis=0)`` gives the same, but made report --html at 2 x 1 M steps 2x slower)."""
    import numpy as np

    if len(rows) == 0:
        return rows
    order = np.lexsort((rows[:, 2], rows[:, 1], rows[:, 0]))
    ordered = rows[order]
    new = np.ones(len(ordered), dtype=bool)
    new[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
    return ordered[new]


def _row_index(keys: Any, rows: Any) -> Any:
    """The index in ``keys`` (sorted distinct rows, :func:`_unique_rows`) of each row of
    ``rows``, each of which is in ``keys``."""
    import numpy as np

    if len(rows) == 0:
        return np.zeros(0, dtype=np.int64)
    both = np.concatenate((keys, rows))
    order = np.lexsort((both[:, 2], both[:, 1], both[:, 0]), axis=-1)
    # stable sort: each key comes before the rows equal to it; a row's key is the last key before it
    is_key = order < len(keys)
    last_key = np.maximum.accumulate(np.where(is_key, order, -1))
    out = np.empty(len(rows), dtype=np.int64)
    out[order[~is_key] - len(keys)] = last_key[~is_key]
    return out


# (attempt + 1, step + 2**31, k) packed in one int64 while each fits its bits: one column to
# sort and search instead of three (a third of the time at 2 x 1 M steps). Fixed bits, not
# columns.order_of's combined key: that one is fitted to each call's ranges, and the keys
# gathered here, session by session, must compare across sessions.
_STEP_BITS, _K_BITS = 32, 16
_ATTEMPTS = 1 << (63 - _STEP_BITS - _K_BITS)


def _packed(attempt: Any, step: Any, k: Any) -> Any:
    """The keys packed in one int64 each, in the order of (attempt, step, k); None when one does
    not fit (a step beyond +-2**31, 2**16 runs of one step, 32,767 attempts)."""
    import numpy as np

    if len(step) and (int(step.min()) < -(1 << (_STEP_BITS - 1)) or int(step.max()) >= 1 << (_STEP_BITS - 1)
                      or int(k.max()) >= 1 << _K_BITS or int(attempt.max()) + 1 >= _ATTEMPTS):
        return None
    out = attempt + 1
    out <<= _STEP_BITS
    out += step
    out += 1 << (_STEP_BITS - 1)
    out <<= _K_BITS
    out += k
    return out.astype(np.int64, copy=False)


def _unpacked(packed: Any) -> Any:
    """The (n, 3) rows of packed keys."""
    import numpy as np

    step = (packed >> _K_BITS) & ((1 << _STEP_BITS) - 1)
    return np.stack(((packed >> (_STEP_BITS + _K_BITS)) - 1, step - (1 << (_STEP_BITS - 1)),
                     packed & ((1 << _K_BITS) - 1)), axis=1)


class _Keys:
    """The distinct (attempt, step, k) keys of the heat map's executions, sorted, gathered one
    session at a time (:meth:`add`); :meth:`index` finds each execution's. Packed in one int64
    each while every key fits (:func:`_packed`), else as rows of three (``packed=False``: as
    rows from the start, as the heat map kept them before; ``benchmarks/heatmap_keys.py``)."""

    def __init__(self, packed: bool = True) -> None:
        import numpy as np

        self.packed: Any = np.zeros(0, dtype=np.int64)
        self.rows: Any = None if packed else np.zeros((0, 3), dtype=np.int64)

    def add(self, attempt: Any, step: Any, k: Any) -> None:
        import numpy as np

        if self.rows is None:
            packed = _packed(attempt, step, k)
            if packed is not None:
                self.packed = distinct_sorted(np.concatenate((self.packed, packed)))
                return
            self.rows = _unpacked(self.packed)
        self.rows = _unique_rows(np.concatenate((self.rows, np.stack((attempt, step, k), axis=1))))

    def index(self, attempt: Any, step: Any, k: Any) -> Any:
        """Each key's place among the distinct keys (each was added)."""
        import numpy as np

        if self.rows is None:
            return np.searchsorted(self.packed, _packed(attempt, step, k))
        return _row_index(self.rows, np.stack((attempt, step, k), axis=1))

    def table(self) -> Any:
        """The distinct keys as (n, 3) rows, sorted."""
        return _unpacked(self.packed) if self.rows is None else self.rows


class Heatmap:
    """Rank x step-execution matrices of step time and compute time (ms), binned when wide.

    Two passes over the sessions' cuts, one session at a time (``RunAnalysis.cuts`` cuts a
    rank again when asked for, so memory holds one rank's executions and the matrices): the
    first finds the distinct (attempt, step, k) keys, the columns; the second adds each
    execution into its rank's cell, in the job's order of sessions and executions."""

    def __init__(self, analysis: RunAnalysis) -> None:
        import numpy as np

        sessions = sorted(analysis.cuts)
        self.ranks = sorted({analysis.sessions[i].rank for i in sessions})
        row_of = {rank: i for i, rank in enumerate(self.ranks)}
        keys = _Keys()
        for i in sessions:  # the distinct keys, sorted (attempt, step, k)
            attempt, step, k, _, _ = _execution_columns(analysis, i)
            keys.add(attempt, step, k)
        keys_array = keys.table()
        width = max(1, math.ceil(len(keys_array) / MAX_HEATMAP_COLUMNS))
        several = len(np.unique(keys_array[:, 0])) > 1
        columns = []
        for start in range(0, len(keys_array), width):
            end = min(start + width, len(keys_array))
            (a0, s0, k0), (a1, s1, _) = keys_array[start].tolist(), keys_array[end - 1].tolist()
            label = f"{s0}" if end - start == 1 else f"{s0}-{s1}"
            if end - start == 1 and k0:
                label += f" (run {k0 + 1})"
            if several:
                label = f"a{a0}:{label}" if a0 == a1 else f"a{a0}:{s0}-a{a1}:{s1}"
            columns.append(label)
        self.columns = columns
        self.width = width
        n = len(columns)
        size = len(self.ranks) * n
        step_sums, compute_sums = np.zeros(size), np.zeros(size)
        counts = np.zeros(size, dtype=np.int64)
        for i in sessions:  # np.add.at adds in execution order, as one loop over the job would
            attempt, step, k, step_ns, compute_ns = _execution_columns(analysis, i)
            key_index = keys.index(attempt, step, k)
            cell = row_of[analysis.sessions[i].rank] * n + key_index // width
            np.add.at(step_sums, cell, step_ns / 1e6)
            np.add.at(compute_sums, cell, compute_ns / 1e6)
            np.add.at(counts, cell, 1)

        def matrix(values: Any) -> list[list[Any]]:
            return list(values.reshape(len(self.ranks), n).tolist()) if size else [[] for _ in self.ranks]

        self.sums = {"step": matrix(step_sums), "compute": matrix(compute_sums)}
        self.counts: list[list[int]] = matrix(counts)
        self.hosts: dict[int, str] = {}
        for i in sessions:
            info = analysis.sessions[i]
            self.hosts.setdefault(info.rank, info.host)

    def result(self) -> dict[str, Any]:
        def matrix(name: str) -> list[list[float | None]]:
            return [[rounded(v / c, 3) if c else None for v, c in zip(values, count_row, strict=True)]
                    for values, count_row in zip(self.sums[name], self.counts, strict=True)]

        has_compute = any(v for row in self.sums["compute"] for v in row)
        return {"ranks": self.ranks, "hosts": [self.hosts.get(r, "?") for r in self.ranks],
                "columns": self.columns, "bin": self.width, "step_ms": matrix("step"),
                "compute_ms": matrix("compute") if has_compute else None}


# One span kept for the gantt: t0, t1 (its session's clock), category, thread, name, step.
_GanttSpan = tuple[int, int, str, Any, str, Any]


@dataclasses.dataclass
class _GanttRow:
    session: int
    marks: list[tuple[int, int]]  # (t0, step) of each interval in the range
    spans: list[_GanttSpan]


class Gantt:
    """The gantt chart of every rank's spans for the chosen (attempt, first, last) range."""

    def __init__(self, analysis: RunAnalysis, chosen: tuple[int, int, int] | None) -> None:
        self.analysis = analysis
        self.chosen = chosen
        self.rows: dict[int, _GanttRow] = {}
        self.clock_ranges: dict[int, tuple[int, int]] = {}
        self.order: list[int] = []
        self._strings: dict[str, str] = {}
        if chosen is None:
            return
        attempt, first, last = chosen
        for i in analysis.cuts:
            if analysis.attempt_of.get(i) != attempt:
                continue
            intervals = session_intervals(analysis, i, (first, last))
            if intervals:
                self.clock_ranges[i] = (intervals[0].start, intervals[-1].end)
                self.rows[i] = _GanttRow(i, [(iv.start, iv.step) for iv in intervals], [])
        # rows in rank order; the rows past MAX_GANTT_ITEMS are not read at all once known
        self.order = sorted(self.rows, key=lambda i: analysis.sessions[i].rank)

    def add(self, session: int, records: Iterable[RawRecord]) -> None:
        row = self.rows.get(session)
        if row is None:
            return
        w0, w1 = self.clock_ranges[session]
        intern = self._strings.setdefault
        for r in records:
            if r.kind != schema.SPAN or r.t0 is None or r.t1 is None or not (r.t1 > w0 and r.t0 < w1):
                continue
            category, name = str(r.category), str(r.name)
            row.spans.append((r.t0, r.t1, intern(category, category), r.tid, intern(name, name), r.step))

    def result(self) -> dict[str, Any] | None:
        if self.chosen is None or not self.rows:
            return None
        attempt, first, last = self.chosen
        analysis = self.analysis
        to_wall = analysis.to_wall
        origin = min(to_wall(i, self.clock_ranges[i][0]) for i in self.order)
        names: dict[str, int] = {}
        categories: dict[str, int] = {}
        items: list[list[float | int]] = []
        rows: list[str] = []
        marks: list[list[Any]] = []
        truncated = False
        for index, i in enumerate(self.order):
            if len(items) > MAX_GANTT_ITEMS:
                truncated = True
                break
            info = analysis.sessions[i]
            rows.append(f"rank {info.rank} ({info.host})")
            row = self.rows[i]
            if index == 0:
                marks = [[rounded((to_wall(i, t0) - origin) / 1e6), f"step {step}"] for t0, step in row.marks]
            row.spans.sort(key=lambda r: (r[0], -r[1]))
            stacks: dict[Any, list[int]] = {}
            wall = analysis.wall_of(i)  # most sessions' mapping is one shift: no call chain a time
            row_index = len(rows) - 1
            for t0, t1, category, tid, name, step in row.spans:
                lane = 2 if category == schema.DEVICE_CATEGORY else (0 if tid == info.main_tid else 1)
                stack = stacks.setdefault((lane, tid), [])
                while stack and stack[-1] <= t0:
                    stack.pop()
                depth = len(stack)
                stack.append(t1)
                items.append([
                    row_index, rounded((wall(t0) - origin) / 1e6), rounded((wall(t1) - origin) / 1e6),
                    names.setdefault(name, len(names)), categories.setdefault(category, len(categories)),
                    step if isinstance(step, int) else -1, min(depth, 5), lane,
                ])
        return {"attempt": attempt, "steps": [first, last], "rows": rows, "names": list(names),
                "categories": list(categories), "items": items, "marks": marks, "truncated": truncated}

    def wanted(self) -> Iterator[Mapping[int, tuple[int, int] | None]]:
        """The sessions and intervals whose spans the chart needs, :data:`READ_ROWS` rows at a
        time in the chart's order, until the rows read hold more spans than it draws
        (:data:`MAX_GANTT_ITEMS`: :meth:`result` stops at the same row), so that the rows past
        it are not read at all (10,000 ranks of 20 steps read 2 M spans for 600,000 drawn)."""
        read = 0
        for lo in range(0, len(self.order), READ_ROWS):
            part = self.order[lo:lo + READ_ROWS]
            yield {i: self.clock_ranges[i] for i in part}  # the caller adds their spans
            read += sum(len(self.rows[i].spans) for i in part)
            if read > MAX_GANTT_ITEMS:
                return
