"""Live aggregation across ranks: one collective per log step, never waited on by the loop.

A :class:`LiveAggregator` listens to the recorder (metrics, sync points, step ends). Every
``log_every`` steps it packs everything this rank recorded in the log interval since the previous
log step — per metric: sum, sum of squares, min, max, count, last — into one fixed-size vector
and hands it to a transport, which gathers the vectors asynchronously: to every rank
(:class:`Transport`: JAX multi-process utilities, or :class:`LocalTransport` for one process),
or to rank 0 only (:class:`RootedTransport`: ``torch.distributed`` on a gloo group of its own),
which then broadcasts what every rank needs and sends the merged line to the ranks with sinks
(live/rooted.py), so that no rank other than 0 receives more per log step with more ranks. Metric slots are agreed across ranks without any
exchange: a metric's slot is a 48-bit hash of its name, the same on every rank, written beside
its statistics; a name itself travels once, in the first interval in which a rank records it.
So ranks need not record the same metrics (a learning rate only on rank 0, a loss only on the
last pipeline stage, a device time that resolves a log interval late): a rank without a value
contributes a count of zero, and every rank's tokens and FLOPs are counted. The log interval is
launched once its values are observed (``lag`` step ends after the log step) and completed
when it is done, checked without waiting at each step end; the loop only waits when the
*next* log interval launches and the previous one is still in flight (counted in
``blocking_waits``), or at ``finish(completed=True)`` (at most ``finish_timeout_s``). Rank 0
then reduces each metric with its reduction and prints one line (step, loss, step time = train
+ overheads, tokens/s, TFLOP/s, MFU, memory, goodput of this attempt so far, the ranks slower
than they were: live/slowdown.py) and hands a :class:`LiveLine` to listeners.

Framework-neutral: nothing here imports torch or jax.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import sys
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from goodtrace import schema
from goodtrace.record.errors import warn
from goodtrace.record.live import rooted
from goodtrace.record.live import vector as live_vector
from goodtrace.record.live.goodput import AttemptGoodput
from goodtrace.record.live.line import LiveLine, MetricSummary, format_bytes, format_goodput, format_line
from goodtrace.record.live.log_interval import LogInterval, LogIntervals
from goodtrace.record.live.names import MetricNames
from goodtrace.record.live.rewinds import RewoundTime
from goodtrace.record.live.slowdown import LiveSlowdown, SlowdownTracker, judge_candidates
from goodtrace.record.live.transport import GatherHandle, LocalTransport, RootedTransport, Transport
from goodtrace.record.threads import Thread

__all__ = [
    "Completion",
    "GatherHandle",
    "LiveAggregator",
    "LiveLine",
    "LocalTransport",
    "MetricSummary",
    "RootedTransport",
    "Transport",
    "format_bytes",
]

DRAIN_S = 5.0  # at a local ending: how long gathers already launched may take to finish


class Completion(NamedTuple):
    """When one log interval's gather was launched and completed, counted in step ends."""

    step: int  # the log step
    launched_at: int
    completed_at: int


class _Exchange:
    """A rank other than 0 over a rooted transport: its gather, the broadcast it receives,
    and its summary when it asked for one; done when all are."""

    def __init__(self, parts: list[GatherHandle]) -> None:
        self._parts = parts

    def done(self) -> bool:
        return all(part.done() for part in self._parts)

    def wait(self) -> list[list[float]]:
        self._parts[0].wait()
        return [part.wait()[0] for part in self._parts[1:]]


class LiveAggregator:
    """Reduce metrics across ranks every ``log_every`` steps; rank 0 prints one line each.

    ``tokens_per_step`` and ``flops_per_step`` are this rank's (summed over ranks);
    ``peak_flops`` is the peak FLOP/s of one device and ``devices`` how many this rank drives
    (MFU: the FLOP rate over the sum of every rank's ``peak_flops x devices``). Call :meth:`close`
    before ``finish()`` (the torch integration does it for you): it launches the last log intervals
    and waits for them.
    """

    def __init__(
        self,
        recorder: Any,
        transport: Transport | RootedTransport,
        *,
        log_every: int = 10,
        tokens_per_step: float | None = None,
        flops_per_step: float | None = None,
        peak_flops: float | None = None,
        devices: int = 1,
        max_metrics: int = 64,
        printer: Callable[[str], None] | None = None,
        process_start_ns: int | None = None,
        watch_overhead: bool = True,
    ) -> None:
        if isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 1:
            raise ValueError(f"log_every must be a positive int, got {log_every!r}")
        if not isinstance(max_metrics, int) or not 1 <= max_metrics <= 10_000:
            raise ValueError(f"max_metrics must be between 1 and 10000, got {max_metrics!r}")
        for label, number in (("tokens_per_step", tokens_per_step), ("flops_per_step", flops_per_step),
                              ("peak_flops", peak_flops)):
            if number is not None and (not isinstance(number, (int, float)) or not number >= 0):
                raise ValueError(f"{label} must be a non-negative number, got {number!r}")
        self.recorder = recorder
        self.transport = transport
        self.log_every = log_every
        self.tokens_per_step = tokens_per_step
        self.flops_per_step = flops_per_step
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
            raise ValueError(f"devices must be a positive int, got {devices!r}")
        self.peak_flops = peak_flops
        self._rank_peak_flops = float(peak_flops or 0.0) * devices  # this rank's devices together
        self.max_metrics = max_metrics
        self.printer = printer if printer is not None else _print
        self.listeners: list[Callable[[LiveLine], None]] = []
        self.lines: list[LiveLine] = []
        self.blocking_waits = 0  # launches or closes that had to wait for a gather in flight
        self.completed_at: list[Completion] = []  # each gather, counted in step ends
        config = getattr(recorder, "config", None)
        self.lag = int(getattr(config, "lag", 1))
        clock: Callable[[], int] = getattr(recorder, "clock", time.perf_counter_ns)
        self._clock = clock
        self._lock = threading.RLock()
        self._launched = threading.Condition(self._lock)  # rank 0, rooted: its completer thread waits on it
        self._completer: threading.Thread | None = None
        self._ends = 0
        self._first_t0: int | None = None
        self._first_step: int | None = None
        self._last_step_end: tuple[int, int] | None = None  # (step, host t1)
        self._waiting: collections.deque[tuple[int, int, int]] = collections.deque()  # (step, ready_at, t1)
        self._in_flight: collections.deque[tuple[LogInterval, GatherHandle, int]] = collections.deque()
        self._rooted = callable(getattr(transport, "gather", None))  # gathered to rank 0, not to all
        self._sending: list[GatherHandle] = []  # rank 0, rooted: broadcasts and summaries in flight
        self._listens: dict[int, bool] = {}  # log step -> whether this rank asked for the merged line
        self._productive_ns = 0  # the log intervals' productive time, less what rollbacks took back
        self._reported_productive_ns = 0  # ... before they took it: the difference is their share
        self._shown = (0, 0)  # the productive ns last shown, and the rollbacks seen by then
        # a rollback takes its thrown-away time and its recovery back (live.rewinds)
        self._rewound = RewoundTime(lambda a, b: sum(self._intervals.overhead_in(a, b, prune=False).values()))
        self._process_start_ns = process_start_ns if process_start_ns is not None else _process_start(recorder)
        # this attempt's goodput by the report's rules (record/live/goodput.py)
        blocking = getattr(config, "all_blocking_categories", schema.BLOCKING_CATEGORIES)
        self.attempt_goodput = AttemptGoodput(self._process_start_ns, blocking)
        # what this rank recorded since the last log step; its overhead by the same rule as the goodput
        self._intervals = LogIntervals(self._warn, self.attempt_goodput.busy_until, blocking)
        self.final_goodput: float | None = None  # its value at finish (close)
        self._warned: set[str] = set()
        self._metric_names = MetricNames(self._warn)  # slots, and names learned from the gathers
        self._told = MetricNames(self._warn)  # rank 0, rooted: the names a broadcast has carried
        self._closed = False
        self._watch_overhead = watch_overhead
        self._overhead_total_ns: dict[str, int] = {}
        self._wall_minus_clock = time.time_ns() - clock()
        identity = getattr(recorder, "identity", None)
        self._rank = int(getattr(identity, "rank", transport.rank))
        self._host = str(getattr(identity, "host", ""))
        self._host_id = float(zlib.crc32(self._host.encode()))
        self.slowdown = SlowdownTracker()  # this rank's own slowdown (live/slowdown.py)
        self.slowdowns: dict[int, LiveSlowdown] = {}  # rank 0: the ranks named so far
        self.replaceable = False  # a sink's stand-in (no instrument() call): a later aggregator replaces it
        previous = getattr(recorder, "live_aggregator", None)
        if previous is not None and getattr(previous, "replaceable", False):
            previous.abandon()
        if hasattr(recorder, "live_aggregator"):
            recorder.live_aggregator = self
        self._attach()

    # ------------------------------------------------------------------ recorder hooks
    def _attach(self) -> None:
        rec = self.recorder
        for attr, hook in self._hooks():
            listeners = getattr(rec, attr, None)
            if isinstance(listeners, list):
                listeners.append(hook)

    def _detach(self) -> None:
        rec = self.recorder
        for attr, hook in self._hooks():
            listeners = getattr(rec, attr, None)
            if isinstance(listeners, list) and hook in listeners:
                listeners.remove(hook)

    def _hooks(self) -> list[tuple[str, Callable[..., None]]]:
        hooks: list[tuple[str, Callable[..., None]]] = [
            ("metric_listeners", self._on_metric), ("sync_listeners", self._on_sync),
            ("step_listeners", self._on_step_end), ("rollback_listeners", self._on_rollback),
            ("step_begin_listeners", self._on_step_begin),
        ]
        if self._watch_overhead:  # overhead spans, automatic ones (compile, gc) included
            hooks.append(("overhead_span_listeners", self.on_overhead_span))
        return hooks + self.attempt_goodput.hooks() + self.slowdown.hooks()

    def _on_metric(self, name: str, step: int | None, value: float | None, reduce: str) -> None:
        if step is None or value is None:
            return
        with self._lock:
            self._intervals.add_value(name, step, value, reduce)

    def _on_sync(self, step: int | None, t: int, how: str) -> None:
        if step is not None:
            with self._lock:
                self._intervals.add_sync(step, t)
                self._rewound.step_synced(step, t)

    def _on_rollback(self, to_step: int) -> None:
        with self._lock:
            self._productive_ns += self._rewound.rollback(to_step, self._clock())
            self._redo_from(to_step + 1)

    def _on_step_begin(self, number: int, t0: int) -> None:
        with self._lock:
            self._productive_ns += self._rewound.step_began(number, t0)
            self._redo_from(number)

    def _redo_from(self, step: int) -> None:
        """This attempt runs ``step`` again: an earlier attempt's run of it no longer counts
        (the line's ``first_step``, for the sinks' ``goodput/job``)."""
        if self._first_step is not None and step < self._first_step:
            self._first_step = step

    def on_overhead_span(self, category: str, t0: int, t1: int) -> None:
        """An overhead span ended (the recorder's overhead-span listener)."""
        with self._lock:
            self._intervals.add_overhead(category, t0, t1)

    def _on_step_end(self, number: int, t0: int, t1: int) -> None:
        with self._lock:
            if self._closed:
                return
            self._ends += 1
            if self._first_t0 is None:
                self._first_t0 = t0
                self._first_step = number
            self._last_step_end = (number, t1)
            self._rewound.step_ended(number, t1)
            if number % self.log_every == 0:
                self._waiting.append((number, self._ends + self.lag, t1))
            # A step whose body raised may be a crashing rank's last: no collective then (its
            # peers may never join it, and a gather in flight holds the process at exit). The
            # log intervals wait for the next step end, if there is one; log intervals go out in order, so
            # a late launch still meets the peers' gathers.
            while self._waiting and self._waiting[0][1] <= self._ends and sys.exc_info()[0] is None:
                step, _, host_t1 = self._waiting.popleft()
                self._launch(step, host_t1)
            self._poll()

    # ------------------------------------------------------------------ log intervals
    def _launch(self, step: int, host_t1: int) -> None:
        if self._in_flight:  # the previous log interval must be complete before the next one starts
            if not self._in_flight[0][1].done():
                self.blocking_waits += 1
            self._complete()
        interval = self._pack(step, host_t1)
        try:
            handle = self._start(interval)
        except Exception as exc:
            self._warn("launch", f"live aggregation disabled: the gather failed to start: {exc!r}")
            self._closed = True
            return
        self._in_flight.append((interval, handle, self._ends))
        if self._rooted and self.transport.rank == 0:
            if self._completer is None:
                self._completer = Thread(target=self._complete_in_background, daemon=True,
                                                   name="goodtrace-live-root")
                self._completer.start()
            self._launched.notify()

    def _complete_in_background(self) -> None:
        """Rank 0, rooted: complete each gather as soon as it is done, off the training thread,
        so that the other ranks get their broadcast even when rank 0's loop does not come back
        to a step end (it stopped, or waits for its peers to exit)."""
        while True:
            with self._launched:
                while not self._closed and not self._in_flight:
                    self._launched.wait(1.0)
                if self._closed:
                    return
                handle = self._in_flight[0][1]
            pause = 0.001
            while not handle.done():
                if self._closed:
                    return
                time.sleep(pause)
                pause = min(pause * 2, 0.02)
            with self._lock:
                if self._closed:
                    return
                if self._in_flight and self._in_flight[0][1] is handle:
                    self._complete()

    def _start(self, interval: LogInterval) -> GatherHandle:
        transport = self.transport
        if not self._rooted:
            return transport.all_gather(interval.vector)  # type: ignore[union-attr]
        rooted_transport: Any = transport
        handle: GatherHandle = rooted_transport.gather(interval.vector)
        if transport.rank == 0:
            return handle
        parts = [handle, rooted_transport.broadcast(None, rooted.BROADCAST)]
        if self._listens.get(interval.step):
            parts.append(rooted_transport.recv_summary(rooted.summary_size(self.max_metrics)))
        return _Exchange(parts)

    def _poll(self) -> None:
        while self._in_flight and self._in_flight[0][1].done():
            self._complete()
        self._sending = [h for h in self._sending if not h.done()]

    def _complete(self) -> None:
        interval, handle, launched = self._in_flight.popleft()
        try:
            vectors = handle.wait()
        except Exception as exc:
            self._warn("wait", f"live aggregation disabled: the gather failed: {exc!r}")
            self._closed = True
            self._in_flight.clear()
            return
        self.completed_at.append(Completion(interval.step, launched, self._ends))
        listens = self._listens.pop(interval.step, False)
        if self._rooted and self.transport.rank != 0:
            self._complete_from_root(interval, vectors, listens)
            return
        try:
            size = len(interval.vector)
            self._metric_names.learn([v for v in vectors if live_vector.valid(v, size)],
                                     live_vector.HEADER + live_vector.ENTRY * self.max_metrics,
                                     live_vector.H_NAME_FLOATS)
        except Exception as exc:
            self._warn("names", f"metric names of a log interval could not be read: {exc!r}")
        merged: live_vector.Merged | None = None
        if self.transport.rank == 0 or getattr(self.recorder, "line_listeners", None):
            try:
                merged = self._report(interval, vectors)
            except Exception as exc:
                self._warn("report", f"live line for step {interval.step} failed: {exc!r}")
        self.slowdown.choose(live_vector.slow_fields(vectors, size))  # every rank alike: the next log interval's onsets
        if self._rooted:
            self._send_back(interval, vectors, merged)

    def _send_back(self, interval: LogInterval, vectors: Sequence[Sequence[float]],
                   merged: live_vector.Merged | None) -> None:
        """Rank 0, rooted: the broadcast (onsets, names) to every rank, and its summary to each
        rank that asked for one; always sent (a rank waits for them), empty if the merge failed."""
        size = len(interval.vector)
        transport: Any = self.transport
        summary_size = rooted.summary_size(self.max_metrics)
        asking = [r for r, v in enumerate(vectors) if r != 0 and len(v) > live_vector.H_LISTENS
                  and v[live_vector.H_LISTENS] == 1.0]
        summaries: dict[int, list[float]] = {}
        names: list[float] = []
        try:
            valid = {r: v for r, v in enumerate(vectors) if live_vector.valid(v, size)}
            slowdowns = [(self.slowdowns[r], int(valid[r][live_vector.H_HOST_SLOT]) if r in valid else 0)
                         for r in sorted(self.slowdowns)]
            chosen = sorted(merged.metrics)[: self.max_metrics] if merged is not None else []
            told = [n for n in chosen if not n.startswith("metric#")]
            told += [self._metric_names.names[slot] for _, slot in slowdowns[: rooted.SLOWDOWNS]
                     if slot in self._metric_names.names]
            names = self._told.announce(told)
            if merged is not None and asking:
                ends = [v[live_vector.H_ALIGNED_END] for v in valid.values()]
                first = min(ends) if ends else 0.0
                late = {r: max(0.0, (v[live_vector.H_ALIGNED_END] - first) / 1e9) for r, v in valid.items()}
                slowest = max(late, key=lambda r: (late[r], -r)) if len(late) > 1 else None
                if len(merged.metrics) > self.max_metrics:
                    self._warn("summary_metrics", f"more than {self.max_metrics} metrics across ranks: the "
                               "sinks of ranks other than 0 get the first ones by name")
                by_host: dict[float, list[tuple[int, float, float]]] = {}
                for r, v in valid.items():
                    by_host.setdefault(v[live_vector.H_HOST], []).append((r, v[live_vector.H_STEP_S], late[r]))
                for r in asking:
                    host = by_host.get(vectors[r][live_vector.H_HOST], []) if r in valid else []
                    summaries[r] = rooted.pack_summary(
                        self.max_metrics, merged.ranks, merged.tokens, merged.flops, merged.peak_flops, slowest,
                        merged.metrics, self._metric_names.slot, slowdowns, host)
        except Exception as exc:
            self._warn("summary", f"the live summary for the other ranks failed: {exc!r}")
        try:
            self._sending.append(transport.broadcast(rooted.pack_broadcast(self.slowdown.candidates, names),
                                                     rooted.BROADCAST))
            for r in asking:
                self._sending.append(transport.send_summary(r, summaries.get(r, [0.0] * summary_size)))
        except Exception as exc:
            self._warn("send", f"live aggregation disabled: rank 0 could not send back: {exc!r}")
            self._closed = True
            self._in_flight.clear()

    def _complete_from_root(self, interval: LogInterval, received: Sequence[Sequence[float]], listens: bool) -> None:
        """A rank other than 0, rooted: the onsets and names every rank gets, and its line
        from rank 0's summary when it asked for one."""
        broadcast = received[0] if received else []
        try:
            start, count_at = rooted.broadcast_names_at()
            candidates = rooted.unpack_candidates(broadcast)
            if candidates is None:
                self._warn("layout", "rank 0 sent a live broadcast of another layout (another goodtrace "
                           "version?); this rank's slowdown onsets and names are not updated")
                return
            self._metric_names.learn([broadcast], start, count_at)
            self.slowdown.candidates = candidates
        except Exception as exc:
            self._warn("names", f"the live broadcast could not be read: {exc!r}")
            return
        if not listens or len(received) < 2:
            return
        try:
            summary = rooted.unpack_summary(received[1], self.max_metrics, self._metric_names.names)
            if summary is not None:
                self._report_summary(interval, summary)
        except Exception as exc:
            self._warn("report", f"live line for step {interval.step} failed: {exc!r}")

    def _pack(self, step: int, host_t1: int) -> LogInterval:
        """Close this rank's interval at log step ``step`` and pack its vector."""
        interval = self._intervals.close(step, host_t1, self._first_t0, self._first_step, self._rewound.resumed_at)
        names = sorted(interval.stats)
        if len(names) > self.max_metrics:
            self._warn("max_metrics", f"more than {self.max_metrics} metrics per log step: the live line "
                       "shows the first ones by name (all are recorded)")
            names = names[: self.max_metrics]
        offset = getattr(self.recorder, "clock_offset_ns", None)  # to rank 0's clock, when measured
        listens = bool(getattr(self.recorder, "line_listeners", None)) and self.transport.rank != 0
        self._listens[step] = listens
        header = live_vector.Header(
            step=step, tokens=(self.tokens_per_step or 0.0) * interval.steps,
            flops=(self.flops_per_step or 0.0) * interval.steps, peak_flops=self._rank_peak_flops,
            step_s=(interval.end_ns - interval.start_ns) / 1e9 / interval.steps,
            aligned_end=interval.end_ns + (offset if isinstance(offset, int) else self._wall_minus_clock),
            host_id=self._host_id, host_slot=self._metric_names.slot(self._host), slow=self.slowdown.fields(),
            listens=listens)
        announced = self._metric_names.announce([self._host, *names])  # the host's name travels once too
        interval.vector = live_vector.pack(header, interval.stats, interval.reductions, names, self.max_metrics,
                                           announced, self._metric_names.slot)
        return interval

    # ------------------------------------------------------------------ rank 0
    def _report(self, interval: LogInterval, vectors: Sequence[Sequence[float]]) -> live_vector.Merged:
        size = len(interval.vector)
        merged = live_vector.merge(vectors, size, self.max_metrics, self._metric_names.names, self._warn)
        per_rank = merged.per_rank
        ends = [float(v[live_vector.H_ALIGNED_END]) for v in per_rank]
        lateness = tuple(max(0.0, (end - min(ends)) / 1e9) for end in ends)
        hosts = [v[live_vector.H_HOST_SLOT] if live_vector.valid(v, size) else None for v in vectors]
        judge_candidates(self.slowdown.candidates, live_vector.slow_fields(vectors, size),
                         lambda r: self._metric_names.names.get(int(hosts[r] or 0), "?"), self.slowdowns)
        self._emit(interval, merged.ranks, merged.tokens, merged.flops, merged.peak_flops, merged.metrics,
                   rank_step_s=tuple(float(v[live_vector.H_STEP_S]) for v in per_rank), rank_lateness_s=lateness,
                   slowest_rank=max(range(len(lateness)), key=lateness.__getitem__) if len(lateness) > 1 else None,
                   host_ranks=tuple(i for i, v in enumerate(per_rank) if v[live_vector.H_HOST] == self._host_id))
        return merged

    def _report_summary(self, interval: LogInterval, summary: rooted.Summary) -> None:
        """A rank other than 0 with sinks, rooted: its line from rank 0's summary (the ranks of
        its host have their step time and lateness; the others' are NaN)."""
        step_s = [math.nan] * summary.ranks
        late = [math.nan] * summary.ranks
        for rank, seconds, lateness in summary.host:
            if 0 <= rank < summary.ranks:
                step_s[rank], late[rank] = seconds, lateness
        self.slowdowns = {
            rank: LiveSlowdown(rank, self._metric_names.names.get(host_slot, "?"), onset, before, after, others)
            for rank, onset, before, after, others, host_slot in summary.slowdowns}
        self._emit(interval, summary.ranks, summary.tokens, summary.flops, summary.peak_flops, summary.metrics,
                   rank_step_s=tuple(step_s), rank_lateness_s=tuple(late), slowest_rank=summary.slowest_rank,
                   host_ranks=tuple(rank for rank, _, _ in summary.host if 0 <= rank < summary.ranks))

    def _emit(self, interval: LogInterval, ranks: int, tokens: float, flops: float, peak: float,
              metrics: dict[str, MetricSummary], *, rank_step_s: tuple[float, ...], rank_lateness_s: tuple[float, ...],
              slowest_rank: int | None, host_ranks: tuple[int, ...]) -> None:
        """This rank's line: the ranks' figures given, this rank's own time, overhead and goodput."""
        interval_ns = interval.end_ns - interval.start_ns
        seconds = interval_ns / 1e9 if interval_ns > 0 else None
        overhead_total = sum(interval.overhead_ns.values())
        if interval_ns > 0:
            self._productive_ns += self._rewound.kept(interval.start_ns, interval.end_ns, max(0, interval_ns - overhead_total))
            self._reported_productive_ns += max(0, interval_ns - overhead_total)
        for category, ns in interval.overhead_ns.items():
            self._overhead_total_ns[category] = self._overhead_total_ns.get(category, 0) + ns
        step_time = seconds / interval.steps if seconds else None
        train = max(0.0, (interval_ns - overhead_total) / 1e9 / interval.steps) if seconds else None
        overhead = {c: ns / 1e9 / interval.steps for c, ns in sorted(interval.overhead_ns.items())}
        tokens_per_s = tokens / seconds if seconds and tokens else None
        tflops = flops / seconds / 1e12 if seconds and flops else None
        mfu = (flops / seconds) / peak if seconds and flops and peak else None
        elapsed = interval.end_ns - self._process_start_ns
        goodput, productive_ns = self._goodput_at(interval.end_ns)
        line = LiveLine(
            step=interval.step, steps=interval.steps, ranks=ranks, step_time_s=step_time, train_s=train,
            overhead_s=overhead, metrics=metrics, tokens_per_s=tokens_per_s, tflops_per_s=tflops, mfu=mfu,
            goodput=goodput, timing=interval.timing, text="",
            elapsed_s=elapsed / 1e9 if elapsed > 0 else None,
            productive_s=productive_ns / 1e9,
            overhead_total_s={c: ns / 1e9 for c, ns in sorted(self._overhead_total_ns.items())},
            wall_ns=interval.end_ns + self._wall_minus_clock, first_step=self._first_step, rank=self._rank,
            rank_step_s=rank_step_s, rank_lateness_s=rank_lateness_s, slowest_rank=slowest_rank,
            host_ranks=host_ranks, slowdowns=tuple(self.slowdowns[r] for r in sorted(self.slowdowns)),
        )
        line = dataclasses.replace(line, text=format_line(line))
        self.lines.append(line)
        if self.transport.rank == 0:
            self.printer(line.text)
        for listener in (*self.listeners, *getattr(self.recorder, "line_listeners", ())):
            try:
                listener(line)
            except Exception as exc:
                self._warn(f"listener:{listener!r}", f"a live-line listener failed: {exc!r}")

    # ------------------------------------------------------------------ lifecycle
    def close(self, wait: bool = True, timeout: float | None = None) -> None:
        """Launch the log intervals still waiting (and a last partial one), then complete them all.

        Every rank must call this (it is collective), normally through ``finish(completed=True)``.
        It waits at most ``timeout`` seconds (default: the recorder's ``finish_timeout_s``) for
        the gathers, then abandons them with a warning: a peer that never joins cannot hold up
        this rank's finish.
        """
        if timeout is None:
            timeout = float(getattr(getattr(self.recorder, "config", None), "finish_timeout_s", 10.0))
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._closed:
                self._detach()
                return
            try:
                settle = getattr(self.recorder, "settle", None)
                if settle is not None:
                    settle(schema.SYNC_FINISH)
                launches = [(step, host_t1) for step, _, host_t1 in self._waiting]
                self._waiting.clear()
                last = self._last_step_end
                if last is not None and (self._intervals.prev_step is None or last[0] > max(
                        [self._intervals.prev_step, *(step for step, _ in launches)])):
                    launches.append(last)
                for step, host_t1 in launches:
                    if self._closed or not self._wait_in_flight(deadline):
                        break
                    self._launch(step, host_t1)
                while wait and self._in_flight and not self._closed:
                    if not self._wait_in_flight(deadline):
                        break
                    self._complete()
                if wait and self._in_flight:
                    self._warn("close", f"the last log intervals were abandoned: the other ranks did not "
                               f"join their gather within {timeout:g} s")
                    self._in_flight.clear()
                if self._sending and not self._wait_sent(deadline):
                    self._warn("close", f"rank 0's last live broadcasts were not received within {timeout:g} s")
                self._sending.clear()
            finally:
                self._closed = True
                self._detach()
                self._final()

    def _goodput_at(self, t: int) -> tuple[float | None, int]:
        """(goodput, productive ns) of this attempt at ``t``: the partition rules'
        (live/goodput.py), less what rollbacks took back (live/rewinds.py)."""
        taken = max(0, self._reported_productive_ns - self._productive_ns)
        productive = max(0, self.attempt_goodput.productive(t) - taken)
        # the two estimates of a log interval differ by a little: the figure only goes down at a rollback
        if self._rewound.rewinds == self._shown[1]:
            productive = max(productive, self._shown[0])
        self._shown = (productive, self._rewound.rewinds)
        elapsed = t - self._process_start_ns
        return (min(1.0, productive / elapsed) if elapsed > 0 else None), productive

    def _final(self) -> None:
        """This attempt's goodput at finish (the report's figure for a one-attempt job)."""
        clock: Callable[[], int] = getattr(self.recorder, "clock", time.perf_counter_ns)
        self.final_goodput = self._goodput_at(clock())[0]
        if self.transport.rank == 0 and self.final_goodput is not None:
            self.printer(f"goodtrace: finished: {format_goodput(self.final_goodput, self._rank)}")

    @staticmethod
    def _poll_until(done: Callable[[], bool], deadline: float) -> bool:
        """Poll ``done`` (backing off from 1 ms to 50 ms) until it is true (True) or the deadline
        passes (False)."""
        pause = 0.001
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.05)
        return True

    def _wait_in_flight(self, deadline: float, *, every: bool = False) -> bool:
        """Poll the oldest gather in flight (``every``: all of them) until it is done (True) or
        the deadline passes."""
        return self._poll_until(lambda: not self._in_flight or (all(h.done() for _, h, _ in self._in_flight) if every
                                                        else self._in_flight[0][1].done()), deadline)

    def _wait_sent(self, deadline: float) -> bool:
        """Rank 0, rooted: poll the broadcasts and summaries in flight until all are done."""
        return self._poll_until(lambda: all(h.done() for h in self._sending), deadline)

    def _drain_rooted(self, deadline: float) -> bool:
        """Rank 0, rooted, at exit: as each gather in flight completes, send its broadcast (the
        other ranks launched theirs with their gather, and wait for it), without a line."""
        pause = 0.001
        while self._in_flight:
            if self._in_flight[0][1].done():
                interval, handle, _ = self._in_flight.popleft()
                try:
                    self._send_back(interval, handle.wait(), None)
                except Exception:
                    self._in_flight.clear()
                    return False
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.05)
        return self._wait_sent(deadline)

    def abandon(self, drain_s: float = DRAIN_S) -> None:
        """Stop without starting any collective (the process is exiting, perhaps after a crash).

        Gathers already launched are let finish for up to ``drain_s`` seconds (bounded by the
        recorder's ``finish_timeout_s``): the peers launch the same log intervals and complete them
        when they get there, and a process that exits with a gloo gather still in flight is
        aborted by the library at exit (SIGABRT instead of its own exit status)."""
        timeout = min(drain_s, float(getattr(getattr(self.recorder, "config", None), "finish_timeout_s", drain_s)))
        with self._lock:
            self._closed = True
            deadline = time.monotonic() + timeout
            if self._rooted and self.transport.rank == 0:
                drained = self._drain_rooted(deadline)
            else:
                drained = self._wait_in_flight(deadline, every=True)
            if not drained:
                self._warn("abandon", f"{len(self._in_flight)} live gather(s) still in flight at exit after "
                           f"{timeout:g} s: the other ranks did not reach them")
            self._in_flight.clear()
            self._sending.clear()
            self._detach()

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warn(message, stacklevel=3)



def _print(text: str) -> None:
    print(text, file=sys.stdout, flush=True)


def _process_start(recorder: Any) -> int:
    header = getattr(recorder, "_header_static", None)  # no public accessor yet
    if isinstance(header, dict) and isinstance(header.get(schema.H_PROC_START), int):
        return int(header[schema.H_PROC_START])
    clock: Callable[[], int] = getattr(recorder, "clock", time.perf_counter_ns)
    return clock()
