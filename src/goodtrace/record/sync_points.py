"""Sync points: when each step execution's completion value became ready, written once.

The readiness thread (:mod:`goodtrace.record.values.readiness`) tests pending values without waiting
and dates the ones it finds complete (:meth:`SyncPoints.on_ready`); the training thread
observes (waits for) values when that is free, ``lag`` steps later (:meth:`SyncPoints.settle_lagged`),
when a blocking span starts or at ``finish()`` (:meth:`SyncPoints.settle`), and the earlier of
the two dates the execution. A blocking span started before the step's ``complete_on`` first
runs the device barrier, so that it never measures the wait for its step. At a signal, crash
or exit nothing is waited for (:meth:`SyncPoints.settle_without_waiting`). Metric values are
read here too, in order, without touching the device.

:class:`SyncPoints` is a part the :class:`goodtrace.record.recorder.Recorder` holds
(``recorder.sync``): it owns the values waiting to be dated and read; it writes through the
recorder's buffer, clock, listeners and warnings.
"""

from __future__ import annotations

import collections
import threading
from typing import TYPE_CHECKING, Any

from goodtrace import schema
from goodtrace.record.values.adapters import ValueAdapter, finite_or_none
from goodtrace.record.values.readiness import Pending, PendingMetric, ready_state

if TYPE_CHECKING:
    from goodtrace.record.recorder import Recorder
    from goodtrace.record.step_context import StepContext


class SyncPoints:
    """Dating step executions and reading metric values (a part of the recorder)."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        # Values not observed yet, in order: completions and metrics. The training thread (or a
        # thread starting a blocking span) takes them under ``lock``; the readiness thread only
        # tests watched completions and claims them (Pending.take), never waits on a lock.
        self.pending: collections.deque[Pending] = collections.deque()
        self.metrics: collections.deque[PendingMetric] = collections.deque()
        self.lock = threading.RLock()
        self.observing: Pending | None = None  # the value the training thread is waiting for
        self.polled_syncs: collections.deque[tuple[int | None, int, str]] = collections.deque()
        self.uses_completions = False  # complete_on was called in this session
        self.last_value: tuple[ValueAdapter, Any] | None = None  # latest device completion value
        self.observations = 0

    # ------------------------------------------------------------------ sync points
    def sync_point(self, step: int | None, seq: int | None, t: int, how: str, after: int | None = None) -> None:
        self.rec.buffer.append((schema.SYNC, step, t, how, seq, after))
        for listener in self.rec.sync_listeners:
            try:
                listener(step, t, how)
            except Exception as exc:
                self.rec._warn(f"listener:{listener!r}", f"a sync listener failed: {exc!r}")

    def on_ready(self, entry: Pending, t: int) -> None:
        """The readiness thread found ``entry`` complete at ``t`` and claimed it (its thread).
        When the training thread had seen it complete earlier (it published that time just
        before trying to claim the entry itself), that earlier time is the sync point."""
        how = schema.SYNC_POLL
        observed = entry.observed
        if observed is not None and observed[0] < t:
            t, how = observed
        self.rec.buffer.append((schema.SYNC, entry.step, t, how, entry.seq, entry.not_ready_t or None))
        if self.rec.sync_listeners:  # listeners run in the training thread, at its next step end
            self.polled_syncs.append((entry.step, t, how))

    def _notify_polled(self) -> None:
        polled = self.polled_syncs
        while polled:
            step, t, how = polled.popleft()
            for listener in self.rec.sync_listeners:
                try:
                    listener(step, t, how)
                except Exception as exc:
                    self.rec._warn(f"listener:{listener!r}", f"a sync listener failed: {exc!r}")

    def record_metric(self, name: str, step: int | None, value: float | None, reduce: str, t: int) -> None:
        self.rec.buffer.append((schema.METRIC, name, step, value, reduce, t))
        for listener in self.rec.metric_listeners:
            try:
                listener(name, step, value, reduce)
            except Exception as exc:
                self.rec._warn(f"listener:{listener!r}", f"a metric listener failed: {exc!r}")

    def settle_lagged(self, ctx: StepContext) -> None:
        """At the end of step execution ``ctx``: observe the values ``lag`` steps old."""
        with self.lock:
            if self.polled_syncs:
                self._notify_polled()
            lag = self.rec.config.lag
            ended = self.rec._steps_ended
            pending = self.pending
            while pending and ended - pending[0].ordinal > lag:
                self._observe(pending.popleft(), schema.SYNC_LAG)
            # The step that just ended: if the loop already synchronised on its value (it logged
            # the loss inside the step, say), its sync point is now at the latest.
            entry = ctx.sync
            if isinstance(entry, Pending) and entry.claim:
                adapter, handle = entry.value
                if adapter.ready(handle) is True:
                    t = self.rec.clock()
                    entry.observed = (t, schema.SYNC_READY)
                    seen = entry.seen_t
                    if entry.take():
                        if seen and seen < t:
                            self.sync_point(entry.step, entry.seq, seen, schema.SYNC_POLL, entry.not_ready_t or None)
                        else:
                            self.sync_point(entry.step, entry.seq, t, schema.SYNC_READY, entry.not_ready_t or None)
            if self.metrics:
                self._read_metrics(ended - lag, wait=False)

    def _read_metrics(self, before_ordinal: int | None, *, wait: bool) -> None:
        """Record the metric values of steps that began before ``before_ordinal`` steps had
        ended (None: all), in order. A value not complete yet is read
        only when ``wait``, or when its step's completion has been observed (its copy was queued
        right after that step's work: microseconds); else it and those after it wait for the
        next call. Reading never touches the device (see ``torch_values``)."""
        metrics = self.metrics
        while metrics and (before_ordinal is None or metrics[0].ordinal < before_ordinal):
            entry = metrics[0]
            adapter, handle = entry.value
            if not wait and not _completed(entry.ctx):
                try:
                    if adapter.ready(handle) is False:
                        return
                except Exception:
                    pass
            metrics.popleft()
            name, reduce, t = entry.metric
            try:
                value = finite_or_none(adapter.to_float(handle))
            except Exception as exc:
                self.rec._warn(f"observe:{type(exc)}", f"could not read metric {name!r} of step {entry.step}: {exc!r}")
                continue
            self.record_metric(name, entry.step, value, reduce, t)

    def settle(self, how: str = schema.SYNC_BLOCKING) -> None:
        """Observe every pending value now, waiting for each (blocking spans, finish).

        At the start of a blocking span (``how`` = blocking) inside a step whose completion
        value has not been passed yet, the device barrier then runs: see
        :meth:`_barrier_before_span`. Metric values are read when complete (at finish: waited
        for)."""
        try:
            with self.lock:
                if self.polled_syncs:
                    self._notify_polled()
                pending = self.pending
                while pending:
                    self._observe(pending.popleft(), how)
                if self.metrics:
                    self._read_metrics(None, wait=how is not schema.SYNC_BLOCKING)
                if how is schema.SYNC_BLOCKING:
                    ctx = self.rec._active_step
                    if ctx is not None and ctx.sync is None and not ctx.barrier:
                        self._barrier_before_span(ctx)
        except Exception as exc:
            self.rec._warn("settle", f"internal error while observing step values: {exc!r}")

    def _observe(self, entry: Pending, how: str) -> None:
        """Wait for a completion value (unless the readiness thread dated it) and write its
        sync point: the earlier of when this thread saw it complete and when the readiness
        thread did."""
        if not entry.claim:
            return
        adapter, handle = entry.value
        self.observing = entry  # a signal handler ending the process counts it if undated
        try:
            adapter.wait(handle)
        except Exception as exc:
            self.rec._warn(f"observe:{type(exc)}", f"could not observe a value of step {entry.step}: {exc!r}")
            return
        finally:
            self.observing = None
        t = self.rec.clock()
        entry.observed = (t, how)  # for the readiness thread, should it claim the entry first
        seen = entry.seen_t
        if entry.take():
            self.observations += 1
            if seen and seen < t:
                t, how = seen, schema.SYNC_POLL
            self.sync_point(entry.step, entry.seq, t, how, entry.not_ready_t or None)

    # ------------------------------------------------------------------ blocking spans
    def _run_barrier(self) -> bool:
        """The framework's device barrier, else the one of the latest completion value's type."""
        if self.rec.device_barrier is not None:
            self.rec.device_barrier()
            return True
        last = self.last_value
        if last is None:
            return False
        adapter, handle = last
        return bool(adapter.barrier(handle))

    def _barrier_before_span(self, ctx: StepContext) -> None:
        """A blocking span starts in ``ctx`` before its completion value was passed (the
        checkpoint sits before ``complete_on``): wait for the device first, so that the span
        never measures the wait for this step. The barrier's instant becomes the step's sync
        point when the value passed later turns out complete (it was dispatched before the
        span), or when the step ends without one in a loop that passes completion values."""
        try:
            ran = self._run_barrier()
        except Exception as exc:
            self.rec._warn("barrier", f"the device barrier before a blocking span failed: {exc!r}")
            ran = False
        ctx.barrier = self.rec.clock() if ran else -1

    def complete_after_blocking_span(self, ctx: StepContext, adapter: ValueAdapter, handle: Any) -> bool:
        """``complete_on`` in a step where a blocking span already started: True when that
        settles the step's sync point (no pending value needed)."""
        barrier, ctx.barrier = ctx.barrier, 0
        state = ready_state((adapter, handle))
        if state is False:
            return False  # dispatched after the span: the readiness check dates it as usual
        if barrier > 0:  # complete now: it was complete at the barrier, before the span
            ctx.sync = True
            self.sync_point(ctx.number, ctx.seq, barrier, schema.SYNC_BARRIER)
            return True
        self._warn_unbarriered(ctx)
        ctx.sync = True
        self.sync_point(ctx.number, ctx.seq, self.rec.clock(), schema.SYNC_READY)
        return True

    def end_after_blocking_span(self, ctx: StepContext) -> None:
        """A step with a blocking span ends: its barrier instant is its sync point when no
        value was passed (in a loop that passes them; a host-timed loop has none)."""
        barrier, ctx.barrier = ctx.barrier, 0
        if ctx.sync is not None or not self.uses_completions:
            return
        if barrier > 0:
            ctx.sync = True
            self.sync_point(ctx.number, ctx.seq, barrier, schema.SYNC_BARRIER)
        else:
            self._warn_unbarriered(ctx)

    def _warn_unbarriered(self, ctx: StepContext) -> None:
        self.rec._warn(
            "unbarriered-span",
            f"a blocking span started in step {ctx.number} before its complete_on, and goodtrace "
            "has no device barrier for this value type, so the span may include the wait for the "
            "step and the step's end cannot be dated; call complete_on before the span (or use "
            "goodtrace.integrations.torch/jax.instrument(), or register_value_type(..., barrier=))",
        )

    def settle_without_waiting(self) -> None:
        """At a signal, crash or exit: date what is complete now, count the rest, wait for
        nothing (no lock either: this may run in a signal handler that interrupted a wait)."""
        undated_steps: list[int | None] = []
        unread = 0
        try:
            observing = self.observing  # popped, and waited for when a signal interrupted
            for entry in ([observing] if observing is not None else []) + list(self.pending):
                if not entry.claim:
                    continue
                state = ready_state(entry.value)
                if entry.take():
                    if state is True:
                        self.sync_point(entry.step, entry.seq, self.rec.clock(), schema.SYNC_FINISH, entry.not_ready_t or None)
                    else:
                        undated_steps.append(entry.step)
            self.pending.clear()
            for metric in list(self.metrics):
                adapter, handle = metric.value
                try:
                    if adapter.ready(handle) is True:
                        name, reduce, t = metric.metric
                        self.record_metric(name, metric.step, finite_or_none(adapter.to_float(handle)), reduce, t)
                        continue
                except Exception:
                    pass
                unread += 1
            self.metrics.clear()
        except Exception as exc:
            self.rec._warn("settle", f"internal error while dating step values at exit: {exc!r}")
        if undated_steps or unread:
            self.rec.event("undated_values", {
                "completions": len(undated_steps), "metrics": unread,
                "steps": undated_steps[:100],
            })


class _Arrived:
    """A completion value that was complete when passed (a CPU tensor): dated when its step
    ends, never polled."""

    host = False

    def ready(self, handle: Any) -> bool | None:
        return True

    def wait(self, handle: Any) -> None:
        return None

    def barrier(self, handle: Any) -> bool:
        return False


_ARRIVED: Any = _Arrived()


def _completed(ctx: StepContext | None) -> bool:
    """Whether execution ``ctx``'s sync point is written."""
    if ctx is None:
        return False
    state = ctx.sync
    return state is True or (isinstance(state, Pending) and not state.claim)
