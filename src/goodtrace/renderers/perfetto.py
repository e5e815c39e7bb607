"""Chrome/Perfetto trace JSON from a run's raw records (DESIGN.md section 6).

Contract: ``PerfettoRenderer(selection).write(run, path)`` writes one trace (``.json`` or
``.json.gz``) in which every rank is a process ``rank N (host)``; its tracks are the step
intervals (T_{k-1}, T_k] with their overhead split, each recorded thread, and device time when
recorded (spans of category ``device``). Spans are complete events (category and step in args),
tags and events are instant events, metrics are counters. All ranks share one time axis: each
session's monotonic clock is mapped through :func:`goodtrace.clocksync.clock_offsets`
(``reference = local + offset_ns``) and shown relative to the earliest process start of the
selection (its wall time is in the trace's ``otherData``).

The step-interval model (:func:`step_intervals`) and the selection helpers are shared with the
HTML renderer.

Memory: ``write`` takes a :class:`goodtrace.reader.Run` already in memory (small runs, tests)
or, for any size, a run directory or the :class:`goodtrace.reader.RunIndex` of
:meth:`PerfettoRenderer.index`. Then the run is read twice, one session at a time: first every
session's header, clock and finish records and step boundaries (:class:`StepSummary`: the
attempts, the clock alignment, the time origin and the selected window of each session must
be known before the first event), then each session's records, whose events go straight to
the (gzip) file. The output is the same either way.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import gzip
import io
import json
import math
import operator
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, Any

from goodtrace import schema
from goodtrace.reader import Run, RunIndex, Session, index_run

__all__ = [
    "COMFORTABLE_TRACE_BYTES",
    "DEVICE_CATEGORY",
    "PerfettoRenderer",
    "Selection",
    "StepInterval",
    "StepSummary",
    "TraceSummary",
    "overhead_categories",
    "parse_ranks",
    "parse_steps",
    "session_clocks",
    "step_bounds",
    "step_intervals",
    "summarise_steps",
]

# The Perfetto UI runs its trace processor in WebAssembly inside the browser tab: JSON traces of
# a few hundred MB open in seconds to a minute; past ~1 GB the tab needs many GB of memory and
# past ~2 GB the URL loader fails. Above this size the command warns and suggests a slice.
COMFORTABLE_TRACE_BYTES = 300_000_000

# Spans of this category hold device (accelerator) busy intervals; they get their own track,
# as do the per-step device metrics that goodtrace.integrations.torch records from CUDA events.
DEVICE_CATEGORY = "device"
DEVICE_BUSY_METRIC = "device/busy_s"
DEVICE_IDLE_METRIC = "device/idle_s"
DEVICE_METRICS = (DEVICE_BUSY_METRIC, DEVICE_IDLE_METRIC)


# ------------------------------------------------------------------------------ selection


@dataclasses.dataclass(frozen=True, kw_only=True)
class Selection:
    """Which part of a run to show. ``steps`` is inclusive at both ends (``None`` = open)."""

    steps: tuple[int | None, int | None] | None = None
    ranks: frozenset[int] | None = None
    attempt: int | None = None

    def __post_init__(self) -> None:
        if self.steps is not None:
            first, last = self.steps
            if first is not None and last is not None and last < first:
                raise ValueError(f"step range {first}:{last} is empty (the range is inclusive: A <= B)")
        if self.attempt is not None and self.attempt < 0:
            raise ValueError(f"attempt must be 0 or more, got {self.attempt}")

    def step_in_range(self, step: int) -> bool:
        if self.steps is None:
            return True
        first, last = self.steps
        return (first is None or step >= first) and (last is None or step <= last)

    def sessions(self, run: Run) -> list[Session]:
        return [
            s
            for s in run.sessions
            if (self.attempt is None or s.attempt == self.attempt)
            and (self.ranks is None or s.rank in self.ranks)
        ]


def parse_steps(text: str) -> tuple[int | None, int | None]:
    """``"A:B"`` (inclusive), ``"A:"``, ``":B"`` or a single step ``"A"``."""
    parts = text.split(":")
    try:
        if len(parts) == 1:
            step = int(parts[0])
            return step, step
        if len(parts) == 2:
            first = int(parts[0]) if parts[0].strip() else None
            last = int(parts[1]) if parts[1].strip() else None
        else:
            raise ValueError
    except ValueError:
        raise ValueError(f"bad step range {text!r}: expected A:B (inclusive), A:, :B or A") from None
    if first is not None and last is not None and last < first:
        raise ValueError(f"bad step range {text!r}: it is empty (A:B includes both ends, so A must not be after B)")
    return first, last


def parse_ranks(text: str) -> frozenset[int]:
    """``"0,3,8-15"`` -> {0, 3, 8, ..., 15}."""
    ranks: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            if "-" in part:
                low, high = (int(x) for x in part.split("-", 1))
                if high < low or low < 0:
                    raise ValueError
                ranks.update(range(low, high + 1))
            else:
                value = int(part)
                if value < 0:
                    raise ValueError
                ranks.add(value)
    except ValueError:
        raise ValueError(f"bad rank list {text!r}: expected e.g. 0,3,8-15") from None
    if not ranks:
        raise ValueError(f"bad rank list {text!r}: no rank in it")
    return frozenset(ranks)


def format_ranks(ranks: set[int] | frozenset[int]) -> str:
    """{0, 1, 2, 5, 7, 8} -> ``"0-2,5,7-8"`` (the form :func:`parse_ranks` reads)."""
    parts: list[str] = []
    ordered = sorted(ranks)
    start = 0
    for i, rank in enumerate(ordered):
        if i + 1 == len(ordered) or ordered[i + 1] != rank + 1:
            first = ordered[start]
            parts.append(str(first) if first == rank else f"{first}-{rank}")
            start = i + 1
    return ",".join(parts)


# ------------------------------------------------------------------------------ step intervals


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


StepRange = tuple[int | None, int | None]  # inclusive; None = open (as parse_steps returns)
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


def _in_range(first_step: int, step: int, steps: StepRange | None) -> bool:
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
            chosen = [b for b in bounds if _in_range(b[0], b[1], steps_range)]
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


def session_clocks(run: Run) -> dict[str, Callable[[int], int]]:
    """Per session id, a function mapping its monotonic ns onto aligned wall-clock ns.

    Uses the measured clock offsets (:mod:`goodtrace.clocksync`); falls back to each session's
    own (wall, monotonic) anchor when that module is unavailable.
    """
    try:
        from goodtrace.clocksync import clock_offsets
    except ImportError:  # pragma: no cover - the clock module ships with the package
        return {s.session_id: s.wall_ns for s in run.sessions}
    clocks = clock_offsets(run)
    result: dict[str, Callable[[int], int]] = {}
    for session in run.sessions:
        clock = clocks.get(session.session_id)
        if clock is None:
            result[session.session_id] = session.wall_ns
        elif len(clock.samples) <= 1:  # a constant shift: skip the per-call interpolation
            shift = clock.offset_at(0) + clock.reference_wall_minus_mono_ns
            result[session.session_id] = functools.partial(operator.add, shift)
        else:
            result[session.session_id] = clock.wall_ns
    return result


# ------------------------------------------------------------------------------ the renderer


@dataclasses.dataclass(frozen=True)
class TraceSummary:
    """What was written: sizes and counts, plus a warning when the UI would struggle."""

    path: str
    bytes_written: int
    json_bytes: int
    events: int
    processes: int
    spans: int
    origin_wall_ns: int
    warning: str | None = None


# UTF-8 output: the Perfetto JSON importer does not decode \uXXXX escapes in every field.
_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


_STRINGS: dict[Any, str] = {}


def _string(value: Any) -> str:
    """A name or category as a JSON string, cached (runs repeat a few names millions of times)."""
    cached = _STRINGS.get(value)
    if cached is None:
        if len(_STRINGS) > 100_000:
            _STRINGS.clear()
        cached = _STRINGS[value] = _JSON.encode(str(value))
    return cached


def _us(ns: int) -> str:
    """Nanoseconds as a microsecond JSON number, exactly (Chrome trace ``ts``/``dur`` unit)."""
    if ns >= 0:
        whole, frac = divmod(ns, 1000)
        return f"{whole}.{frac:03d}" if frac else str(whole)
    whole, frac = divmod(-ns, 1000)
    return f"-{whole}.{frac:03d}" if frac else f"-{whole}"


def _ms(ns: int) -> float:
    return round(ns / 1e6, 6)


def _safe(value: Any) -> Any:
    """JSON-safe args: non-finite floats become strings (the trace must stay valid JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_safe(v) for v in value]
    return value


class _Lane:
    """One track: a synthetic thread id with a name and sort order."""

    __slots__ = ("name", "sort", "tid")

    def __init__(self, tid: int, name: str, sort: int) -> None:
        self.tid, self.name, self.sort = tid, name, sort


class PerfettoRenderer:
    """Renders a run (or a :class:`Selection` of it) as Chrome trace-event JSON for Perfetto."""

    def __init__(self, selection: Selection | None = None) -> None:
        self.selection = selection or Selection()

    def index(
        self, run_dir: str | os.PathLike[str], progress: Callable[[str, int, int], None] | None = None
    ) -> RunIndex:
        """Read the run once, keeping per session only what the trace needs before its first
        event (see the module's docstring); pass the result to :meth:`write`."""
        report = None if progress is None else functools.partial(progress, "reading")
        return index_run(run_dir, summarise=summarise_steps(self.selection.steps), progress=report)

    def render(self, run: Run) -> str:
        """The whole trace as one string (small runs and tests; large ones use :meth:`write`)."""
        buffer = io.StringIO()
        self._write_to(run, buffer, step_summaries(run, self.selection.sessions(run), self.selection.steps))
        return buffer.getvalue()

    def write(
        self,
        run: Run | str | os.PathLike[str],
        path: str | os.PathLike[str],
        progress: Callable[[str, int, int], None] | None = None,
    ) -> TraceSummary:
        """Write the trace to ``path``; gzip-compressed when the name ends in ``.gz``. ``run`` is
        a run in memory, a :class:`RunIndex` or a run directory (read one session at a time).
        ``progress(what, done, total)`` is called as the files are read and the ranks written."""
        if not isinstance(run, Run):
            run = self.index(run, progress)
        summaries = step_summaries(run, self.selection.sessions(run), self.selection.steps)
        target = os.fspath(path)
        if target.endswith(".gz"):
            with gzip.open(target, "wt", encoding="utf-8", errors="replace", compresslevel=6) as handle:
                counts = self._write_to(run, handle, summaries, progress)
        else:
            with open(target, "w", encoding="utf-8", errors="replace") as handle:
                counts = self._write_to(run, handle, summaries, progress)
        size = os.path.getsize(target)
        warning = None
        if counts.json_bytes > COMFORTABLE_TRACE_BYTES:
            warning = self._too_big(run, counts.json_bytes, summaries)
        return dataclasses.replace(counts, path=target, bytes_written=size, warning=warning)

    def _too_big(self, run: Run, json_bytes: int, summaries: dict[str, StepSummary]) -> str:
        steps = sorted(
            {step for s in self.selection.sessions(run) for step in summaries[s.session_id].steps
             if self.selection.step_in_range(step)}
        )
        fraction = COMFORTABLE_TRACE_BYTES / json_bytes * 0.8
        advice = []
        if len(steps) > 1:
            keep = max(1, int(len(steps) * fraction))
            advice.append(f"--steps {steps[0]}:{steps[min(keep, len(steps)) - 1]}")
        ranks = sorted({s.rank for s in self.selection.sessions(run)})
        if len(ranks) > 1:
            keep = max(1, int(len(ranks) * fraction))
            advice.append(f"--ranks {ranks[0]}-{ranks[min(keep, len(ranks)) - 1]}")
        suggestion = " or ".join(advice) if advice else "a smaller selection"
        return (
            f"the trace holds {json_bytes / 1e6:.0f} MB of JSON; the Perfetto UI opens up to about "
            f"{COMFORTABLE_TRACE_BYTES / 1e6:.0f} MB comfortably (larger traces need many GB of browser "
            f"memory and may fail to load). Try a slice, e.g. {suggestion}."
        )

    # -------------------------------------------------------------------- event generation

    def _write_to(
        self,
        run: Run,
        out: IO[str],
        summaries: dict[str, StepSummary],
        progress: Callable[[str, int, int], None] | None = None,
    ) -> TraceSummary:
        selection = self.selection
        sessions = selection.sessions(run)
        to_wall = session_clocks(run)
        # Which sessions have intervals in the step range, and where: from the summaries, so
        # that the origin and the process list are known before any session's records are read.
        prepared: list[tuple[Session, tuple[int, int] | None]] = []
        for session in sessions:
            window = None
            if selection.steps is not None:
                window = summaries[session.session_id].window
                if window is None:
                    continue
            prepared.append((session, window))

        def start_of(session: Session, window: tuple[int, int] | None) -> int:
            proc_start = session.header.get(schema.H_PROC_START)
            anchor = proc_start if isinstance(proc_start, int) else int(session.header[schema.F_MONO])
            return to_wall[session.session_id](window[0] if window else anchor)

        origin = min((start_of(s, w) for s, w in prepared), default=0)
        counts = {"events": 0, "spans": 0, "bytes": 0}

        pending: list[str] = []  # written in chunks: one write per event is slow through gzip

        def flush() -> None:
            if pending:
                text = (",\n" if counts["events"] else "") + ",\n".join(pending)
                out.write(text)
                counts["events"] += len(pending)
                counts["bytes"] += len(text)
                pending.clear()

        def emit(text: str) -> None:
            pending.append(text)
            if len(pending) >= 8192:
                flush()

        head = '{"displayTimeUnit":"ms","otherData":' + _JSON.encode(
            {"generator": "goodtrace", "run": os.path.basename(os.path.normpath(run.path)),
             "origin_wall_ns": origin, "clock": "aligned to each attempt's reference rank",
             "steps": "inclusive" if selection.steps else "all"}
        ) + ',"traceEvents":[\n'
        out.write(head)
        counts["bytes"] += len(head)

        by_rank: dict[int, list[tuple[Session, tuple[int, int] | None]]] = {}
        for item in prepared:
            by_rank.setdefault(item[0].rank, []).append(item)
        multiple_attempts = len({s.attempt for s, _ in prepared}) > 1
        next_tid = 1
        written = 0
        for rank in sorted(by_rank):
            items = by_rank[rank]
            pid = rank + 1  # pid 0 is special in trace processors; the rank is in the name
            hosts = list(dict.fromkeys(str(s.header.get(schema.H_HOST, "?")) for s, _ in items))
            emit(_meta("process_name", pid, 0, {"name": f"rank {rank} ({', '.join(hosts)})"}))
            emit(_meta("process_sort_index", pid, 0, {"sort_index": rank}))
            labels = "; ".join(
                f"attempt {s.attempt}: pid {s.header.get(schema.H_PID)} on {s.header.get(schema.H_HOST)}"
                for s, _ in items
            )
            emit(_meta("process_labels", pid, 0, {"labels": labels}))
            lane_sort = 0
            for indexed, window in items:
                # This session's records (for a slice, only those it can use), and no other's.
                session = run.load(indexed, None if window is None else _slice_records(selection, window))
                intervals = step_intervals(session)
                if selection.steps is not None:
                    intervals = [iv for iv in intervals if _interval_selected(iv, selection)]
                suffix = f" (attempt {session.attempt})" if multiple_attempts else ""
                lanes: dict[Any, _Lane] = {}

                def lane(key: Any, name: str, _pid: int = pid, _lanes: dict[Any, _Lane] = lanes) -> _Lane:
                    nonlocal next_tid, lane_sort
                    found = _lanes.get(key)
                    if found is None:
                        found = _lanes[key] = _Lane(next_tid, name, lane_sort)
                        next_tid += 1
                        lane_sort += 1
                        emit(_meta("thread_name", _pid, found.tid, {"name": found.name}))
                        emit(_meta("thread_sort_index", _pid, found.tid, {"sort_index": found.sort}))
                    return found

                self._emit_session(session, intervals, window, pid, lane, suffix,
                                   to_wall[session.session_id], origin, emit, counts)
                del session, intervals
                written += 1
                if progress is not None:
                    progress("writing", written, len(prepared))
        flush()
        out.write("\n]}\n")
        counts["bytes"] += 4
        return TraceSummary(
            path="", bytes_written=counts["bytes"], json_bytes=counts["bytes"], events=counts["events"],
            processes=len(by_rank), spans=counts["spans"], origin_wall_ns=origin,
        )

    def _emit_session(
        self,
        session: Session,
        intervals: list[StepInterval],
        window: tuple[int, int] | None,
        pid: int,
        lane: Callable[[Any, str], _Lane],
        suffix: str,
        to_wall: Callable[[int], int],
        origin: int,
        emit: Callable[[str], None],
        counts: dict[str, int],
    ) -> None:
        selection = self.selection
        main_tid = session.header.get("main_tid")

        def ts(mono: int) -> str:
            return _us(to_wall(mono) - origin)

        def inside(t0: int, t1: int) -> bool:
            return window is None or (t1 > window[0] and t0 < window[1]) or (t0 == t1 and window[0] <= t0 <= window[1])

        def step_ok(record: dict[str, Any], t: int) -> bool:
            step = record.get(schema.F_STEP)
            if selection.steps is None:
                return True
            if isinstance(step, int):
                return selection.step_in_range(step)
            return inside(t, t)

        steps_lane = lane("steps", "steps" + suffix)
        # Step intervals, with their overhead pieces nested under them.
        for iv in intervals:
            label = f"step {iv.step}" if not iv.is_window else f"steps {iv.first_step}-{iv.step}"
            args: dict[str, Any] = {
                "step": iv.step,
                "attempt": session.attempt,
                "step_time_ms": _ms(iv.duration_ns),
                "productive_ms": _ms(iv.productive_ns),
                "overhead_ms": {k: _ms(v) for k, v in sorted(iv.overhead_ns.items())},
                "sync": iv.how,
            }
            if iv.is_window:
                args["first_step"] = iv.first_step
                args["window"] = "steps without their own sync point share this interval"
            emit(_complete(label, "step", pid, steps_lane.tid, ts(iv.t0), _us(iv.t1 - iv.t0), args))
            for a, b, category in iv.regions:
                emit(_complete(category, "overhead", pid, steps_lane.tid, ts(a), _us(b - a), {"step": iv.step}))
        if window is None:
            proc_start = session.header.get(schema.H_PROC_START)
            if isinstance(proc_start, int) and intervals and intervals[0].t0 > proc_start:
                emit(_complete("startup", "startup", pid, steps_lane.tid, ts(proc_start),
                               _us(intervals[0].t0 - proc_start), {"attempt": session.attempt}))
            finish = session.finish
            if finish is not None and intervals and isinstance(finish.get(schema.F_T), int):
                end = int(finish[schema.F_T])
                if end > intervals[-1].t1:
                    emit(_complete("teardown", "teardown", pid, steps_lane.tid, ts(intervals[-1].t1),
                                   _us(end - intervals[-1].t1), {"attempt": session.attempt}))

        spans_by_lane: dict[Any, list[dict[str, Any]]] = {}
        device: dict[str, dict[int, Any]] = {name: {} for name in DEVICE_METRICS}
        for record in session.records:
            kind = record.get(schema.F_KIND)
            if kind == schema.SPAN:
                t0, t1 = int(record[schema.F_T0]), int(record[schema.F_T1])
                if not inside(t0, t1):
                    continue
                category = str(record.get(schema.F_CATEGORY, schema.COMPUTE))
                tid = record.get(schema.F_THREAD)
                key: Any = "device" if category == DEVICE_CATEGORY else ("main" if tid == main_tid else tid)
                spans_by_lane.setdefault(key, []).append(record)
            elif kind == schema.TAG:
                t = int(record[schema.F_T])
                if step_ok(record, t):
                    emit(_instant(str(record.get(schema.F_NAME)), "tag", pid, steps_lane.tid, ts(t),
                                  {"step": record.get(schema.F_STEP)}))
            elif kind == schema.EVENT:
                t = int(record[schema.F_T])
                if step_ok(record, t):
                    args = {"step": record.get(schema.F_STEP)}
                    attrs = record.get(schema.F_ATTRS)
                    if isinstance(attrs, dict):
                        args["attrs"] = _safe(attrs)
                    emit(_instant(str(record.get(schema.F_NAME)), "event", pid,
                                  lane("main", "main thread" + suffix).tid, ts(t), args))
            elif kind == schema.METRIC:
                value, when = record.get(schema.F_VALUE), record.get(schema.F_T)
                if record.get(schema.F_NAME) in DEVICE_METRICS and isinstance(record.get(schema.F_STEP), int):
                    device[str(record.get(schema.F_NAME))][int(record[schema.F_STEP])] = value
                if (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                        and isinstance(when, int) and step_ok(record, when)):
                    emit('{"ph":"C","name":' + _string(record.get(schema.F_NAME)) + f',"pid":{pid},'
                         f'"ts":{ts(when)},"args":{{"value":{_JSON.encode(value)}}}}}')
        # Lifecycle marks: the end of the session (finish or last sign of life).
        if window is None:
            finish = session.finish
            main_lane = lane("main", "main thread" + suffix)
            if finish is not None and isinstance(finish.get(schema.F_T), int):
                completed = finish.get(schema.F_COMPLETED)
                name = "finish" if completed else f"exit ({finish.get(schema.F_REASON)})"
                emit(_instant(name, "lifecycle", pid, main_lane.tid, ts(int(finish[schema.F_T])),
                              {"completed": completed, "attempt": session.attempt}))
            else:
                emit(_instant("last sign of life (no finish record)", "lifecycle", pid, main_lane.tid,
                              ts(session.last_seen_mono), {"attempt": session.attempt}))

        # Device-busy time measured per step (CUDA events, metric device/busy_s): its duration is
        # exact, its position is not recorded; it is drawn ending at the step's sync point.
        for iv in intervals:
            busy = device[DEVICE_BUSY_METRIC].get(iv.step)
            if isinstance(busy, (int, float)) and math.isfinite(busy) and busy > 0:
                idle = device[DEVICE_IDLE_METRIC].get(iv.step)
                spans_by_lane.setdefault("device", []).append({
                    schema.F_NAME: "device busy", schema.F_CATEGORY: DEVICE_CATEGORY,
                    schema.F_T0: max(iv.t0, iv.t1 - round(busy * 1e9)), schema.F_T1: iv.t1,
                    schema.F_STEP: iv.step,
                    schema.F_ATTRS: {"busy_ms": _ms(round(busy * 1e9)),
                                     "idle_before_ms": _ms(round(idle * 1e9)) if isinstance(idle, (int, float)) else None,
                                     "placement": "duration from device events; drawn ending at the sync point"},
                })

        def lane_order(key: Any) -> tuple[int, str]:
            return (0, "") if key == "main" else (2, "") if key == "device" else (1, str(key))

        for key in sorted(spans_by_lane, key=lane_order):
            if key == "main":
                name = "main thread"
            elif key == "device":
                name = "device"
            else:
                name = f"thread {key}"
            base = lane(key, name + suffix)
            overflow: _Lane | None = None
            stack: list[int] = []  # end times of the open slices on the base lane
            for record in sorted(spans_by_lane[key], key=lambda r: (int(r[schema.F_T0]), -int(r[schema.F_T1]))):
                t0, t1 = int(record[schema.F_T0]), int(record[schema.F_T1])
                while stack and stack[-1] <= t0:
                    stack.pop()
                target = base
                if stack and t1 > stack[-1]:
                    # Partial overlap with an open slice (e.g. spans recorded out of order): a
                    # track must nest properly, so it goes to an overflow track instead of being
                    # dropped by the trace processor.
                    if overflow is None:
                        overflow = lane((key, "overlap"), name + " (overlapping spans)" + suffix)
                    target = overflow
                else:
                    stack.append(t1)
                step = record.get(schema.F_STEP)
                error, attrs = record.get(schema.F_ERROR), record.get(schema.F_ATTRS)
                if not error and not isinstance(attrs, dict) and (step is None or type(step) is int):
                    args_json = '{"step":null}' if step is None else f'{{"step":{step}}}'  # the common case
                else:
                    args = {"step": step}
                    if error:
                        args["error"] = error
                    if isinstance(attrs, dict):
                        args["attrs"] = _safe(attrs)
                    args_json = _JSON.encode(args)
                emit(f'{{"ph":"X","name":{_string(record.get(schema.F_NAME))},'
                     f'"cat":{_string(record.get(schema.F_CATEGORY))},"pid":{pid},"tid":{target.tid},'
                     f'"ts":{_us(to_wall(t0) - origin)},"dur":{_us(t1 - t0)},"args":{args_json}}}')
            counts["spans"] += len(spans_by_lane[key])


def _slice_records(selection: Selection, window: tuple[int, int]) -> Callable[[dict[str, Any]], bool]:
    """The records a session's slice can use, so that a stream keeps no others: step and sync
    records (interval bounds), spans that touch the window (the step intervals' overhead split
    inside it depends on no other span), device metrics, and tags, events and metrics of the
    step range or, without a step, inside the window. Emission tests each record again."""
    w0, w1 = window
    in_range = selection.step_in_range
    span, bounds, marks = schema.SPAN, (schema.SYNC, schema.STEP), (schema.TAG, schema.EVENT, schema.METRIC)

    def keep(record: dict[str, Any]) -> bool:
        kind = record.get(schema.F_KIND)
        if kind == span:
            t0, t1 = int(record[schema.F_T0]), int(record[schema.F_T1])
            return (t1 > w0 and t0 < w1) or (t0 == t1 and w0 <= t0 <= w1)
        if kind in bounds:
            return True
        if kind in marks:
            if kind == schema.METRIC and record.get(schema.F_NAME) in DEVICE_METRICS:
                return True
            step, t = record.get(schema.F_STEP), record.get(schema.F_T)
            if isinstance(step, int):
                return in_range(step)
            return not isinstance(t, int) or w0 <= t <= w1
        return False  # finish, heartbeat, clock: a slice draws no lifecycle marks

    return keep


def _interval_selected(iv: StepInterval, selection: Selection) -> bool:
    """An interval is in the step range when any step it covers is."""
    return _in_range(iv.first_step, iv.step, selection.steps)


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> str:
    return f'{{"ph":"M","name":"{name}","pid":{pid},"tid":{tid},"args":{_JSON.encode(args)}}}'


def _complete(name: str, category: str, pid: int, tid: int, ts: str, dur: str, args: dict[str, Any]) -> str:
    return (
        f'{{"ph":"X","name":{_string(name)},"cat":{_string(category)},"pid":{pid},"tid":{tid},'
        f'"ts":{ts},"dur":{dur},"args":{_JSON.encode(args)}}}'
    )


def _instant(name: str, category: str, pid: int, tid: int, ts: str, args: dict[str, Any]) -> str:
    return (
        f'{{"ph":"i","s":"t","name":{_string(name)},"cat":{_string(category)},"pid":{pid},'
        f'"tid":{tid},"ts":{ts},"args":{_JSON.encode(args)}}}'
    )


def iter_events(text: str) -> Iterator[dict[str, Any]]:
    """The events of a rendered trace (for tests and tools)."""
    yield from json.loads(text)["traceEvents"]
