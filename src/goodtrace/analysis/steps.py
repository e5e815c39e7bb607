"""The step table (pure functions; its statistics and anomalies: :mod:`goodtrace.analysis.anomalies`).

One row per step execution of the reference rank, in time order (``seq`` numbers executions
within a session; a repeated or decreasing step number is flagged, never merged). Step time is
the whole interval T_k - T_{k-1}; when several executions share an interval (sparse
completion) each gets the interval average and ``shared`` is set; ``host_timed`` marks intervals
closed by a host exit rather than an observed sync point.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple, overload

from goodtrace import schema
from goodtrace.analysis.cut import FLAG_DECREASING, FLAG_REPEATED, HOST_EXIT
from goodtrace.analysis.overhead import codes_in, label_codes
from goodtrace.analysis.partition import (
    PRODUCTIVE,
    WARMUP,
    WASTED,
    IntervalList,
    Segment,
    StepInterval,
    segment_interval,
)
from goodtrace.read.loaded import SessionTimeline

NS = 1e9


@dataclasses.dataclass(frozen=True)
class StepRow:
    """One execution of one step on the reference rank. Times in seconds; ``start_s`` is
    relative to the job start."""

    step: int
    attempt: int
    start_s: float
    step_time_s: float
    productive_s: float
    overhead_s: dict[str, float]
    shared: int  # number of executions sharing the interval (1 = per-step truth)
    host_timed: bool
    first_of_attempt: bool
    counted: bool  # counts toward the final progress (False: re-done after a restart or a rollback)
    seq: int = 0  # the execution within its session (entry order)
    start_ns: int = 0  # the interval (start_ns, end_ns] on the wall clock (shared when sparse)
    end_ns: int = 0
    sync: str = ""  # how the interval's closing sync point was taken
    repeated: bool = False  # this step number ran before in the same session
    decreasing: bool = False  # lower than the previous execution's step number
    tags: tuple[str, ...] = ()
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    device_s: float | None = None
    compute_s: float | None = None

    def items(self) -> Iterable[tuple[str, Any]]:
        """Every field and its value, in order (a frozen dataclass's instance dict), not copied:
        what :meth:`to_dict` holds, for a reader that only reads (the JSON step table)."""
        return vars(self).items()

    def to_dict(self) -> dict[str, Any]:
        # the fields, the containers copied: dataclasses.asdict's deep copy of every field took
        # 20 us a row, of a million rows
        out = dict(self.items())
        out["overhead_s"], out["metrics"], out["tags"] = dict(self.overhead_s), dict(self.metrics), list(self.tags)
        return out

    def explain(self) -> str:
        """``3.420 s = 0.610 s productive + 2.810 s checkpoint_save`` (units that fit: ``ms``,
        ``us`` below a millisecond)."""
        parts = [f"{seconds_text(self.productive_s)} productive"]
        parts += [f"{seconds_text(v)} {k}" for k, v in sorted(self.overhead_s.items(), key=lambda kv: -kv[1])
                  if v > 0]
        return f"{seconds_text(self.step_time_s)} = " + " + ".join(parts)


def seconds_text(seconds: float) -> str:
    """A duration under a minute for people: ``3.420 s``, ``0.120 s``; below a millisecond in
    ``ms`` or ``us``, where seconds to three decimals would read ``0.000 s``."""
    size = abs(seconds)
    if size == 0 or size >= 1e-3:
        return f"{seconds:.3f} s"
    if size >= 1e-4:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.2f} us"


class RowIntervals(NamedTuple):
    """The step table's rows as columns: each row's step number, and its interval's start and
    end on the wall clock (ns)."""

    steps: Any
    starts: Any
    ends: Any


class StepColumns(NamedTuple):
    """The step table as columns, one entry per row: what a view of every row reads, without
    making a :class:`StepRow` each (the same numbers as the rows)."""

    step: Any
    seq: Any
    attempt: Any
    shared: Any
    start_ns: Any
    end_ns: Any
    productive_s: Any
    overhead_s: dict[str, Any]  # category -> s per row (the categories some row has time in)
    device_s: Any  # s, NaN where the step's device time was not measured (or is not finite)
    tags: list[tuple[int, tuple[str, ...]]]  # (row, its step's tags) of the rows with tags


class StepTable(Sequence[StepRow]):
    """The step table: one row per execution of the reference rank, in time order, held as
    columns (a week-long run has hundreds of thousands of rows); a :class:`StepRow` is made
    when a row is read, from its interval and the session's per-step marks. The columns that
    statistics, anomalies and the slowest steps need are numpy arrays."""

    def __init__(self, intervals: IntervalList, marks: dict[int, SessionTimeline], job_start: int) -> None:
        import numpy as np

        self._intervals = intervals
        self._marks = {session: StepMarks(tl) for session, tl in marks.items()}
        self._job_start = job_start
        segment_of, interval_of, position, step_time, productive = [], [], [], [], []
        for k, segment in enumerate(intervals.segments):
            cut = segment.cut
            count = np.frombuffer(cut.interval_count, dtype=np.int64)
            interval_productive = np.frombuffer(cut.interval_productive, dtype=np.int64).copy()
            interval_productive[0] -= segment.relabels.warmup_ns
            w = np.repeat(np.arange(len(count), dtype=np.int32), count)
            segment_of.append(np.full(len(w), k, dtype=np.int32))
            interval_of.append(w)
            position.append((np.arange(len(w)) - np.frombuffer(cut.interval_first, dtype=np.int64)[w]).astype(np.int32))
            step_time.append((cut.step_ns() / NS)[w])
            productive.append((interval_productive / count / NS)[w])

        def joined(parts: list[Any], dtype: Any) -> Any:
            return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

        # per row: its session (segment), interval and place in the interval; the step time and
        # productive time (the interval's, shared equally); the rest is gathered from the cuts
        self._segment = joined(segment_of, np.int32)
        self._interval = joined(interval_of, np.int32)
        self._position = joined(position, np.int32)
        self.step_time_s = joined(step_time, np.float64)
        self.productive_s = joined(productive, np.float64)
        self.first_of_attempt = (self._interval == 0) & (self._position == 0)
        self._device: Any = None  # device_s(), made when first read

    def _rows_of(self, k: int) -> slice:
        """The rows of segment ``k``: consecutive, as the table is in segment order."""
        lo, hi = self._segment.searchsorted((k, k + 1))
        return slice(int(lo), int(hi))

    def _gather(self, column: Callable[[Segment], Any], by_interval: bool) -> Any:
        """A per-row column from each segment's per-interval (or per-execution) column."""
        import numpy as np

        out = [self._of_segment(k, column(segment), by_interval) for k, segment in enumerate(self._intervals.segments)]
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def _of_segment(self, k: int, values: Any, by_interval: bool) -> Any:
        """Segment ``k``'s rows of its per-interval (or per-execution) column ``values``."""
        import numpy as np

        rows = self._rows_of(k)
        if by_interval:
            return values[self._interval[rows]]
        first = np.frombuffer(self._intervals.segments[k].cut.interval_first, dtype=np.int64)[self._interval[rows]]
        return values[first + self._position[rows]]

    @property
    def attempt(self) -> Any:
        return self._gather(lambda s: _np_full(s.cut.intervals, s.attempt), by_interval=True)

    @property
    def seq(self) -> Any:
        return self._gather(lambda s: _np_ints(s.cut.exec_seq), by_interval=False)

    @property
    def flags(self) -> Any:
        return self._gather(lambda s: _np_ints(s.cut.exec_flags), by_interval=False)

    @property
    def shared(self) -> Any:
        return self._gather(lambda s: _np_ints(s.cut.interval_count), by_interval=True)

    @property
    def host_timed(self) -> Any:
        import numpy as np

        def of(s: Segment) -> Any:
            hows = s.cut.interval_how
            if s.cut.host_timed or HOST_EXIT not in hows:  # the whole session, or none of it (no Python step per interval)
                return np.full(len(hows), s.cut.host_timed, dtype=bool)
            return codes_in(*label_codes(hows), (HOST_EXIT,))

        return self._gather(of, by_interval=True)

    def __len__(self) -> int:
        return len(self.step_time_s)

    @overload
    def __getitem__(self, index: int) -> StepRow: ...

    @overload
    def __getitem__(self, index: slice) -> list[StepRow]: ...

    def __getitem__(self, index: int | slice) -> StepRow | list[StepRow]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        return self.row_at(index)[0]

    def row_at(self, index: int) -> tuple[StepRow, StepInterval]:
        """Row ``index`` (not negative) and its step interval, made once for both."""
        if not 0 <= index < len(self):
            raise IndexError(index)
        interval = self.interval_at(index)
        return self._row(interval, int(self._position[index]), float(self.step_time_s[index]),
                         float(self.device_s()[index])), interval

    def execution_at(self, index: int) -> tuple[StepInterval, int]:
        """Row ``index``'s step interval and its execution (an index into the interval's cut)."""
        interval = self.interval_at(index)
        return interval, interval.executions[int(self._position[index])]

    def __iter__(self) -> Iterator[StepRow]:
        # a block of rows at a time: their steps' tags and metrics looked up together (a
        # search per block, not two per row), each interval made once for its rows
        for k, segment in enumerate(self._intervals.segments):
            mine = self._rows_of(k)
            marks = self._marks.get(segment.cut.session)
            for lo in range(mine.start, mine.stop, _ROW_BLOCK):
                block = slice(lo, min(lo + _ROW_BLOCK, mine.stop))
                intervals, positions = self._interval[block], self._position[block]
                if marks is not None:
                    first = _np_ints(segment.cut.interval_first)[intervals]
                    steps = _np_ints(segment.cut.exec_step)[first + positions]
                    tags, metrics = marks.tags_of(steps), marks.metrics_of(steps)
                    del first, steps
                else:
                    tags, metrics = [()] * (block.stop - block.start), [{} for _ in range(block.stop - block.start)]
                interval: StepInterval | None = None
                last = -1
                for w, position, step_time_s, device_s, row_tags, row_metrics in zip(
                        intervals.tolist(), positions.tolist(), self.step_time_s[block].tolist(),
                        self.device_s()[block].tolist(), tags, metrics, strict=True):
                    if w != last or interval is None:
                        interval, last = segment_interval(segment, w), w
                    yield self._row(interval, position, step_time_s, device_s, (row_tags, row_metrics))

    def marks_of(self, session: int) -> StepMarks | None:
        """The per-step marks (tags, metrics, span time) of ``session``, None without them."""
        return self._marks.get(session)

    def interval_at(self, index: int) -> StepInterval:
        """The step interval of row ``index``."""
        return segment_interval(self._intervals.segments[int(self._segment[index])], int(self._interval[index]))

    def take(self, keep: Any) -> StepTable:
        """The rows where the boolean column ``keep`` is true, as a table over the same intervals
        (``--since``/``--until``)."""
        out = object.__new__(StepTable)
        out._intervals, out._marks, out._job_start = self._intervals, self._marks, self._job_start
        for name in ("_segment", "_interval", "_position", "step_time_s", "productive_s", "first_of_attempt"):
            setattr(out, name, getattr(self, name)[keep])
        out._device = None if self._device is None else self._device[keep]
        return out

    def intervals(self) -> RowIntervals:
        """Each row's step number and its interval's start and end (ns, on the wall clock), as
        columns: made when asked (what a ``--since``/``--until`` time range is resolved on)."""
        steps = self._gather(lambda s: _np_ints(s.cut.exec_step), by_interval=False)
        starts = self._gather(lambda s: _np_ints(s.cut.interval_start) + s.delta, by_interval=True)
        ends = self._gather(lambda s: _np_ints(s.cut.interval_end) + s.delta, by_interval=True)
        return RowIntervals(steps, starts, ends)

    def columns(self) -> StepColumns:
        """Every row as columns (:class:`StepColumns`): each interval's overhead per category
        from its cut's columns, shared equally like its productive time, with the attempt's
        warm-up in its first interval; tags and device time from the session's marks."""
        import numpy as np

        n = len(self)
        rows = self.intervals()
        overhead: dict[str, Any] = {}
        tags: list[tuple[int, tuple[str, ...]]] = []
        for k, segment in enumerate(self._intervals.segments):
            mine = self._rows_of(k)
            if mine.start == mine.stop:
                continue
            interval = self._interval[mine]
            count = np.frombuffer(segment.cut.interval_count, dtype=np.int64)[interval]
            per_label: list[tuple[str, Any]] = list(segment.cut.interval_overhead.items())
            if segment.relabels.warmup_ns:
                per_label.append((WARMUP, None))
            for label, values in per_label:  # one category's column at a time
                ns = (np.where(interval == 0, segment.relabels.warmup_ns, 0) if values is None
                      else np.frombuffer(values, dtype=np.int64)[interval])
                if bool((ns > 0).any()):
                    overhead.setdefault(label, np.zeros(n))[mine] = np.where(ns > 0, ns / count / NS, 0.0)
                del ns
            marks = self._marks.get(segment.cut.session)
            if marks is None:
                continue
            steps = rows.steps[mine]
            tagged = np.flatnonzero(np.isin(steps, marks.tag_steps))
            tags.extend((mine.start + j, marks.tags(int(steps[j]))) for j in tagged.tolist())  # in row order
        return StepColumns(rows.steps, self.seq, self.attempt, self.shared, rows.starts, rows.ends, self.productive_s,
                           overhead, self.device_s(), tags)

    def device_s(self) -> Any:
        """Each row's device time (s) where the framework measured its step (CUDA events), NaN
        where not (or not finite): the one derivation of it, which rows and columns read. Made
        once, when first asked for."""
        import numpy as np

        if self._device is None:
            device = np.full(len(self), np.nan)
            for k, segment in enumerate(self._intervals.segments):
                mine = self._rows_of(k)
                marks = self._marks.get(segment.cut.session)
                if marks is not None and mine.start != mine.stop and any(key in marks.tl.names for key in _DEVICE_KEYS):
                    device[mine] = marks.device_seconds(self._of_segment(k, _np_ints(segment.cut.exec_step), False))
            device[~np.isfinite(device)] = np.nan
            self._device = device
        return self._device

    def slowest(self, n: int) -> list[StepRow]:
        """The ``n`` rows with the longest step time (earlier rows first on a tie)."""
        import numpy as np

        order = np.argsort(-self.step_time_s, kind="stable")[:n]
        return [self[int(i)] for i in order]

    def _row(self, w: StepInterval, position: int, step_time_s: float, device_s: float,
             marks_found: tuple[tuple[str, ...], dict[str, float]] | None = None) -> StepRow:
        """Row ``position`` of interval ``w`` (``marks_found``: its step's tags and metrics, found
        with its block's; else looked up here)."""
        cut = w.cut
        executions = w.executions
        i = executions[position]
        n = len(executions)
        overhead = w.overhead()
        wasted = overhead.pop(WASTED, 0)
        productive = w.total(PRODUCTIVE) + wasted
        how = cut.interval_how[w.index]
        step = cut.exec_step[i]
        flags = cut.exec_flags[i]
        if marks_found is None:
            marks = self._marks.get(cut.session)
            marks_found = (marks.tags(step), marks.metrics(step)) if marks is not None else ((), {})
        tags, metrics = marks_found
        return _step_row({  # every field, in order
            "step": step,
            "attempt": w.attempt,
            "start_s": (w.start - self._job_start) / NS,
            "step_time_s": step_time_s,
            "productive_s": productive / n / NS,
            "overhead_s": {k: v / n / NS for k, v in overhead.items()},
            "shared": n,
            "host_timed": cut.host_timed or how == HOST_EXIT,
            "first_of_attempt": w.first_of_attempt and position == 0,
            "counted": i not in w.lost,
            "seq": cut.exec_seq[i],
            "start_ns": w.start,
            "end_ns": w.end,
            "sync": how,
            "repeated": bool(flags & FLAG_REPEATED),
            "decreasing": bool(flags & FLAG_DECREASING),
            "tags": tags,
            "metrics": metrics,
            "device_s": None if math.isnan(device_s) else device_s,
            "compute_s": cut.exec_compute[i] / NS if cut.exec_compute[i] else None,
        })


def _step_row(fields: dict[str, Any]) -> StepRow:
    """The :class:`StepRow` whose instance dict is ``fields`` (every field, in order): what its
    frozen dataclass ``__init__`` makes, without its call per field (3.5 us of a row's 15, of a
    million rows); a test holds the rows equal to ``StepRow(**fields)``."""
    row = object.__new__(StepRow)
    object.__setattr__(row, "__dict__", fields)
    return row


def _np_ints(values: Any) -> Any:
    import numpy as np

    return np.frombuffer(values, dtype=np.int64)


def _np_full(n: int, value: int) -> Any:
    import numpy as np

    return np.full(n, value, dtype=np.int64)


class StepMarks:
    """One session's tags and metric values by step (columns sorted by step, time order kept
    within a step), and its spans' time per name and step, for the step table and anomalies."""

    def __init__(self, tl: SessionTimeline) -> None:
        import numpy as np

        self.tl = tl
        tag_steps = np.frombuffer(tl.tag_step, dtype=np.int64)
        self._tag_order = np.argsort(tag_steps, kind="stable")
        self._tag_steps = tag_steps[self._tag_order]
        metric_steps = np.frombuffer(tl.metric_step, dtype=np.int64)
        self._metric_order = np.argsort(metric_steps, kind="stable")
        self._metric_steps = metric_steps[self._metric_order]
        self._span_steps = np.frombuffer(tl.span_step, dtype=np.int64)
        self._span_medians: dict[str, float] | None = None
        self._events: dict[int, list[str]] | None = None
        self._rank: dict[int, int] | None = None

    def events(self, step: int) -> list[str]:
        """The names of the events recorded with ``step``, in time order (indexed once: an
        anomaly asks for its own steps', and a run may record an event every step)."""
        if self._events is None:
            self._events = {}
            for name, _, at, _ in self.tl.events:
                if at is not None:
                    self._events.setdefault(at, []).append(name)
        return self._events.get(step, [])

    def tags(self, step: int) -> tuple[str, ...]:
        """The tags of ``step``, in time order."""
        return self._tags_in(*self._range(self._tag_steps, step))

    def metrics(self, step: int) -> dict[str, float]:
        """The metric values recorded for ``step`` (the last one of a name it has twice)."""
        return self._metrics_in(*self._range(self._metric_steps, step))

    def tags_of(self, steps: Any) -> list[tuple[str, ...]]:
        """:meth:`tags` of each of ``steps`` (an integer column), found in one search."""
        return [self._tags_in(lo, hi) if hi > lo else () for lo, hi in self._ranges(self._tag_steps, steps)]

    def metrics_of(self, steps: Any) -> list[dict[str, float]]:
        """:meth:`metrics` of each of ``steps`` (an integer column), found in one search."""
        return [self._metrics_in(lo, hi) if hi > lo else {} for lo, hi in self._ranges(self._metric_steps, steps)]

    def _tags_in(self, lo: int, hi: int) -> tuple[str, ...]:
        names, codes = self.tl.names, self.tl.tag_name
        return tuple(names[codes[j]] for j in self._tag_order[lo:hi].tolist())

    def _metrics_in(self, lo: int, hi: int) -> dict[str, float]:
        names, codes, values = self.tl.names, self.tl.metric_name, self.tl.metric_value
        return {names[codes[j]]: values[j] for j in self._metric_order[lo:hi].tolist()}

    @property
    def tag_steps(self) -> Any:
        """The steps with tags (sorted, repeated where a step has several)."""
        return self._tag_steps

    def device_seconds(self, steps: Any) -> Any:
        """The device-busy time of each of ``steps`` where the framework measured it (NaN where
        not): per step the last value of the first metric of :data:`_DEVICE_KEYS` it has."""
        import numpy as np

        out = np.full(len(steps), np.nan)
        found = np.zeros(len(steps), dtype=bool)
        codes = np.frombuffer(self.tl.metric_name, dtype=np.int32)[self._metric_order]
        values = np.frombuffer(self.tl.metric_value, dtype=np.float64)[self._metric_order]
        for key in _DEVICE_KEYS:
            if key not in self.tl.names:
                continue
            mine = codes == self.tl.names.index(key)
            at_steps, at_values = self._metric_steps[mine], values[mine]
            last = np.concatenate((at_steps[1:] != at_steps[:-1], [True])) if len(at_steps) else np.zeros(0, dtype=bool)
            at_steps, at_values = at_steps[last], at_values[last]  # the last value of each step
            where = np.minimum(np.searchsorted(at_steps, steps), max(len(at_steps) - 1, 0))
            hit = ~found & (at_steps[where] == steps) if len(at_steps) else np.zeros(len(steps), dtype=bool)
            out[hit] = at_values[where[hit]]
            found |= hit
        return out

    def metric_sum(self, step: int, name: str) -> float:
        """The sum of every value of metric ``name`` recorded for ``step``."""
        lo, hi = self._range(self._metric_steps, step)
        total = 0.0
        for j in self._metric_order[lo:hi].tolist():
            if self.tl.names[self.tl.metric_name[j]] == name and self.tl.metric_value[j]:
                total += self.tl.metric_value[j]
        return total

    def span_totals(self, steps: Sequence[int]) -> dict[str, int]:
        """Summed span time per name over ``steps``, of the names with a span there (in order of
        first appearance: a run may have as many names as steps, so not all of them each time)."""
        took: dict[int, int] = {}
        for step in steps:
            lo, hi = self._range(self._span_steps, step)
            for j in range(lo, hi):
                code = self.tl.span_name[j]
                took[code] = took.get(code, 0) + self.tl.span_ns[j]
        rank = self._name_rank()
        return {self.tl.names[code]: took[code] for code in sorted(took, key=rank.__getitem__)}

    def _name_codes(self) -> list[int]:
        """The code of each span name (in order of first appearance): its first place in ``names``."""
        code_of: dict[str, int] = {}
        for k, name in enumerate(self.tl.names):
            code_of.setdefault(name, k)
        return [code_of[name] for name in self.tl.span_names]

    def _name_rank(self) -> dict[int, int]:
        """Each span name's code -> its place in the order of first appearance."""
        if self._rank is None:
            self._rank = {code: k for k, code in enumerate(self._name_codes())}
        return self._rank

    def span_medians(self) -> dict[str, float]:
        """Per span name, its median time per step over the steps that have any span (a step
        without the name counts 0): from the values sorted per name, the zeros counted, not
        made (a run may have as many names as steps)."""
        import numpy as np

        if self._span_medians is None:
            sorted_steps = self._span_steps  # sorted by step (SessionTimeline)
            count = int(np.count_nonzero(sorted_steps[1:] != sorted_steps[:-1])) + 1 if len(sorted_steps) else 0
            codes = np.frombuffer(self.tl.span_name, dtype=np.int32)
            totals = np.frombuffer(self.tl.span_ns, dtype=np.int64)
            present = np.flatnonzero(np.bincount(codes)) if len(codes) else np.zeros(0, dtype=np.int64)
            if len(present) <= _FEW_NAMES:  # a pass per name, no sort of every row (millions: one per step and name)
                by_code = {code: _median_with_zeros_unsorted(totals[codes == code], count)
                           for code in present.tolist()}
                self._span_medians = {name: by_code.get(code, 0.0) if count else 0.0
                                      for name, code in zip(self.tl.span_names, self._name_codes(), strict=True)}
                return self._span_medians
            order = np.lexsort((totals, codes))  # by name, then by value
            codes, totals = codes[order], totals[order]
            bounds: dict[int, tuple[int, int]] = {}  # code -> its rows
            if len(codes):
                firsts = np.flatnonzero(np.concatenate(([True], codes[1:] != codes[:-1])))
                ends = np.concatenate((firsts[1:], [len(codes)]))
                bounds = {code: (lo, hi) for code, lo, hi in
                          zip(codes[firsts].tolist(), firsts.tolist(), ends.tolist(), strict=True)}
            self._span_medians = {}
            for name, code in zip(self.tl.span_names, self._name_codes(), strict=True):
                lo, hi = bounds.get(code, (0, 0))
                self._span_medians[name] = _median_with_zeros(totals[lo:hi], count) if count else 0.0
        return self._span_medians

    @staticmethod
    def _range(sorted_steps: Any, step: int) -> tuple[int, int]:
        lo = int(sorted_steps.searchsorted(step, side="left"))
        hi = int(sorted_steps.searchsorted(step, side="right"))
        return lo, hi

    @staticmethod
    def _ranges(sorted_steps: Any, steps: Any) -> Iterator[tuple[int, int]]:
        """:meth:`_range` of each of ``steps``."""
        lo = sorted_steps.searchsorted(steps, side="left")
        hi = sorted_steps.searchsorted(steps, side="right")
        return zip(lo.tolist(), hi.tolist(), strict=True)


_DEVICE_KEYS = (schema.DEVICE_BUSY_METRIC, "device_time_s")
_ROW_BLOCK = 1 << 16  # rows made at a time when the table is walked (their marks looked up together)


_FEW_NAMES = 16  # span names up to which their medians are taken name by name (else from one sort)


def _median_with_zeros_unsorted(values: Any, count: int) -> float:
    """:func:`_median_with_zeros` of ``values`` in any order: the two places it reads, from a
    partition of them."""
    import numpy as np

    zeros = count - len(values)
    below = int(np.count_nonzero(values < 0))  # the values sorted before the zeros
    lo, hi = (count - 1) // 2, count // 2
    places = sorted({p if p < below else p - zeros for p in (lo, hi) if not below <= p < below + zeros})
    part = np.partition(values, places) if places else values
    return _median_with_zeros(part, count, below)


def _median_with_zeros(values: Any, count: int, below: int | None = None) -> float:
    """``np.median`` of ``values`` (sorted, or partitioned at the places read; ``below``: how many
    are negative) with ``count - len(values)`` zeros beside them, to the bit: the middle
    element, or the float64 mean of the middle two."""
    import numpy as np

    zeros = count - len(values)
    if below is None:
        below = int(np.searchsorted(values, 0, side="left"))  # the values sorted before the zeros

    def at(position: int) -> Any:
        if position < below:
            return values[position]
        if position < below + zeros:
            return np.int64(0)
        return values[position - zeros]

    lo, hi = (count - 1) // 2, count // 2
    return float(np.mean(np.array([at(lo), at(hi)], dtype=np.int64))) if lo != hi else float(np.mean(np.array([at(lo)])))
