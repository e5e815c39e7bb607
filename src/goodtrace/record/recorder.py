"""One rank's recorder: step executions and their sync points, tags, events, metrics, and its
lifecycle.

Device values passed to ``complete_on`` / ``metric`` are kept as handles. A step's sync point
is when its completion value became ready: the readiness thread
(:mod:`goodtrace.record.values.readiness`) tests pending values without waiting and dates them; the
training thread still observes (waits for) them when that is free, when a later step ends (the
lag), when a blocking span starts, or at ``finish()``, and the earlier of the two dates the
step, once. Each execution of a step (``seq``) has its own sync point. Records are tuples
appended to the recorder's buffer; the writer thread turns them into JSON lines. Spans
themselves are in :mod:`goodtrace.record.spans` (the hot path). Nothing here raises into the
training loop except a user's own exception inside a span, which is recorded and re-raised.
"""

from __future__ import annotations

import collections
import gc
import itertools
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from goodtrace import schema
from goodtrace.record import spans
from goodtrace.record.arguments import (
    MAX_METRIC_NAMES,
    MAX_NAME_CHARS,
    name_text,
    reduction,
    rollback_to_step,
    step_number,
    timeout_seconds,
)
from goodtrace.record.config import Config
from goodtrace.record.errors import describe, warn
from goodtrace.record.io.choice import open_writer
from goodtrace.record.io.compactor import Compactor, start_compactor
from goodtrace.record.io.encoding import RecordBuffer
from goodtrace.record.io.storage import Storage, open_storage
from goodtrace.record.process import ProcessIdentity, process_start_mono_ns, submit_wall_ns
from goodtrace.record.spans import span_key
from goodtrace.record.step_context import StepContext
from goodtrace.record.sync_points import _ARRIVED, SyncPoints
from goodtrace.record.values.adapters import (
    COMPLETE,
    HostTimed,
    adapter_for,
    finite_or_none,
    join_completions,
)
from goodtrace.record.values.readiness import Pending, PendingMetric, ReadinessThread

_get_ident = threading.get_ident

__all__ = ["Recorder", "StepContext"]


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("goodtrace")
    except Exception:
        return "unknown"


def exception_in_flight() -> str | None:
    """The qualified type of the exception this thread is handling (``sys.exc_info()``: in an
    ``except`` or ``finally`` block it propagates through), else None. ``SystemExit`` with
    status 0 (``sys.exit()``, ``sys.exit(0)``) is a normal end, not a crash."""
    kind, value, _ = sys.exc_info()
    if kind is None or (isinstance(value, SystemExit) and value.code in (None, 0)):
        return None
    return f"{kind.__module__}.{kind.__qualname__}"


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
        self.session = f"{time.time_ns():020d}-{identity.pid}-{uuid.uuid4().hex[:8]}"
        self._pid = identity.pid
        self.main_thread = _get_ident()  # the training thread (init's): the one that settles and cuts the timeline
        self._active_step: StepContext | None = None
        self._last_step: StepContext | None = None  # the execution entered last
        self._steps_ended = 0
        self._next_seq = itertools.count().__next__  # executions in entry order: 0, 1, 2, ...
        # Dating step executions and reading metric values: a part of its own (sync_points.py).
        self.sync = SyncPoints(self)
        # A device barrier of the framework in use (set by the torch/JAX integrations): waits
        # for everything dispatched so far. Without one, an earlier completion value's is used.
        self.device_barrier: Callable[[], None] | None = None
        self.readiness: ReadinessThread | None = None
        if config.poll_interval_s > 0:
            self.readiness = ReadinessThread(clock, config.poll_interval_s, self.sync.on_ready)
        self._overhead = config.all_overhead_categories
        self.overhead_categories = self._overhead
        self._blocking = config.all_blocking_categories
        self._warned: set[str] = set()
        self._metric_names: set[str] = set()  # at most MAX_METRIC_NAMES
        self.refused_metric_names = 0  # metric values not recorded because their name was past the cap
        self.finished = False
        self.finishing_thread: int | None = None  # the thread running finish(), once it started
        self._finish_done = threading.Event()
        self.deferred_signal: int | None = None  # delivered again when the finish in progress ends
        self._gc_t0 = 0
        self._gc_key = span_key("gc", schema.GC)
        # Listeners (live aggregation, sinks): called in the training thread right after the
        # record is made; they must be cheap and must not raise (exceptions are swallowed).
        self.metric_listeners: list[Callable[[str, int | None, float | None, str], None]] = []
        self.sync_listeners: list[Callable[[int | None, int, str], None]] = []
        self.step_listeners: list[Callable[[int, int, int], None]] = []  # (step, t0, t1) at step end
        self.step_begin_listeners: list[Callable[[int, int], None]] = []  # (step, t0)
        self.finish_listeners: list[Callable[[bool | None, str], None]] = []  # before finishing
        self.overhead_span_listeners: list[Callable[[str, int, int], None]] = []  # (category, t0, t1)
        self.blocking_span_listeners: list[Callable[[str, int], None]] = []  # (category, t0) at its start
        self.rollback_listeners: list[Callable[[int], None]] = []  # (to_step) of gt.event("rollback")
        # Live lines (goodtrace.record.live.aggregator) go to these, on the ranks that compute them (sinks).
        self.line_listeners: list[Callable[[Any], None]] = []
        # Called after the files are closed (sinks read the finished run back for a summary).
        self.after_finish_listeners: list[Callable[[bool | None, str], None]] = []
        self.live_aggregator: Any = None  # the LiveAggregator attached to this recorder, if any
        self.sink_hub: Any = None  # goodtrace.record.live.sink_hub.SinkHub, when gt.init was given sinks
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
            schema.H_MAIN_TID: self.main_thread,
            schema.H_RANK_SOURCE: identity.rank_source,
            schema.H_OVERHEAD_CATEGORIES: sorted(self._overhead),
            schema.H_CONFIG: config.to_record(),
        }
        self.storage = storage if storage is not None else open_storage(run_dir)
        # The buffer (bounded on every append) and the writer that empties it: native or Python.
        self.buffer, self.writer = open_writer(
            self.storage, config, self._header, f"rank-{identity.rank:05d}/{self.session}", clock
        )
        self.compactor: Compactor | None = None  # the rank's own compactor (off by default)
        if config.compact_interval_s > 0:
            self.compactor = start_compactor(run_dir, f"rank-{identity.rank:05d}", self.session,
                                             config.compact_interval_s, lambda text: self._warn("compactor", text))

    def activate(self) -> None:
        """Make this the process's recorder: point the hot path at its buffer and clock."""
        spans.bind(self)
        self.writer.start()
        if self.readiness is not None:
            self.readiness.start()
        if self.config.record_gc:
            gc.callbacks.append(self._on_gc)

    def settle(self, how: str = schema.SYNC_BLOCKING) -> None:
        """Observe every pending value now (blocking spans, finish): see :meth:`SyncPoints.settle`."""
        self.sync.settle(how)

    @property
    def observations(self) -> int:
        """Values the training thread observed (waited for) before the readiness thread dated them."""
        return self.sync.observations

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
        if category not in self._overhead and category != schema.DATA:  # a user blocking category that counts
            return  # as productive (data spans do go on: the live goodput's data rule)
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
        ctx.seq = self._next_seq()
        self._active_step = self._last_step = ctx
        spans.set_step(ctx.number)
        for listener in self.step_begin_listeners:
            try:
                listener(ctx.number, ctx.t0)
            except Exception as exc:
                self._warn(f"listener:{listener!r}", f"a step-begin listener failed: {exc!r}")

    def end_step(self, ctx: StepContext) -> None:
        t1 = self.clock()
        self.buffer.append((schema.STEP, ctx.number, ctx.t0, t1, ctx.seq))
        if self._active_step is ctx:
            self._active_step = None
        self._steps_ended += 1
        if ctx.barrier:
            self.sync.end_after_blocking_span(ctx)
        if self.sync.pending or self.sync.metrics:  # (a completion stays pending until its lag passes:
            try:  # sync points the readiness thread wrote reach the sync listeners here)
                self.sync.settle_lagged(ctx)
            except Exception as exc:
                self._warn("settle", f"internal error while observing step values: {exc!r}")
        for listener in self.step_listeners:
            try:
                listener(ctx.number, ctx.t0, t1)
            except Exception as exc:
                self._warn(f"listener:{listener!r}", f"a step listener failed: {exc!r}")

    def _execution(self, step: int | None) -> StepContext | None:
        """The execution a value of ``step`` (None: the current one) belongs to: the active
        one, else the last one entered, when its number matches."""
        ctx = self._active_step or self._last_step
        if ctx is not None and (step is None or step == ctx.number):
            return ctx
        return None

    def complete_on(self, value: object, step: int | None = None) -> None:
        step = self._step_argument(step)
        ctx = self._execution(step)
        self.complete_execution(ctx, self.current_step if step is None else step, value)

    def complete_execution(self, ctx: StepContext | None, number: int | None, value: object) -> None:
        """``value`` completes execution ``ctx`` (of step ``number``): its sync point is when
        the value became ready. Exactly one sync point per execution: values passed after it
        was written add nothing; a second value before that joins the first."""
        try:
            adapter = adapter_for(value)
            self.sync.uses_completions = True
            state = None if ctx is None else ctx.sync
            if state is True or (isinstance(state, Pending) and not state.claim):
                return  # its sync point is already written
            if adapter.host:
                if state is None:  # a device value already pending decides when it completes
                    if ctx is not None:
                        ctx.sync = True
                    self.sync.sync_point(number, None if ctx is None else ctx.seq, self.clock(), schema.SYNC_HOST)
                return
            handle = adapter.prepare(value)
        except Exception as exc:
            self._warn(f"complete_on:{type(value)}", f"complete_on ignored: {describe(exc)}")
            return
        if type(handle) is HostTimed:  # no readiness test: no sync point, the step is host-timed
            self._warn(f"host-timed:{handle.what}", f"goodtrace cannot tell when {handle.what} are complete "
                       "without waiting for the device: the steps completed on them are host-timed (closed at "
                       "their host exit, which under asynchronous execution measures dispatch)")
            return
        watch = handle is not COMPLETE
        if not watch:  # complete on arrival (a CPU tensor): dated when its step ends
            adapter, handle = _ARRIVED, None
        if state is not None:  # a second value of this step: complete when both are
            if isinstance(state, Pending):
                state.value = join_completions(state.value, (adapter, handle))
            return
        pair = (adapter, handle)
        if watch:
            self.sync.last_value = pair  # its type's barrier serves later blocking spans
            if ctx is not None and ctx.barrier and self.sync.complete_after_blocking_span(ctx, adapter, handle):
                return
        if ctx is None:
            entry = Pending(None, number, None, self._steps_ended, pair)
        else:
            entry = ctx.sync = Pending(ctx, number, ctx.seq, ctx.seq, pair)
        self.sync.pending.append(entry)
        if watch:
            readiness = self.readiness
            if readiness is not None:  # ReadinessThread.watch, inlined (hot path)
                readiness.watched[entry] = None
                if readiness.idle:
                    readiness.wake()

    def metric(self, name: str, value: object, reduce: str = "mean", step: int | None = None) -> None:
        if type(name) is not str or len(name) > MAX_NAME_CHARS:
            name, problem = name_text(name)
            if problem is not None:
                self._warn("metric-name", f"metric {problem}")
        if type(reduce) is not str or reduce not in schema.REDUCTIONS:
            reduce, problem = reduction(reduce)
            self._warn(f"reduce:{name}", f"metric {describe(name)}: {problem}")
        if name not in self._metric_names:
            if len(self._metric_names) >= MAX_METRIC_NAMES:
                self.refused_metric_names += 1
                self._warn("metric-names", f"more than {MAX_METRIC_NAMES:,} distinct metric names in this run: "
                           f"values of new names (such as {describe(name, 60)}) are not recorded; put what varies "
                           "into the value or a tag, not the name")
                return
            self._metric_names.add(name)
        step = self._step_argument(step)
        number = self.current_step if step is None else step
        t = self.clock()
        try:
            adapter = adapter_for(value)
            if adapter.host:
                self.sync.record_metric(name, number, finite_or_none(adapter.to_float(value)), reduce, t)
                return
            handle = adapter.prepare_read(value)
        except Exception as exc:
            self._warn(f"metric:{name}", f"metric {describe(name)} not recorded: {describe(exc)}")
            return
        ctx = self._active_step
        if ctx is not None:
            ordinal = ctx.seq
        else:
            ordinal = self._steps_ended - 1
            ctx = self._last_step
        self.sync.metrics.append(PendingMetric(
            ctx if step is None or (ctx is not None and step == ctx.number) else None,
            number, ordinal, (adapter, handle), (name, reduce, t),
        ))

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
        step = self.current_step
        if name == schema.EVENT_ROLLBACK:  # its record names the step it restored (docs/semantics.md 1.8)
            step, problem = rollback_to_step(attrs)
            if problem is not None:
                self._warn("rollback-to-step", f"{problem}; the rollback is left to inference")
        self.buffer.append((schema.EVENT, name, self.clock(), step, attrs))
        if name == schema.EVENT_ROLLBACK and step is not None:
            for listener in self.rollback_listeners:  # the live line takes the thrown-away time back
                try:
                    listener(step)
                except Exception as exc:
                    self._warn(f"listener:{listener!r}", f"a rollback listener failed: {exc!r}")

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

    def finish(self, completed: bool | None = None, reason: str = "finish", exception: str | None = None) -> bool:
        """Write the finish record, flush and close the files.

        ``reason`` "finish" (the program called ``finish()``) waits for every pending value
        first. Any other ending (a signal, an uncaught exception, interpreter exit) waits for
        nothing: pending values are tested once without waiting, those complete are dated, the
        rest are counted in an ``undated_values`` event, so shutdown is bounded even when the
        device never completes.

        The program's ``finish()`` infers its ending: called while an exception is being
        handled (the ``finally`` of ``try: ... finally: gt.finish()`` that a crash goes
        through), it is that crash (reason "exception", its type), whatever ``completed``
        says (an explicit ``True`` is warned about); otherwise ``completed`` None means True.
        """
        if self.finished or os.getpid() != self._pid or self.finishing_thread is not None:
            return False
        if reason == "finish":
            in_flight = exception_in_flight()
            if in_flight is not None:
                if completed is True:
                    self._warn("finish-during-exception", f"finish(completed=True) called while {in_flight} "
                               f"was propagating: recorded as crashed ({in_flight})")
                completed, reason, exception = False, "exception", in_flight
            elif completed is None:
                completed = True
        self.finishing_thread = _get_ident()
        try:
            return self._finish(completed, reason, exception)
        finally:
            self._finish_done.set()
            if self.deferred_signal is not None:  # a signal that came during this finish: now
                signal.signal(self.deferred_signal, signal.SIG_DFL)
                os.kill(os.getpid(), self.deferred_signal)

    def wait_finished(self, timeout: float) -> bool:
        """Wait (bounded) for a finish in progress on another thread."""
        return self._finish_done.wait(timeout)

    def _finish(self, completed: bool | None, reason: str, exception: str | None) -> bool:
        if completed is not None and completed is not True and completed is not False:
            self._warn("finish-completed", f"finish(completed=...) takes True or False, got "
                       f"{describe(completed, 60)}; recorded as stopped early")
            completed = False
        for listener in list(self.finish_listeners):  # integrations close (collectives) first
            try:
                listener(completed, reason)
            except Exception as exc:
                self._warn(f"listener:{listener!r}", f"a finish listener failed: {exc!r}")
        if reason == "finish":
            self.sync.settle(schema.SYNC_FINISH)
        if self.readiness is not None:
            self.readiness.stop(0.1 if reason == "finish" else 0.05)
        if reason != "finish":
            self.sync.settle_without_waiting()
        ctx = self._active_step or self._last_step
        if ctx is not None and ctx.barrier:
            self.sync.end_after_blocking_span(ctx)
        if self._active_step is not None and reason == "finish":
            self._warn("finish-in-step", "finish() called inside a step")
        self.finished = True
        self.buffer.append_always((schema.FINISH, completed, self.clock(), reason, exception))  # even when full
        spans.unbind(self)
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        try:
            closed = self.writer.close(self.config.finish_timeout_s)
        except Exception as exc:  # MemoryError in the last hand-off: False, and how many, never a traceback
            closed = False
            self._warn("close", f"finish(): the writer failed ({exc!r}); at least {self.writer.dropped_records} "
                       "records did not reach storage")
        if self.compactor is not None:  # its last pass reads the finished files; the job does not wait for it
            self.compactor.stop()
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
        self.buffer = RecordBuffer(0)  # a forked child records nothing
        self.sync = SyncPoints(self)  # nothing pending, no lock another thread could hold
        self.readiness = None  # its thread does not exist in the child
        if self.compactor is not None:  # the parent's end stays open: the compactor is told nothing
            self.compactor.stop()
            self.compactor = None
        spans.disable_after_fork(self, collections.deque(maxlen=1))
        try:
            gc.callbacks.remove(self._on_gc)
        except ValueError:
            pass

    @property
    def dropped_records(self) -> int:
        return self.writer.dropped_records
