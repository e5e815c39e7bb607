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

from goodtrace.analysis.cut import FLAG_DECREASING, FLAG_REPEATED, HOST_EXIT
from goodtrace.analysis.partition import (
    PRODUCTIVE,
    WARMUP,
    WASTED,
    IntervalList,
    PlacedCut,
    StepInterval,
    placed_interval,
    plain_intervals,
)
from goodtrace.analysis.step_detail import StepDetail
from goodtrace.columns import codes_in, int64s, label_codes
from goodtrace.read.loaded import SessionDetail

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


_ROW_BLOCK = 1 << 16  # rows made at a time when the table is walked (their detail looked up together)


class StepTable(Sequence[StepRow]):
    """The step table: one row per execution of the reference rank, in time order, held as
    columns (a week-long run has hundreds of thousands of rows); a :class:`StepRow` is made
    when a row is read, from its interval and the session's per-step detail. The columns that
    statistics, anomalies and the slowest steps need are numpy arrays."""

    def __init__(self, intervals: IntervalList, detail: dict[int, SessionDetail], job_start: int) -> None:
        import numpy as np

        self._intervals = intervals
        cuts = {placed.cut.session: placed.cut for placed in intervals.placed}
        self._detail = {session: StepDetail(tl, cuts.get(session)) for session, tl in detail.items()}
        self._job_start = job_start
        placed_of, interval_of, position, step_time, productive = [], [], [], [], []
        for k, placed in enumerate(intervals.placed):
            cut = placed.cut
            count = np.frombuffer(cut.interval_count, dtype=np.int64)
            interval_productive = np.frombuffer(cut.interval_productive, dtype=np.int64).copy()
            interval_productive[0] -= placed.relabels.warmup_ns
            w = np.repeat(np.arange(len(count), dtype=np.int32), count)
            placed_of.append(np.full(len(w), k, dtype=np.int32))
            interval_of.append(w)
            position.append((np.arange(len(w)) - np.frombuffer(cut.interval_first, dtype=np.int64)[w]).astype(np.int32))
            step_time.append((cut.step_ns() / NS)[w])
            productive.append((interval_productive / count / NS)[w])

        def joined(parts: list[Any], dtype: Any) -> Any:
            return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

        # per row: its session (placed cut), interval and place in the interval; the step time and
        # productive time (the interval's, shared equally); the rest is gathered from the cuts
        self._placed = joined(placed_of, np.int32)
        self._interval = joined(interval_of, np.int32)
        self._position = joined(position, np.int32)
        self.step_time_s = joined(step_time, np.float64)
        self.productive_s = joined(productive, np.float64)
        self.first_of_attempt = (self._interval == 0) & (self._position == 0)
        self._device: Any = None  # device_s(), made when first read
        self._simple_of: dict[int, Any] = {}  # _simple(k), made when first read

    def _rows_of(self, k: int) -> slice:
        """The rows of placed ``k``: consecutive, as the table is in placement order."""
        lo, hi = self._placed.searchsorted((k, k + 1))
        return slice(int(lo), int(hi))

    def _gather(self, column: Callable[[PlacedCut], Any], by_interval: bool) -> Any:
        """A per-row column from each placed's per-interval (or per-execution) column."""
        import numpy as np

        out = [self._of_placed(k, column(placed), by_interval) for k, placed in enumerate(self._intervals.placed)]
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def _of_placed(self, k: int, values: Any, by_interval: bool) -> Any:
        """PlacedCut ``k``'s rows of its per-interval (or per-execution) column ``values``."""
        import numpy as np

        rows = self._rows_of(k)
        if by_interval:
            return values[self._interval[rows]]
        first = np.frombuffer(self._intervals.placed[k].cut.interval_first, dtype=np.int64)[self._interval[rows]]
        return values[first + self._position[rows]]

    @property
    def attempt(self) -> Any:
        return self._gather(lambda s: _np_full(s.cut.intervals, s.attempt), by_interval=True)

    @property
    def seq(self) -> Any:
        return self._gather(lambda s: int64s(s.cut.exec_seq), by_interval=False)

    @property
    def flags(self) -> Any:
        return self._gather(lambda s: int64s(s.cut.exec_flags), by_interval=False)

    @property
    def shared(self) -> Any:
        return self._gather(lambda s: int64s(s.cut.interval_count), by_interval=True)

    @property
    def host_timed(self) -> Any:
        import numpy as np

        def of(s: PlacedCut) -> Any:
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
        k = int(self._placed[index])
        columns = self._block(k, slice(index, index + 1))
        return _step_row(dict(zip(_FIELDS, (column[0] for column in columns), strict=True))), self.interval_at(index)

    def execution_at(self, index: int) -> tuple[StepInterval, int]:
        """Row ``index``'s step interval and its execution (an index into the interval's cut)."""
        interval = self.interval_at(index)
        return interval, interval.executions[int(self._position[index])]

    def __iter__(self) -> Iterator[StepRow]:
        for columns in self.blocks():
            for values in zip(*columns, strict=True):
                yield _step_row(dict(zip(_FIELDS, values, strict=True)))

    def blocks(self, size: int = _ROW_BLOCK) -> Iterator[list[list[Any]]]:
        """The rows in order, ``size`` rows at a time (fewer at the end of a session), as
        columns: one list per field of :class:`StepRow`, in its order, what the rows are made
        of (:meth:`_block`). A view that writes every row (the JSON step table) reads these
        without making a row each."""
        for k in range(len(self._intervals.placed)):
            mine = self._rows_of(k)
            for lo in range(mine.start, mine.stop, size):
                yield self._block(k, slice(lo, min(lo + size, mine.stop)))

    def detail_of(self, session: int) -> StepDetail | None:
        """The per-step detail (tags, metrics, span time) of ``session``, None without them."""
        return self._detail.get(session)

    def interval_at(self, index: int) -> StepInterval:
        """The step interval of row ``index``."""
        return placed_interval(self._intervals.placed[int(self._placed[index])], int(self._interval[index]))

    def take(self, keep: Any) -> StepTable:
        """The rows where the boolean column ``keep`` is true, as a table over the same intervals
        (``--since``/``--until``)."""
        out = object.__new__(StepTable)
        out._intervals, out._detail, out._job_start = self._intervals, self._detail, self._job_start
        for name in ("_placed", "_interval", "_position", "step_time_s", "productive_s", "first_of_attempt"):
            setattr(out, name, getattr(self, name)[keep])
        out._device = None if self._device is None else self._device[keep]
        out._simple_of = self._simple_of  # per interval: the same intervals
        return out

    def intervals(self) -> RowIntervals:
        """Each row's step number and its interval's start and end (ns, on the wall clock), as
        columns: made when asked (what a ``--since``/``--until`` time range is resolved on)."""
        steps = self._gather(lambda s: int64s(s.cut.exec_step), by_interval=False)
        starts = self._gather(lambda s: int64s(s.cut.interval_start) + s.delta, by_interval=True)
        ends = self._gather(lambda s: int64s(s.cut.interval_end) + s.delta, by_interval=True)
        return RowIntervals(steps, starts, ends)

    def columns(self) -> StepColumns:
        """Every row as columns (:class:`StepColumns`): each interval's overhead per category
        from its cut's columns, shared equally like its productive time, with the attempt's
        warm-up in its first interval; tags and device time from the session's detail."""
        import numpy as np

        n = len(self)
        rows = self.intervals()
        overhead: dict[str, Any] = {}
        tags: list[tuple[int, tuple[str, ...]]] = []
        for k, placed in enumerate(self._intervals.placed):
            mine = self._rows_of(k)
            if mine.start == mine.stop:
                continue
            interval = self._interval[mine]
            count = np.frombuffer(placed.cut.interval_count, dtype=np.int64)[interval]
            per_label: list[tuple[str, Any]] = list(placed.cut.interval_overhead.items())
            if placed.relabels.warmup_ns:
                per_label.append((WARMUP, None))
            for label, values in per_label:  # one category's column at a time
                ns = (np.where(interval == 0, placed.relabels.warmup_ns, 0) if values is None
                      else np.frombuffer(values, dtype=np.int64)[interval])
                if bool((ns > 0).any()):
                    overhead.setdefault(label, np.zeros(n))[mine] = np.where(ns > 0, ns / count / NS, 0.0)
                del ns
            detail = self._detail.get(placed.cut.session)
            if detail is None:
                continue
            steps = rows.steps[mine]
            tagged = np.flatnonzero(np.isin(steps, detail.tag_steps))
            tags.extend((mine.start + j, detail.tags(int(steps[j]))) for j in tagged.tolist())  # in row order
        return StepColumns(rows.steps, self.seq, self.attempt, self.shared, rows.starts, rows.ends, self.productive_s,
                           overhead, self.device_s(), tags)

    def device_s(self) -> Any:
        """Each row's device time (s) where the framework measured its step (CUDA events), NaN
        where not (or not finite): the one derivation of it, which rows and columns read. Made
        once, when first asked for."""
        import numpy as np

        if self._device is None:
            device = np.full(len(self), np.nan)
            for k, placed in enumerate(self._intervals.placed):
                mine = self._rows_of(k)
                detail = self._detail.get(placed.cut.session)
                if detail is not None and mine.start != mine.stop and detail.has_device_seconds():
                    device[mine] = detail.device_seconds(self._of_placed(k, int64s(placed.cut.exec_step), False))
            device[~np.isfinite(device)] = np.nan
            self._device = device
        return self._device

    def slowest(self, n: int) -> list[StepRow]:
        """The ``n`` rows with the longest step time (earlier rows first on a tie)."""
        import numpy as np

        order = np.argsort(-self.step_time_s, kind="stable")[:n]
        return [self[int(i)] for i in order]

    def _simple(self, k: int) -> Any:
        """Which intervals of placed ``k`` are *simple* (a bool column, made once): plain
        (:func:`plain_intervals`: nothing relabels them) and without overhead, so that each of
        their rows is all productive and counted, read from the cut's columns alone."""
        simple = self._simple_of.get(k)
        if simple is None:
            placed = self._intervals.placed[k]
            simple = plain_intervals(placed.cut, *placed.relabels)
            for values in placed.cut.interval_overhead.values():
                simple &= int64s(values) == 0
            self._simple_of[k] = simple
        return simple

    def _block(self, k: int, block: slice) -> list[list[Any]]:
        """Rows ``block`` (rows of placed ``k``) as one list per field of :class:`StepRow`, in
        its order: the one derivation of a row. The fields are the cut's columns at the rows'
        executions and intervals; a row's productive time is its interval's, shared equally
        (:attr:`productive_s`); where the interval is not simple (:meth:`_simple`), its
        productive time, overhead and whether it counts are read from its pieces."""
        import numpy as np

        placed = self._intervals.placed[k]
        cut = placed.cut
        w, position = self._interval[block], self._position[block]
        n = len(w)
        i = int64s(cut.interval_first)[w] + position
        steps = int64s(cut.exec_step)[i]
        flags = int64s(cut.exec_flags)[i]
        compute = int64s(cut.exec_compute)[i]
        how_codes, how_names = label_codes(cut.interval_how)
        how = how_codes[w]
        detail = self._detail.get(cut.session)
        if detail is not None:
            tags, metrics = detail.tags_of(steps), detail.metrics_of(steps)
        else:
            tags, metrics = [()] * n, [{} for _ in range(n)]
        productive = self.productive_s[block].tolist()
        overhead: list[dict[str, float]] = [{} for _ in range(n)]
        counted = [True] * n
        interval: StepInterval | None = None
        for j in np.flatnonzero(~self._simple(k)[w]).tolist():
            if interval is None or interval.index != int(w[j]):
                interval = placed_interval(placed, int(w[j]))
            shares = len(interval.executions)
            found = interval.overhead()
            wasted = found.pop(WASTED, 0)
            productive[j] = (interval.total(PRODUCTIVE) + wasted) / shares / NS
            overhead[j] = {label: v / shares / NS for label, v in found.items()}
            counted[j] = int(i[j]) not in interval.lost
        start = int64s(cut.interval_start)[w] + placed.delta
        host = np.full(n, True) if cut.host_timed else codes_in(how, how_names, (HOST_EXIT,))
        device = self.device_s()[block]
        return [
            steps.tolist(),
            [placed.attempt] * n,
            ((start - self._job_start) / NS).tolist(),
            self.step_time_s[block].tolist(),
            productive,
            overhead,
            int64s(cut.interval_count)[w].tolist(),
            host.tolist(),
            self.first_of_attempt[block].tolist(),
            counted,
            int64s(cut.exec_seq)[i].tolist(),
            start.tolist(),
            (int64s(cut.interval_end)[w] + placed.delta).tolist(),
            [how_names[code] for code in how.tolist()],
            ((flags & FLAG_REPEATED) != 0).tolist(),
            ((flags & FLAG_DECREASING) != 0).tolist(),
            tags,
            metrics,
            [None if math.isnan(v) else v for v in device.tolist()],
            [v / NS if v else None for v in compute.tolist()],
        ]


def _step_row(fields: dict[str, Any]) -> StepRow:
    """The :class:`StepRow` whose instance dict is ``fields`` (every field, in order): what its
    frozen dataclass ``__init__`` makes, without its call per field (3.5 us of a row's 15, of a
    million rows); a test holds the rows equal to ``StepRow(**fields)``."""
    row = object.__new__(StepRow)
    object.__setattr__(row, "__dict__", fields)
    return row


def _np_full(n: int, value: int) -> Any:
    import numpy as np

    return np.full(n, value, dtype=np.int64)


_FIELDS = tuple(field.name for field in dataclasses.fields(StepRow))  # a row's fields, in order
