"""Live aggregation across ranks: one collective per log step, never waited on by the loop.

A :class:`LiveAggregator` listens to the recorder (metrics, sync points, step ends). Every
``log_every`` steps it packs everything this rank recorded in the window since the previous
log step — per metric: sum, sum of squares, min, max, count, last — into one fixed-size vector
and hands it to a :class:`Transport`, which gathers the vectors of all ranks asynchronously
(``torch.distributed`` on a separate gloo group, JAX multi-process utilities, or
:class:`LocalTransport` for one process). The window is launched once its values are observed
(``lag`` step ends after the log step) and completed when it is done, checked without waiting
at each step end; the loop only waits when the *next* window launches and the previous one is
still in flight (counted in ``blocking_waits``), or at ``finish()``. Rank 0 then reduces each
metric with its reduction and prints one line (step, loss, step time = train + overheads,
tokens/s, TFLOP/s, MFU, memory, goodput so far) and hands a :class:`LiveLine` to listeners.

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
from typing import Any, Protocol

from goodtrace import schema
from goodtrace.record.errors import warn
from goodtrace.record.liveline import LiveLine, MetricSummary, format_bytes, format_line

__all__ = [
    "GatherHandle",
    "LiveAggregator",
    "LiveLine",
    "LocalTransport",
    "MetricSummary",
    "Transport",
    "format_bytes",
]

_STATS = 6  # sum, sum of squares, min, max, count, last
# fingerprint, step, number of metrics, tokens, flops, peak flops, this rank's step time over the
# window, the window's end on the aligned clock (ns), this rank's host (a CRC of its name)
_HEADER = 9


class GatherHandle(Protocol):
    """An all-gather in flight."""

    def done(self) -> bool:
        """True when :meth:`wait` would return at once (never blocks)."""
        ...

    def wait(self) -> list[list[float]]:
        """One vector per rank, in rank order (blocks until the gather completes)."""
        ...


class Transport(Protocol):
    """Gathers one equally sized float vector from every rank, asynchronously."""

    rank: int
    world_size: int

    def all_gather(self, vector: list[float]) -> GatherHandle: ...


class _Done:
    def __init__(self, vectors: list[list[float]]) -> None:
        self._vectors = vectors

    def done(self) -> bool:
        return True

    def wait(self) -> list[list[float]]:
        return self._vectors


class LocalTransport:
    """One process, no collective: the gather is the vector itself."""

    rank = 0
    world_size = 1

    def all_gather(self, vector: list[float]) -> GatherHandle:
        return _Done([list(vector)])


@dataclasses.dataclass
class _Window:
    step: int
    steps: int
    start_ns: int
    end_ns: int
    timing: str
    overhead_ns: dict[str, int]
    names: list[tuple[str, str]]
    vector: list[float]



class LiveAggregator:
    """Reduce metrics across ranks every ``log_every`` steps; rank 0 prints one line each.

    ``tokens_per_step`` and ``flops_per_step`` are this rank's (summed over ranks);
    ``peak_flops`` is this rank's device peak (summed over ranks for MFU). Call :meth:`close`
    before ``finish()`` (the torch integration does it for you): it launches the last windows
    and waits for them.
    """

    def __init__(
        self,
        recorder: Any,
        transport: Transport,
        *,
        log_every: int = 10,
        tokens_per_step: float | None = None,
        flops_per_step: float | None = None,
        peak_flops: float | None = None,
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
        self.peak_flops = peak_flops
        self.max_metrics = max_metrics
        self.printer = printer if printer is not None else _print
        self.listeners: list[Callable[[LiveLine], None]] = []
        self.lines: list[LiveLine] = []
        self.blocking_waits = 0  # launches or closes that had to wait for a gather in flight
        self.completed_at: list[tuple[int, int, int]] = []  # (log step, launched at, completed at) end counts
        config = getattr(recorder, "config", None)
        self.lag = int(getattr(config, "lag", 1))
        clock: Callable[[], int] = getattr(recorder, "clock", time.perf_counter_ns)
        self._clock = clock
        self._overhead_categories = sorted(getattr(config, "all_overhead_categories", schema.OVERHEAD_CATEGORIES))
        self._lock = threading.RLock()
        self._values: dict[int, list[tuple[str, str, float]]] = collections.defaultdict(list)
        self._syncs: dict[int, int] = {}
        self._ends = 0
        self._first_t0: int | None = None
        self._first_step: int | None = None
        self._last_step_end: tuple[int, int] | None = None  # (step, host t1)
        self._waiting: collections.deque[tuple[int, int, int]] = collections.deque()  # (step, ready_at, t1)
        self._in_flight: collections.deque[tuple[_Window, GatherHandle, int]] = collections.deque()
        self._prev_step: int | None = None
        self._prev_end_ns: int | None = None
        self._overhead_spans: list[tuple[str, int, int]] = []
        self._productive_ns = 0
        self._process_start_ns = process_start_ns if process_start_ns is not None else _process_start(recorder)
        self._warned: set[str] = set()
        self._closed = False
        self._watch_overhead = watch_overhead
        self._overhead_total_ns: dict[str, int] = {}
        self._wall_minus_clock = time.time_ns() - clock()
        identity = getattr(recorder, "identity", None)
        self._rank = int(getattr(identity, "rank", transport.rank))
        self._host_id = float(zlib.crc32(str(getattr(identity, "host", "")).encode()))
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
            ("step_listeners", self._on_step_end),
        ]
        if self._watch_overhead:  # overhead spans, automatic ones (compile, gc) included
            hooks.append(("overhead_span_listeners", self.on_overhead_span))
        return hooks

    def _on_metric(self, name: str, step: int | None, value: float | None, reduce: str) -> None:
        if step is None or value is None:
            return
        with self._lock:
            self._values[step].append((name, reduce, value))

    def _on_sync(self, step: int | None, t: int, how: str) -> None:
        if step is not None:
            with self._lock:
                self._syncs[step] = t

    def on_overhead_span(self, category: str, t0: int, t1: int) -> None:
        """An overhead span ended (the recorder's overhead-span listener)."""
        with self._lock:
            self._overhead_spans.append((category, t0, t1))

    def _on_step_end(self, number: int, t0: int, t1: int) -> None:
        with self._lock:
            if self._closed:
                return
            self._ends += 1
            if self._first_t0 is None:
                self._first_t0 = t0
                self._first_step = number
            self._last_step_end = (number, t1)
            if number % self.log_every == 0:
                self._waiting.append((number, self._ends + self.lag, t1))
            while self._waiting and self._waiting[0][1] <= self._ends:
                step, _, host_t1 = self._waiting.popleft()
                self._launch(step, host_t1)
            self._poll()

    # ------------------------------------------------------------------ windows
    def _launch(self, step: int, host_t1: int) -> None:
        if self._in_flight:  # the previous window must be complete before the next one starts
            if not self._in_flight[0][1].done():
                self.blocking_waits += 1
            self._complete()
        window = self._pack(step, host_t1)
        if window is None:
            return
        try:
            handle = self.transport.all_gather(window.vector)
        except Exception as exc:
            self._warn("launch", f"live aggregation disabled: the gather failed to start: {exc!r}")
            self._closed = True
            return
        self._in_flight.append((window, handle, self._ends))

    def _poll(self) -> None:
        while self._in_flight and self._in_flight[0][1].done():
            self._complete()

    def _complete(self) -> None:
        window, handle, launched = self._in_flight.popleft()
        try:
            vectors = handle.wait()
        except Exception as exc:
            self._warn("wait", f"live aggregation disabled: the gather failed: {exc!r}")
            self._closed = True
            self._in_flight.clear()
            return
        self.completed_at.append((window.step, launched, self._ends))
        if self.transport.rank == 0 or getattr(self.recorder, "line_listeners", None):
            try:
                self._report(window, vectors)
            except Exception as exc:
                self._warn("report", f"live line for step {window.step} failed: {exc!r}")

    def _pack(self, step: int, host_t1: int) -> _Window | None:
        prev = self._prev_step
        steps_in = sorted(s for s in self._values if s <= step and (prev is None or s > prev))
        for stale in [s for s in self._values if s <= step]:
            if stale not in steps_in:
                del self._values[stale]
        syncs = [(s, t) for s, t in self._syncs.items() if s <= step and (prev is None or s > prev)]
        if syncs:
            end_ns, timing = max(syncs, key=lambda item: item[0])[1], "sync"
        else:
            end_ns, timing = host_t1, "host"
        for done in [s for s in self._syncs if s <= step]:
            del self._syncs[done]
        start_ns = self._prev_end_ns if self._prev_end_ns is not None else (self._first_t0 or end_ns)
        if prev is not None and step > prev:
            count = step - prev
        else:  # the first window: from the first step seen up to this one
            count = max(1, step - (self._first_step if self._first_step is not None else step) + 1)
        overhead = self._overhead_in(start_ns, end_ns)
        # per-metric stats of this rank over the window
        stats: dict[tuple[str, str], list[float]] = {}
        for s in steps_in:
            for name, reduce, value in self._values.pop(s):
                entry = stats.get((name, reduce))
                if entry is None:
                    stats[(name, reduce)] = [value, value * value, value, value, 1.0, value]
                else:
                    entry[0] += value
                    entry[1] += value * value
                    entry[2] = min(entry[2], value)
                    entry[3] = max(entry[3], value)
                    entry[4] += 1.0
                    entry[5] = value
        names = sorted(stats)
        if len(names) > self.max_metrics:
            self._warn("max_metrics", f"more than {self.max_metrics} metrics per log step: the live line "
                       "shows the first ones by name (all are recorded)")
            names = names[: self.max_metrics]
        fingerprint = zlib.crc32("\n".join(f"{n}:{r}" for n, r in names).encode())
        tokens = (self.tokens_per_step or 0.0) * count
        flops = (self.flops_per_step or 0.0) * count
        offset = getattr(self.recorder, "clock_offset_ns", None)  # to rank 0's clock, when measured
        aligned_end = end_ns + (offset if isinstance(offset, int) else self._wall_minus_clock)
        vector = [float(fingerprint), float(step), float(len(names)), tokens, flops, float(self.peak_flops or 0.0),
                  (end_ns - start_ns) / 1e9 / count, float(aligned_end), self._host_id]
        for key in names:
            vector.extend(stats[key])
        vector.extend([0.0] * (_HEADER + _STATS * self.max_metrics - len(vector)))
        self._prev_step = step
        self._prev_end_ns = end_ns
        return _Window(step, count, start_ns, end_ns, timing, overhead, names, vector)

    def _overhead_in(self, start: int, end: int) -> dict[str, int]:
        """Overhead time per category inside (start, end]; nested spans counted once."""
        spans = sorted(self._overhead_spans, key=lambda s: (s[1], -s[2]))
        result: dict[str, int] = {}
        covered_until = start
        for category, t0, t1 in spans:
            lo, hi = max(t0, covered_until), min(t1, end)
            if hi > lo:
                result[category] = result.get(category, 0) + hi - lo
                covered_until = hi
        self._overhead_spans = [s for s in self._overhead_spans if s[2] > end]
        return result

    # ------------------------------------------------------------------ rank 0
    def _report(self, window: _Window, vectors: Sequence[Sequence[float]]) -> None:
        own = window.vector
        merged: dict[tuple[str, str], list[float]] = {}
        ranks = 0
        tokens = flops = peak = 0.0
        for vector in vectors:
            if len(vector) != len(own) or vector[0] != own[0]:
                self._warn("layout", "ranks recorded different metric names in a log window; the live "
                           "line reduces only the ranks that match rank 0")
                continue
            ranks += 1
            tokens += vector[3]
            flops += vector[4]
            peak += vector[5]
            for index, key in enumerate(window.names):
                base = _HEADER + _STATS * index
                s, sq, lo, hi, n, last = (float(x) for x in vector[base: base + _STATS])
                entry = merged.get(key)
                if entry is None:
                    merged[key] = [s, sq, lo, hi, n, last]
                else:
                    entry[0] += s
                    entry[1] += sq
                    entry[2] = min(entry[2], lo)
                    entry[3] = max(entry[3], hi)
                    entry[4] += n
                    entry[5] = last  # "last": the highest rank's last value
        metrics: dict[str, MetricSummary] = {}
        for (name, reduce), (s, sq, lo, hi, n, last) in merged.items():
            if n <= 0:
                continue
            mean = s / n
            variance = max(0.0, sq / n - mean * mean)
            metrics[name] = MetricSummary(name, reduce, int(n), s, mean, lo, hi, math.sqrt(variance), last)
        window_ns = window.end_ns - window.start_ns
        seconds = window_ns / 1e9 if window_ns > 0 else None
        overhead_total = sum(window.overhead_ns.values())
        if window_ns > 0:
            self._productive_ns += max(0, window_ns - overhead_total)
        for category, ns in window.overhead_ns.items():
            self._overhead_total_ns[category] = self._overhead_total_ns.get(category, 0) + ns
        per_rank = [v for v in vectors if len(v) >= _HEADER]
        ends = [float(v[7]) for v in per_rank]
        lateness = tuple(max(0.0, (end - min(ends)) / 1e9) for end in ends)
        step_time = seconds / window.steps if seconds else None
        train = max(0.0, (window_ns - overhead_total) / 1e9 / window.steps) if seconds else None
        overhead = {c: ns / 1e9 / window.steps for c, ns in sorted(window.overhead_ns.items())}
        tokens_per_s = tokens / seconds if seconds and tokens else None
        tflops = flops / seconds / 1e12 if seconds and flops else None
        mfu = (flops / seconds) / peak if seconds and flops and peak else None
        elapsed = window.end_ns - self._process_start_ns
        goodput = self._productive_ns / elapsed if elapsed > 0 else None
        line = LiveLine(
            step=window.step, steps=window.steps, ranks=ranks, step_time_s=step_time, train_s=train,
            overhead_s=overhead, metrics=metrics, tokens_per_s=tokens_per_s, tflops_per_s=tflops, mfu=mfu,
            goodput=min(goodput, 1.0) if goodput is not None else None, timing=window.timing, text="",
            elapsed_s=elapsed / 1e9 if elapsed > 0 else None, productive_s=self._productive_ns / 1e9,
            overhead_total_s={c: ns / 1e9 for c, ns in sorted(self._overhead_total_ns.items())},
            wall_ns=window.end_ns + self._wall_minus_clock, first_step=self._first_step, rank=self._rank,
            rank_step_s=tuple(float(v[6]) for v in per_rank), rank_lateness_s=lateness,
            slowest_rank=max(range(len(lateness)), key=lateness.__getitem__) if len(lateness) > 1 else None,
            host_ranks=tuple(i for i, v in enumerate(per_rank) if v[8] == self._host_id),
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
    def close(self, wait: bool = True) -> None:
        """Launch the windows still waiting (and a last partial one), then complete them all.

        Every rank must call this (it is collective), normally through ``finish()``.
        """
        with self._lock:
            if self._closed:
                self._detach()
                return
            try:
                settle = getattr(self.recorder, "settle", None)
                if settle is not None:
                    settle(schema.SYNC_FINISH)
                while self._waiting:
                    step, _, host_t1 = self._waiting.popleft()
                    self._launch(step, host_t1)
                last = self._last_step_end
                if not self._closed and last is not None and (self._prev_step is None or last[0] > self._prev_step):
                    self._launch(last[0], last[1])
                while wait and self._in_flight:
                    self._complete()
            finally:
                self._closed = True
                self._detach()

    def abandon(self) -> None:
        """Stop without any collective (the process is exiting, perhaps after a crash)."""
        with self._lock:
            self._closed = True
            self._in_flight.clear()
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
