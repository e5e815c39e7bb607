"""Chrome/Perfetto trace JSON of a run (``goodtrace trace``), drawn from the run model.

Contract: ``PerfettoRenderer(selection).write(analysis, run, path)`` writes one trace (``.json``
or ``.json.gz``) in which every rank is a process ``rank N (host)``; its tracks are the step
intervals with their overhead split (exactly the analysis's: :mod:`goodtrace.analysis.intervals`),
each recorded thread, and device time when recorded. Spans are complete events (category and
step in args), tags, events and rollbacks (on the steps track) are instant events, metrics are counters. All ranks share one
time axis: each session's monotonic clock goes through the analysis's one mapping
(``RunAnalysis.to_wall``), shown relative to the earliest start in the selection (its wall
time is in the trace's ``otherData``).

``run`` is the :class:`goodtrace.read.loaded.LoadedRun` the analysis came from: the raw spans,
marks and metrics of the selected sessions are read from its files by DuckDB
(:func:`goodtrace.read.raw.session_record_chunks`), only the part of its clock a slice covers, one batch of
sessions at a time, and their events go straight to the (gzip) file: a session's tags, events
and metrics as they are read, its spans kept as columns per track until its tracks are written
(a window of a long run has millions of records).
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import itertools
import math
import operator
import os
from array import array
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from goodtrace import schema
from goodtrace.analysis import RunAnalysis
from goodtrace.analysis.intervals import iter_session_intervals, slice_clock_range, slice_steps
from goodtrace.analysis.selection import Selection
from goodtrace.read.loaded import LoadedRun, Progress
from goodtrace.read.raw import RawRecord, session_record_chunks
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


class PerfettoRenderer:
    """Renders a run (or a :class:`Selection` of it) as Chrome trace-event JSON for Perfetto."""

    def __init__(self, selection: Selection | None = None) -> None:
        self.selection = selection or Selection()

    def sessions(self, analysis: RunAnalysis) -> list[int]:
        """The job's sessions in the selection, by rank then start (:meth:`Selection.sessions`)."""
        return self.selection.sessions(analysis)

    def render(self, analysis: RunAnalysis, run: LoadedRun) -> str:
        """The whole trace as one string (small runs and tests; large ones use :meth:`write`)."""
        buffer = io.StringIO()
        self._write_to(analysis, run, buffer)
        return buffer.getvalue()

    def write(
        self, analysis: RunAnalysis, run: LoadedRun, path: str | os.PathLike[str], progress: Progress | None = None
    ) -> TraceSummary:
        """Write the trace to ``path``; gzip-compressed when the name ends in ``.gz``."""
        target = os.fspath(path)
        if target.endswith(".gz"):
            with gzip.open(target, "wt", encoding="utf-8", errors="replace", compresslevel=6) as handle:
                counts = self._write_to(analysis, run, handle, progress)
        else:
            with open(target, "w", encoding="utf-8", errors="replace") as handle:
                counts = self._write_to(analysis, run, handle, progress)
        size = os.path.getsize(target)
        warning = self._too_big(analysis, counts.json_bytes) if counts.json_bytes > COMFORTABLE_TRACE_BYTES else None
        return dataclasses.replace(counts, path=target, bytes_written=size, warning=warning)

    def _too_big(self, analysis: RunAnalysis, json_bytes: int) -> str:
        sessions = self.sessions(analysis)
        steps = sorted({
            step for i in sessions for w in iter_session_intervals(analysis, i, self.selection.steps) for step in w.steps
            if self.selection.step_in_range(step)
        })
        fraction = COMFORTABLE_TRACE_BYTES / json_bytes * 0.8
        advice = []
        if len(steps) > 1:
            keep = max(1, int(len(steps) * fraction))
            advice.append(f"--steps {steps[0]}:{steps[min(keep, len(steps)) - 1]}")
        ranks = sorted({analysis.sessions[i].rank for i in sessions})
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

    def _write_to(self, analysis: RunAnalysis, run: LoadedRun, out: IO[str], progress: Progress | None = None) -> TraceSummary:
        selection = self.selection
        clock_ranges: dict[int, tuple[int, int] | None] = {}
        for i in self.sessions(analysis):
            clock_range = slice_clock_range(analysis, i, selection.steps)
            if clock_range is not None:
                clock_ranges[i] = clock_range if selection.steps is not None else None
        to_wall = analysis.to_wall

        def start_of(i: int) -> int:
            clock_range = clock_ranges[i]
            return to_wall(i, clock_range[0] if clock_range is not None else analysis.sessions[i].proc_start)

        origin = min((start_of(i) for i in clock_ranges), default=0)
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
            {"generator": "goodtrace", "run": os.path.basename(os.path.normpath(analysis.path)),
             "origin_wall_ns": origin, "clock": "aligned to each attempt's reference rank",
             "steps": "inclusive" if selection.steps else "all"}
        ) + ',"traceEvents":[\n'
        out.write(head)
        counts["bytes"] += len(head)
        by_rank: dict[int, list[int]] = {}
        for i in clock_ranges:  # in the selection's order: by rank, then start
            by_rank.setdefault(analysis.sessions[i].rank, []).append(i)
        multiple_attempts = len({analysis.attempt_of.get(i) for i in clock_ranges}) > 1
        lanes_of: dict[int, tuple[int, dict[Any, Lane]]] = {}
        next_tid = 1
        for rank, items in by_rank.items():
            pid = rank + 1  # pid 0 is special in trace processors; the rank is in the name
            hosts = list(dict.fromkeys(analysis.sessions[i].host for i in items))
            emit(meta("process_name", pid, 0, {"name": f"rank {rank} ({', '.join(hosts)})"}))
            emit(meta("process_sort_index", pid, 0, {"sort_index": rank}))
            labels = "; ".join(
                f"attempt {analysis.attempt_of.get(i)}: pid {analysis.sessions[i].pid} on {analysis.sessions[i].host}"
                for i in items
            )
            emit(meta("process_labels", pid, 0, {"labels": labels}))
        sort_of: dict[int, int] = {}

        def lane(i: int, key: Any, name: str) -> Lane:
            nonlocal next_tid
            pid = analysis.sessions[i].rank + 1
            _, lanes = lanes_of.setdefault(i, (pid, {}))
            found = lanes.get(key)
            if found is None:
                sort = sort_of.get(pid, 0)
                sort_of[pid] = sort + 1
                suffix = f" (attempt {analysis.attempt_of.get(i)})" if multiple_attempts else ""
                found = lanes[key] = Lane(next_tid, name + suffix, sort)
                next_tid += 1
                emit(meta("thread_name", pid, found.tid, {"name": found.name}))
                emit(meta("thread_sort_index", pid, found.tid, {"sort_index": found.sort}))
            return found

        drawn = {i: found for i in clock_ranges if (found := slice_steps(analysis, i, selection.steps)) is not None}
        chunks = session_record_chunks(run, clock_ranges, steps=selection.steps, drawn_steps=drawn)
        for written, (i, parts) in enumerate(itertools.groupby(chunks, key=operator.itemgetter(0)), 1):
            records = itertools.chain.from_iterable(chunk for _, chunk in parts)  # a part of the session at a time
            self._emit_session(analysis, i, clock_ranges[i], records, lane, origin, emit, counts)
            if progress is not None:
                progress("writing", written, len(clock_ranges))
        flush()
        out.write("\n]}\n")
        counts["bytes"] += 4
        return TraceSummary(
            path="", bytes_written=counts["bytes"], json_bytes=counts["bytes"], events=counts["events"],
            processes=len(by_rank), spans=counts["spans"], origin_wall_ns=origin,
        )

    def _emit_session(
        self,
        analysis: RunAnalysis,
        i: int,
        clock_range: tuple[int, int] | None,
        records: Iterable[RawRecord],
        lane: Callable[[int, Any, str], Lane],
        origin: int,
        emit: Callable[[str], None],
        counts: dict[str, int],
    ) -> None:
        selection = self.selection
        info = analysis.sessions[i]
        cut = analysis.cuts[i]
        attempt = analysis.attempt_of.get(i)
        pid = info.rank + 1
        wall = analysis.wall_of(i)  # most sessions' mapping is one shift: no call chain a time

        def ts(mono: int) -> str:
            return us(wall(mono) - origin)

        steps_lane = lane(i, "steps", "steps")
        # each interval written as it is made (a window of a long run has hundreds of
        # thousands); their steps and bounds kept for the device busy time drawn below
        bounds = array("q")  # step, start, end of each
        for iv in iter_session_intervals(analysis, i, selection.steps):
            bounds.extend((iv.step, iv.start, iv.end))
            label = f"step {iv.step}" if not iv.is_shared else f"steps {iv.first_step}-{iv.step}"
            args: dict[str, Any] = {
                "step": iv.step,
                "seq": iv.seqs[-1],
                "attempt": attempt,
                "step_time_ms": ms(iv.duration_ns),
                "productive_ms": ms(iv.productive_ns),
                "overhead_ms": {k: ms(v) for k, v in sorted(iv.overhead_ns.items())},
                "sync": iv.how,
            }
            if iv.is_shared:
                args["first_step"] = iv.first_step
                args["interval"] = "steps without their own sync point share this interval"
            emit(complete(label, "step", pid, steps_lane.tid, ts(iv.start), us(iv.end - iv.start), args))
            for p in iv.pieces:
                if p.label != "productive":
                    emit(complete(p.label, "overhead", pid, steps_lane.tid, ts(p.start), us(p.length), {"step": iv.step}))
        if clock_range is None:
            for p in cut.startup_pieces():
                emit(complete(p.part if p.part != "other" else "startup", "startup", pid, steps_lane.tid, ts(p.start),
                              us(p.length), {"attempt": attempt}))
            for p in cut.tail_pieces():
                emit(complete(p.label, "tail", pid, steps_lane.tid, ts(p.start), us(p.length), {"attempt": attempt}))
            ending = analysis.attempts_by_index().get(attempt or 0)
            session_ending = ending.session_endings.get(i) if ending is not None else None
            text = session_ending.text if session_ending is not None else "end"
            end_t = info.finish_t if info.has_finish and info.finish_t is not None else info.last_seen
            emit(instant(text, "lifecycle", pid, lane(i, "main", "main thread").tid, ts(end_t),
                         {"attempt": attempt, "finish_record": info.has_finish}))
        for r in cut.rewinds:  # rollbacks inside the attempt (analysis.rewinds)
            if clock_range is None or clock_range[0] <= r.t <= clock_range[1]:
                emit(instant(f"rollback to step {r.to_step}", "rollback", pid, steps_lane.tid, ts(r.t), {
                    "attempt": attempt, "from_step": r.from_step, "to_step": r.to_step, "resume_step": r.resume_step,
                    "redone": r.redone, "skipped": r.skipped, "explicit": r.explicit}))
        spans_by_lane: dict[Any, _LaneSpans] = {}
        device: dict[str, dict[int, float]] = {}
        main_tid = info.main_tid
        for record in records:
            kind = record.kind
            if kind == schema.SPAN:
                if record.t0 is None or record.t1 is None:
                    continue
                category = record.category or schema.COMPUTE
                key: Any = "device" if category == schema.DEVICE_CATEGORY else ("main" if record.tid == main_tid else record.tid)
                if key not in spans_by_lane:
                    spans_by_lane[key] = _LaneSpans()
                spans_by_lane[key].add(record)
            elif record.t is None:
                continue
            elif kind == schema.TAG:
                emit(instant(str(record.name), "tag", pid, steps_lane.tid, ts(record.t), {"step": record.step}))
            elif kind == schema.EVENT:
                args = {"step": record.step}
                if record.attrs is not None:
                    args["attrs"] = safe(record.attrs)
                emit(instant(str(record.name), "event", pid, lane(i, "main", "main thread").tid, ts(record.t), args))
            elif kind == schema.METRIC:
                value = record.value
                if record.name in schema.DEVICE_METRICS and record.step is not None and value is not None:
                    device.setdefault(str(record.name), {})[record.step] = value
                if (value is not None and math.isfinite(value)
                        and (selection.steps is None or record.step is None or selection.step_in_range(record.step))):
                    emit('{"ph":"C","name":' + string(record.name) + f',"pid":{pid},'
                         f'"ts":{ts(record.t)},"args":{{"value":{JSON.encode(value)}}}}}')
        # Device-busy time measured per step (CUDA events, metric device/busy_s): its duration is
        # exact, its position is not recorded; it is drawn ending at the step's sync point.
        busy_by_step = device.get(schema.DEVICE_BUSY_METRIC, {})
        idle_by_step = device.get(schema.DEVICE_IDLE_METRIC, {})
        for k in range(0, len(bounds) if busy_by_step else 0, 3):
            at_step, start, end = bounds[k], bounds[k + 1], bounds[k + 2]
            busy = busy_by_step.get(at_step)
            if busy is not None and math.isfinite(busy) and busy > 0:
                idle = idle_by_step.get(at_step)
                if "device" not in spans_by_lane:
                    spans_by_lane["device"] = _LaneSpans()
                spans_by_lane["device"].add(RawRecord(
                    schema.SPAN, "device busy", schema.DEVICE_CATEGORY, max(start, end - round(busy * 1e9)),
                    end, None, at_step, None, False, None,
                    {"busy_ms": ms(round(busy * 1e9)),
                     "idle_before_ms": ms(round(idle * 1e9)) if idle is not None and math.isfinite(idle) else None,
                     "placement": "duration from device events; drawn ending at the sync point"},
                ))

        def lane_order(key: Any) -> tuple[int, str]:
            return (0, "") if key == "main" else (2, "") if key == "device" else (1, str(key))

        for key in sorted(spans_by_lane, key=lane_order):
            name = "main thread" if key == "main" else "device" if key == "device" else f"thread {key}"
            base = lane(i, key, name)
            overflow: Lane | None = None
            stack: list[int] = []  # end times of the open slices on the base lane
            for record in spans_by_lane[key].in_order():
                t0, t1 = int(record.t0 or 0), int(record.t1 or 0)
                while stack and stack[-1] <= t0:
                    stack.pop()
                target = base
                if stack and t1 > stack[-1]:
                    # Partial overlap with an open slice (e.g. spans recorded out of order): a
                    # track must nest properly, so it goes to an overflow track instead of being
                    # dropped by the trace processor.
                    if overflow is None:
                        overflow = lane(i, (key, "overlap"), name + " (overlapping spans)")
                    target = overflow
                else:
                    stack.append(t1)
                step = record.step
                if not record.error and record.attrs is None:
                    args_json = '{"step":null}' if step is None else f'{{"step":{int(step)}}}'  # the common case
                else:
                    span_args: dict[str, Any] = {"step": step}
                    if record.error:
                        span_args["error"] = True
                    if record.attrs is not None:
                        span_args["attrs"] = safe(record.attrs)
                    args_json = JSON.encode(span_args)
                emit(f'{{"ph":"X","name":{string(record.name)},"cat":{string(record.category)},"pid":{pid},'
                     f'"tid":{target.tid},"ts":{ts(t0)},"dur":{us(t1 - t0)},"args":{args_json}}}')
            counts["spans"] += len(spans_by_lane[key])


class _LaneSpans:
    """The spans of one track of a session, as columns (about 33 bytes a span where a record
    object took about 250: a window of a long run has millions), walked in the order the track
    is written: by start, the longer first on a tie, else as added (a stable sort). The reader
    hands spans over in that order (:func:`~goodtrace.read.raw.session_record_chunks`: by time,
    then end descending), so they are walked as added unless one came out of it (the device
    busy spans, drawn at the end of the session's steps), and then sorted once."""

    def __init__(self) -> None:
        self._t0, self._t1, self._step = array("q"), array("q"), array("q")
        self._has_step = bytearray()
        self._name, self._category = array("i"), array("i")
        self._texts: list[str | None] = []  # names and categories, by code
        self._code: dict[str | None, int] = {}
        self._extra: dict[int, tuple[bool, dict[str, Any] | None]] = {}  # row -> (error, attrs), where either is set
        self._last: tuple[int, int] | None = None
        self._in_order = True

    def __len__(self) -> int:
        return len(self._t0)

    def _code_of(self, text: str | None) -> int:
        code = self._code.get(text)
        if code is None:
            code = self._code[text] = len(self._texts)
            self._texts.append(text)
        return code

    def add(self, record: RawRecord) -> None:
        t0, t1 = record.t0 or 0, record.t1 or 0
        key = (t0, -t1)
        if self._last is not None and key < self._last:
            self._in_order = False
        self._last = key
        if record.error or record.attrs is not None:
            self._extra[len(self._t0)] = (record.error, record.attrs)
        self._t0.append(t0)
        self._t1.append(t1)
        self._step.append(record.step if record.step is not None else 0)
        self._has_step.append(record.step is not None)
        self._name.append(self._code_of(record.name))
        self._category.append(self._code_of(record.category))

    def in_order(self) -> Iterator[RawRecord]:
        """Each span, by (start, -end), stable."""
        rows: Iterable[int] = range(len(self._t0))
        if not self._in_order:
            import numpy as np

            t0, t1 = np.frombuffer(self._t0, dtype=np.int64), np.frombuffer(self._t1, dtype=np.int64)
            rows = np.lexsort((~t1, t0)).tolist()  # ~t1: t1 descending, never overflowing; stable, as sorted()
        texts, extra = self._texts, self._extra
        for row in rows:
            error, attrs = extra.get(row, (False, None))
            yield RawRecord(schema.SPAN, texts[self._name[row]], texts[self._category[row]], self._t0[row],
                            self._t1[row], None, self._step[row] if self._has_step[row] else None, None, error, None,
                            attrs)
