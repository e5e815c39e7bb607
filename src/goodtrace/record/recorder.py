"""One rank's recorder: steps with lagged completion, tags, events, metrics, and its lifecycle.

Device values passed to ``complete_on`` / ``metric`` are kept as handles and observed only when
that is free: when a later step ends (the lag), when a blocking span starts, or at ``finish()``.
Records are tuples appended to the recorder's deque; the writer thread turns them into JSON
lines. Spans themselves are in :mod:`goodtrace.record.spans` (the hot path). Nothing here
raises into the training loop except a user's own exception inside a span, which is recorded
and re-raised.
"""

from __future__ import annotations

import collections
import gc
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from goodtrace import schema
from goodtrace.record import spans
from goodtrace.record.arguments import MAX_NAME_CHARS, name_text, reduction, step_number, timeout_seconds
from goodtrace.record.config import Config
from goodtrace.record.errors import describe, warn
from goodtrace.record.process import ProcessIdentity, process_start_mono_ns, submit_wall_ns
from goodtrace.record.spans import NOOP_SPAN, span_key
from goodtrace.record.storage import Storage, open_storage
from goodtrace.record.values import ValueAdapter, adapter_for, finite_or_none
from goodtrace.record.writer import Writer

_get_ident = threading.get_ident


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("goodtrace")
    except Exception:
        return "unknown"


class StepContext:
    """``with gt.step(n) as s:`` sets the ambient step; ``s.complete_on(loss)`` marks its end."""

    __slots__ = ("_rec", "number", "t0")

    def __init__(self, rec: Recorder, number: int) -> None:
        self._rec = rec
        self.number = number
        self.t0 = 0

    def __enter__(self) -> StepContext:
        self._rec.begin_step(self)
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._rec.end_step(self)

    def complete_on(self, value: object) -> None:
        """The step is complete when ``value`` is (observed lazily, with the lag)."""
        self._rec.complete_on(value, step=self.number)


class _Pending:
    __slots__ = ("adapter", "handle", "metric", "ordinal", "step")

    def __init__(
        self, step: int | None, ordinal: int, adapter: ValueAdapter, handle: Any,
        metric: tuple[str, str, int] | None,
    ) -> None:
        self.step = step
        self.ordinal = ordinal  # how many steps had ended when its step began
        self.adapter = adapter
        self.handle = handle
        self.metric = metric  # (name, reduce, t) for metric values, None for completions


class Recorder:
    """One rank's recorder. Created by ``goodtrace.init``; not meant to be built directly."""

    enabled = True

    def __init__(
        self,
        run_dir: str,
        config: Config,
        identity: ProcessIdentity,
        *,
        clock: Callable[[], int] = time.perf_counter_ns,
        storage: Storage | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.config = config
        self.identity = identity
        self.clock = clock
        self.buffer: collections.deque[tuple[Any, ...]] = collections.deque()
        self.session = f"{time.time_ns():020d}-{identity.pid}-{uuid.uuid4().hex[:8]}"
        self._pid = identity.pid
        self._active_step: StepContext | None = None
        self._steps_ended = 0
        self._pending: collections.deque[_Pending] = collections.deque()
        self._pending_lock = threading.RLock()
        self._overhead = config.all_overhead_categories
        self.overhead_categories = self._overhead
        self._blocking = config.all_blocking_categories
        self._warned: set[str] = set()
        self.finished = False
        self._gc_t0 = 0
        self._gc_key = span_key("gc", schema.GC)
        self.observations = 0
        # Listeners (live aggregation, sinks): called in the training thread right after the
        # record is made; they must be cheap and must not raise (exceptions are swallowed).
        self.metric_listeners: list[Callable[[str, int | None, float | None, str], None]] = []
        self.sync_listeners: list[Callable[[int | None, int, str], None]] = []
        self.step_listeners: list[Callable[[int, int, int], None]] = []  # (step, t0, t1) at step end
        self.step_begin_listeners: list[Callable[[int, int], None]] = []  # (step, t0)
        self.finish_listeners: list[Callable[[bool | None, str], None]] = []  # before finishing
        self.overhead_span_listeners: list[Callable[[str, int, int], None]] = []  # (category, t0, t1)
        # Live lines (goodtrace.record.live) go to these, on the ranks that compute them (sinks).
        self.line_listeners: list[Callable[[Any], None]] = []
        # Called after the files are closed (sinks read the finished run back for a summary).
        self.after_finish_listeners: list[Callable[[bool | None, str], None]] = []
        self.live_aggregator: Any = None  # the LiveAggregator attached to this recorder, if any
        self.sink_hub: Any = None  # goodtrace.record.sinks.SinkHub, when gt.init was given sinks
        self.clock_offset_ns: int | None = None  # reference (rank 0) clock - this clock, when measured
        real_clock = clock is time.perf_counter_ns
        proc_start, proc_source = process_start_mono_ns() if real_clock else (clock(), "clock")
        self._header_static: dict[str, Any] = {
            schema.F_KIND: schema.HEADER,
            schema.H_SCHEMA: schema.SCHEMA_VERSION,
            schema.H_VERSION: _version(),
            schema.H_SESSION: self.session,
            schema.H_RANK: identity.rank,
            schema.H_WORLD: identity.world_size,
            schema.H_LOCAL_RANK: identity.local_rank,
            schema.H_HOST: identity.host,
            schema.H_PID: identity.pid,
            schema.H_RESTART: identity.restart,
            schema.H_PROC_START: proc_start,
            schema.H_PROC_START_SOURCE: proc_source,
            schema.H_INIT: clock(),
            schema.H_SUBMIT_WALL: submit_wall_ns(),
            "main_tid": _get_ident(),
            "rank_source": identity.rank_source,
            "overhead_categories": sorted(self._overhead),
            schema.H_CONFIG: config.to_record(),
        }
        self.storage = storage if storage is not None else open_storage(run_dir)
        self.writer = Writer(
            self.storage, self.buffer, config, self._header, f"rank-{identity.rank:05d}/{self.session}", clock
        )

    def activate(self) -> None:
        """Make this the process's recorder: point the hot path at its buffer and clock."""
        spans.bind(self)
        self.writer.start()
        if self.config.record_gc:
            gc.callbacks.append(self._on_gc)

    @property
    def current_step(self) -> int | None:
        return spans.current_step(self)

    # ------------------------------------------------------------------ header
    def _header(self, segment: int, wall: int, mono: int) -> dict[str, Any]:
        header = dict(self._header_static)
        header[schema.H_SEGMENT] = segment
        header[schema.F_WALL] = wall
        header[schema.F_MONO] = mono
        return header

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned and len(self._warned) < 1000:
            self._warned.add(key)
            warn(message, stacklevel=4)

    # ------------------------------------------------------------------ spans
    def resolve_category(self, name: str | None, category: object) -> tuple[str, bool]:
        """(category, blocking) for a span name: argument, config table, default table."""
        if category is None and name is not None:
            category = self.config.categories.get(name)
        if category is None:
            category = schema.category_for_name(name) if name is not None else schema.COMPUTE
        if isinstance(category, str) and type(category) is not str:
            category = str.__str__(category)  # a subclass: its plain text
        if not isinstance(category, str) or not category or len(category) > MAX_NAME_CHARS:
            shown = describe(category, 60)
            self._warn(f"category:{shown}", f"invalid category {shown}; using 'compute'")
            category = schema.COMPUTE
        if category not in schema.BUILTIN_CATEGORIES and category not in self._overhead:
            self._warn(
                f"category:{category}",
                f"category {category!r} is neither built in nor declared in overhead_categories: "
                "it counts as productive time",
            )
        return category, category in self._blocking

    def record_span(
        self, name: str, category: str, t0: int, t1: int, attrs: Mapping[str, Any] | None = None,
        step: int | None = None, thread: int | None = None,
    ) -> None:
        """An automatic span measured elsewhere (compile listeners, gc): never settles."""
        try:
            t0, t1 = int(t0), int(t1)
        except Exception as exc:
            self._warn("record_span", f"span {describe(name)} not recorded: {describe(exc)}")
            return
        self.buffer.append(
            (span_key(name, category), t0, t1, self.current_step if step is None else step,
             _get_ident() if thread is None else thread, attrs, None)
        )
        if self.overhead_span_listeners and category in self._overhead:
            self.notify_overhead_span(category, t0, t1)

    def notify_overhead_span(self, category: str, t0: int, t1: int) -> None:
        if category not in self._overhead:  # a user blocking category that counts as productive
            return
        for listener in self.overhead_span_listeners:
            try:
                listener(category, t0, t1)
            except Exception as exc:
                self._warn(f"listener:{listener!r}", f"an overhead-span listener failed: {exc!r}")

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_t0 = self.clock()
            return
        t1 = self.clock()
        t0 = self._gc_t0
        if t0 and t1 - t0 >= self.config.gc_threshold_s * 1e9:
            self.buffer.append(
                (self._gc_key, t0, t1, spans.current_step(self), _get_ident(),
                 {"generation": info.get("generation"), "collected": info.get("collected")}, None)
            )
            if self.overhead_span_listeners:
                self.notify_overhead_span(schema.GC, t0, t1)

    # ------------------------------------------------------------------ steps
    def step(self, number: int) -> StepContext:
        if type(number) is not int or not -(2**63) <= number < 2**63:
            checked, problem = step_number(number)  # NumPy / torch integers; nothing raises
            if checked is None:
                self._warn("step-type", f"{problem}; using a count")
                checked = self._steps_ended
            number = checked
        return StepContext(self, number)

    def _step_argument(self, step: object) -> int | None:
        """An explicit ``step=`` of metric/tag/complete_on: None (the current step) when invalid."""
        if step is None or (type(step) is int and -(2**63) <= step < 2**63):
            return step
        number, problem = step_number(step)
        if problem is not None:
            self._warn("step-argument", f"{problem}; using the current step")
        return number

    def begin_step(self, ctx: StepContext) -> None:
        if self._active_step is not None:
            self._warn("nested-step", "a step began inside another step; steps do not nest")
        ctx.t0 = self.clock()
        self._active_step = ctx
        spans.set_step(ctx.number)
        for listener in self.step_begin_listeners:
            try:
                listener(ctx.number, ctx.t0)
            except Exception as exc:
                self._warn(f"listener:{listener!r}", f"a step-begin listener failed: {exc!r}")

    def end_step(self, ctx: StepContext) -> None:
        t1 = self.clock()
        self.buffer.append((schema.STEP, ctx.number, ctx.t0, t1))
        if self._active_step is ctx:
            self._active_step = None
        self._steps_ended += 1
        if self._pending:
            try:
                self._settle_lagged(ctx.number)
            except Exception as exc:
                self._warn("settle", f"internal error while observing step values: {exc!r}")
        for listener in self.step_listeners:
            try:
                listener(ctx.number, ctx.t0, t1)
            except Exception as exc:
                self._warn(f"listener:{listener!r}", f"a step listener failed: {exc!r}")

    def complete_on(self, value: object, step: int | None = None) -> None:
        step = self._step_argument(step)
        number = self.current_step if step is None else step
        try:
            adapter = adapter_for(value)
            if adapter.host:
                self._sync(number, self.clock(), schema.SYNC_HOST)
                return
            handle = adapter.prepare(value)
        except Exception as exc:
            self._warn(f"complete_on:{type(value)}", f"complete_on ignored: {describe(exc)}")
            return
        with self._pending_lock:
            self._pending.append(_Pending(number, self._steps_ended, adapter, handle, None))

    def metric(self, name: str, value: object, reduce: str = "mean", step: int | None = None) -> None:
        if type(name) is not str or len(name) > MAX_NAME_CHARS:
            name, problem = name_text(name)
            if problem is not None:
                self._warn("metric-name", f"metric {problem}")
        if type(reduce) is not str or reduce not in schema.REDUCTIONS:
            reduce, problem = reduction(reduce)
            self._warn(f"reduce:{name}", f"metric {describe(name)}: {problem}")
        step = self._step_argument(step)
        number = self.current_step if step is None else step
        t = self.clock()
        try:
            adapter = adapter_for(value)
            if adapter.host:
                self._metric(name, number, finite_or_none(adapter.to_float(value)), reduce, t)
                return
            handle = adapter.prepare(value)
        except Exception as exc:
            self._warn(f"metric:{name}", f"metric {describe(name)} not recorded: {describe(exc)}")
            return
        ordinal = self._steps_ended if self._active_step is not None else self._steps_ended - 1
        with self._pending_lock:
            self._pending.append(_Pending(number, ordinal, adapter, handle, (name, reduce, t)))

    def _sync(self, step: int | None, t: int, how: str) -> None:
        self.buffer.append((schema.SYNC, step, t, how))
        for listener in self.sync_listeners:
            try:
                listener(step, t, how)
            except Exception as exc:
                self._warn(f"listener:{listener!r}", f"a sync listener failed: {exc!r}")

    def _metric(self, name: str, step: int | None, value: float | None, reduce: str, t: int) -> None:
        self.buffer.append((schema.METRIC, name, step, value, reduce, t))
        for listener in self.metric_listeners:
            try:
                listener(name, step, value, reduce)
            except Exception as exc:
                self._warn(f"listener:{listener!r}", f"a metric listener failed: {exc!r}")

    def _settle_lagged(self, ended_step: int) -> None:
        lag = self.config.lag
        ended = self._steps_ended
        with self._pending_lock:
            pending = self._pending
            while pending and ended - pending[0].ordinal > lag:
                self._observe(pending.popleft(), schema.SYNC_LAG)
            # The step that just ended: if the loop already synchronised on its value (it logged
            # the loss inside the step, say), its sync point is now. This probe never waits.
            for entry in list(pending):
                if (entry.ordinal == ended - 1 and entry.metric is None and entry.step == ended_step
                        and entry.adapter.ready(entry.handle) is True):
                    pending.remove(entry)
                    self._sync(entry.step, self.clock(), schema.SYNC_READY)

    def settle(self, how: str = schema.SYNC_BLOCKING) -> None:
        """Observe every pending value now (blocking spans, finish)."""
        if not self._pending:
            return
        try:
            with self._pending_lock:
                while self._pending:
                    self._observe(self._pending.popleft(), how)
        except Exception as exc:
            self._warn("settle", f"internal error while observing step values: {exc!r}")

    def _observe(self, entry: _Pending, how: str) -> None:
        try:
            if entry.metric is not None:
                name, reduce, t = entry.metric
                value = finite_or_none(entry.adapter.to_float(entry.handle))
                self._metric(name, entry.step, value, reduce, t)
                return
            entry.adapter.wait(entry.handle)
            self.observations += 1
            self._sync(entry.step, self.clock(), how)
        except Exception as exc:
            self._warn(f"observe:{type(exc)}", f"could not observe a value of step {entry.step}: {exc!r}")

    # ------------------------------------------------------------------ tags, events
    def tag(self, name: str, step: int | None = None) -> None:
        if type(name) is not str or len(name) > MAX_NAME_CHARS:
            name, problem = name_text(name)
            if problem is not None:
                self._warn("tag-name", f"tag {problem}")
        step = self._step_argument(step)
        self.buffer.append((schema.TAG, self.current_step if step is None else step, name, self.clock()))

    def event(self, name: str, attrs: Mapping[str, Any] | None = None) -> None:
        if type(name) is not str or len(name) > MAX_NAME_CHARS:
            name, problem = name_text(name)
            if problem is not None:
                self._warn("event-name", f"event {problem}")
        if attrs is not None and not isinstance(attrs, Mapping):
            attrs = {"value": attrs}  # attributes are a mapping in the files
        self.buffer.append((schema.EVENT, name, self.clock(), self.current_step, attrs))

    def record_clock_offset(self, offset_ns: int, rtt_ns: int, reference_rank: int = 0) -> None:
        self.buffer.append((schema.CLOCK, offset_ns, rtt_ns, reference_rank, self.clock()))
        self.clock_offset_ns = int(offset_ns)

    # ------------------------------------------------------------------ lifecycle
    def flush(self, timeout: float | None = None) -> bool:
        if self.finished or os.getpid() != self._pid:
            return False
        seconds, problem = timeout_seconds(timeout, self.config.finish_timeout_s)
        if problem is not None:
            self._warn("flush-timeout", f"flush(): {problem}")
        return self.writer.flush(seconds)

    def finish(self, completed: bool | None, reason: str = "finish") -> bool:
        if self.finished or os.getpid() != self._pid:
            return False
        if completed is not None and completed is not True and completed is not False:
            self._warn("finish-completed", f"finish(completed=...) takes True or False, got "
                       f"{describe(completed, 60)}; recorded as stopped early")
            completed = False
        for listener in list(self.finish_listeners):  # integrations close (collectives) first
            try:
                listener(completed, reason)
            except Exception as exc:
                self._warn(f"listener:{listener!r}", f"a finish listener failed: {exc!r}")
        self.settle(schema.SYNC_FINISH)
        if self._active_step is not None:
            self._warn("finish-in-step", "finish() called inside a step")
        self.finished = True
        self.buffer.append((schema.FINISH, completed, self.clock(), reason))
        spans.unbind(self)
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        closed = self.writer.close(self.config.finish_timeout_s)
        for listener in list(self.after_finish_listeners):
            try:
                listener(completed, reason)
            except Exception as exc:
                self._warn(f"listener:{listener!r}", f"an after-finish listener failed: {exc!r}")
        return closed

    def after_fork_in_child(self) -> None:
        """In a forked child: never write into the parent's files, never take its locks."""
        self.finished = True
        self._pid = -1
        self.buffer = collections.deque(maxlen=1)
        self._pending = collections.deque()
        self._pending_lock = threading.RLock()
        spans.disable_after_fork(self, self.buffer)
        try:
            gc.callbacks.remove(self._on_gc)
        except ValueError:
            pass

    @property
    def dropped_records(self) -> int:
        return self.writer.dropped_records



class NoopRecorder:
    """Disabled recording: every method is a no-op; ``span`` returns one shared object."""

    enabled = False
    current_step: int | None = None
    observations = 0
    dropped_records = 0
    session = ""
    run_dir = ""
    finished = False

    def step(self, number: int) -> Any:
        return NOOP_SPAN

    def complete_on(self, value: object, step: int | None = None) -> None:
        return None

    def metric(self, name: str, value: object, reduce: str = "mean", step: int | None = None) -> None:
        return None

    def tag(self, name: str, step: int | None = None) -> None:
        return None

    def event(self, name: str, attrs: Mapping[str, Any] | None = None) -> None:
        return None

    def record_span(self, *args: Any, **kwargs: Any) -> None:
        return None

    def record_clock_offset(self, *args: Any, **kwargs: Any) -> None:
        return None

    def settle(self, how: str = schema.SYNC_BLOCKING) -> None:
        return None

    def flush(self, timeout: float | None = None) -> bool:
        return True

    def finish(self, completed: bool | None, reason: str = "finish") -> bool:
        return True

    def after_fork_in_child(self) -> None:
        return None


NOOP_RECORDER = NoopRecorder()
