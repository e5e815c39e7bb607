"""Chrome/Perfetto trace JSON of a run (DESIGN.md section 6).

Contract: ``PerfettoRenderer(selection).write(run, path)`` writes one trace (``.json`` or
``.json.gz``) in which every rank is a process ``rank N (host)``; its tracks are the step
intervals (T_{k-1}, T_k] with their overhead split, each recorded thread, and device time when
recorded (spans of category ``device``). Spans are complete events (category and step in args),
tags and events are instant events, metrics are counters. All ranks share one time axis: each
session's monotonic clock is mapped through :func:`goodtrace.analysis.clock.session_clocks`
(``reference = local + offset_ns``) and shown relative to the earliest process start of the
selection (its wall time is in the trace's ``otherData``). Step intervals come from
:mod:`goodtrace.analysis.intervals`, the event encoders from :mod:`trace_events`.

Memory: ``write`` takes a :class:`goodtrace.read.sessions.Run` already in memory (small runs,
tests) or, for any size, a run directory or the :class:`goodtrace.read.sessions.RunIndex` of
:meth:`PerfettoRenderer.index`. Then the run is read twice, one session at a time: first every
session's header, clock and finish records and step boundaries (:class:`StepSummary`: the
attempts, the clock alignment, the time origin and the selected window of each session must
be known before the first event), then each session's records, whose events go straight to
the (gzip) file. The output is the same either way.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import io
import math
import os
from collections.abc import Callable
from typing import IO, Any

from goodtrace import schema
from goodtrace.analysis.clock import session_clocks
from goodtrace.analysis.intervals import (
    StepInterval,
    StepSummary,
    in_range,
    step_intervals,
    step_summaries,
    summarise_steps,
)
from goodtrace.analysis.selection import Selection
from goodtrace.read.sessions import Run, RunIndex, Session, index_run
from goodtrace.renderers.trace_events import (
    COMFORTABLE_TRACE_BYTES,
    JSON,
    Lane,
    TraceSummary,
    complete,
    instant,
    meta,
    ms,
    safe,
    string,
    us,
)

__all__ = ["PerfettoRenderer", "Selection", "TraceSummary"]

DEVICE_CATEGORY = schema.DEVICE_CATEGORY
DEVICE_BUSY_METRIC = schema.DEVICE_BUSY_METRIC
DEVICE_IDLE_METRIC = schema.DEVICE_IDLE_METRIC
DEVICE_METRICS = schema.DEVICE_METRICS


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

        head = '{"displayTimeUnit":"ms","otherData":' + JSON.encode(
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
            emit(meta("process_name", pid, 0, {"name": f"rank {rank} ({', '.join(hosts)})"}))
            emit(meta("process_sort_index", pid, 0, {"sort_index": rank}))
            labels = "; ".join(
                f"attempt {s.attempt}: pid {s.header.get(schema.H_PID)} on {s.header.get(schema.H_HOST)}"
                for s, _ in items
            )
            emit(meta("process_labels", pid, 0, {"labels": labels}))
            lane_sort = 0
            for indexed, window in items:
                # This session's records (for a slice, only those it can use), and no other's.
                session = run.load(indexed, None if window is None else _slice_records(selection, window))
                intervals = step_intervals(session)
                if selection.steps is not None:
                    intervals = [iv for iv in intervals if _interval_selected(iv, selection)]
                suffix = f" (attempt {session.attempt})" if multiple_attempts else ""
                lanes: dict[Any, Lane] = {}

                def lane(key: Any, name: str, _pid: int = pid, _lanes: dict[Any, Lane] = lanes) -> Lane:
                    nonlocal next_tid, lane_sort
                    found = _lanes.get(key)
                    if found is None:
                        found = _lanes[key] = Lane(next_tid, name, lane_sort)
                        next_tid += 1
                        lane_sort += 1
                        emit(meta("thread_name", _pid, found.tid, {"name": found.name}))
                        emit(meta("thread_sort_index", _pid, found.tid, {"sort_index": found.sort}))
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
        lane: Callable[[Any, str], Lane],
        suffix: str,
        to_wall: Callable[[int], int],
        origin: int,
        emit: Callable[[str], None],
        counts: dict[str, int],
    ) -> None:
        selection = self.selection
        main_tid = session.header.get("main_tid")

        def ts(mono: int) -> str:
            return us(to_wall(mono) - origin)

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
                "step_time_ms": ms(iv.duration_ns),
                "productive_ms": ms(iv.productive_ns),
                "overhead_ms": {k: ms(v) for k, v in sorted(iv.overhead_ns.items())},
                "sync": iv.how,
            }
            if iv.is_window:
                args["first_step"] = iv.first_step
                args["window"] = "steps without their own sync point share this interval"
            emit(complete(label, "step", pid, steps_lane.tid, ts(iv.t0), us(iv.t1 - iv.t0), args))
            for a, b, category in iv.regions:
                emit(complete(category, "overhead", pid, steps_lane.tid, ts(a), us(b - a), {"step": iv.step}))
        if window is None:
            proc_start = session.header.get(schema.H_PROC_START)
            if isinstance(proc_start, int) and intervals and intervals[0].t0 > proc_start:
                emit(complete("startup", "startup", pid, steps_lane.tid, ts(proc_start),
                               us(intervals[0].t0 - proc_start), {"attempt": session.attempt}))
            finish = session.finish
            if finish is not None and intervals and isinstance(finish.get(schema.F_T), int):
                end = int(finish[schema.F_T])
                if end > intervals[-1].t1:
                    emit(complete("teardown", "teardown", pid, steps_lane.tid, ts(intervals[-1].t1),
                                   us(end - intervals[-1].t1), {"attempt": session.attempt}))

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
                    emit(instant(str(record.get(schema.F_NAME)), "tag", pid, steps_lane.tid, ts(t),
                                  {"step": record.get(schema.F_STEP)}))
            elif kind == schema.EVENT:
                t = int(record[schema.F_T])
                if step_ok(record, t):
                    args = {"step": record.get(schema.F_STEP)}
                    attrs = record.get(schema.F_ATTRS)
                    if isinstance(attrs, dict):
                        args["attrs"] = safe(attrs)
                    emit(instant(str(record.get(schema.F_NAME)), "event", pid,
                                  lane("main", "main thread" + suffix).tid, ts(t), args))
            elif kind == schema.METRIC:
                value, when = record.get(schema.F_VALUE), record.get(schema.F_T)
                if record.get(schema.F_NAME) in DEVICE_METRICS and isinstance(record.get(schema.F_STEP), int):
                    device[str(record.get(schema.F_NAME))][int(record[schema.F_STEP])] = value
                if (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                        and isinstance(when, int) and step_ok(record, when)):
                    emit('{"ph":"C","name":' + string(record.get(schema.F_NAME)) + f',"pid":{pid},'
                         f'"ts":{ts(when)},"args":{{"value":{JSON.encode(value)}}}}}')
        # Lifecycle marks: the end of the session (finish or last sign of life).
        if window is None:
            finish = session.finish
            main_lane = lane("main", "main thread" + suffix)
            if finish is not None and isinstance(finish.get(schema.F_T), int):
                completed = finish.get(schema.F_COMPLETED)
                name = "finish" if completed else f"exit ({finish.get(schema.F_REASON)})"
                emit(instant(name, "lifecycle", pid, main_lane.tid, ts(int(finish[schema.F_T])),
                              {"completed": completed, "attempt": session.attempt}))
            else:
                emit(instant("last sign of life (no finish record)", "lifecycle", pid, main_lane.tid,
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
                    schema.F_ATTRS: {"busy_ms": ms(round(busy * 1e9)),
                                     "idle_before_ms": ms(round(idle * 1e9)) if isinstance(idle, (int, float)) else None,
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
            overflow: Lane | None = None
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
                        args["attrs"] = safe(attrs)
                    args_json = JSON.encode(args)
                emit(f'{{"ph":"X","name":{string(record.get(schema.F_NAME))},'
                     f'"cat":{string(record.get(schema.F_CATEGORY))},"pid":{pid},"tid":{target.tid},'
                     f'"ts":{us(to_wall(t0) - origin)},"dur":{us(t1 - t0)},"args":{args_json}}}')
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
    return in_range(iv.first_step, iv.step, selection.steps)
