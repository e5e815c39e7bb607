"""Live aggregation across ranks: one collective per log step, never waited on by the loop.

A :class:`LiveAggregator` listens to the recorder (metrics, sync points, step ends). Every
``log_every`` steps it packs everything this rank recorded in the window since the previous
log step — per metric: sum, sum of squares, min, max, count, last — into one fixed-size vector
and hands it to a :class:`Transport`, which gathers the vectors of all ranks asynchronously
(``torch.distributed`` on a separate gloo group, JAX multi-process utilities, or
:class:`LocalTransport` for one process). Metric slots are agreed across ranks without any
exchange: a metric's slot is a 48-bit hash of its name, the same on every rank, written beside
its statistics; a name itself travels once, in the first window in which a rank records it.
So ranks need not record the same metrics (a learning rate only on rank 0, a loss only on the
last pipeline stage, a device time that resolves a window late): a rank without a value
contributes a count of zero, and every rank's tokens and FLOPs are counted. The window is
launched once its values are observed (``lag`` step ends after the log step) and completed
when it is done, checked without waiting at each step end; the loop only waits when the
*next* window launches and the previous one is still in flight (counted in
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
from typing import Any

from goodtrace import schema
from goodtrace.record.errors import warn
from goodtrace.record.live.goodput import AttemptGoodput
from goodtrace.record.live.line import LiveLine, MetricSummary, format_bytes, format_goodput, format_line
from goodtrace.record.live.names import NAME_FLOATS, MetricNames
from goodtrace.record.live.rewinds import RewoundTime
from goodtrace.record.live.slowdown import FIELDS as SLOW_FIELDS
from goodtrace.record.live.slowdown import LiveSlowdown, SlowdownTracker, judge_window
from goodtrace.record.live.transport import GatherHandle, LocalTransport, Transport

__all__ = [
    "GatherHandle",
    "LiveAggregator",
    "LiveLine",
    "LocalTransport",
    "MetricSummary",
    "Transport",
    "format_bytes",
]

# One rank's vector: a header, then max_metrics entries, then a region for names. All values
# are integers below 2**53 or floats, so float64 transports carry them exactly.
_LAYOUT = 3.0  # changes whenever the layout below does
# The header: layout, step, number of entries, tokens, flops, peak flops, floats of names, this
# rank's step time over the window, the window's end on the aligned clock (ns), this rank's host
# (a CRC of its name), its host's name slot, then its slowdown fields (live/slowdown.py).
(_H_LAYOUT, _H_STEP, _H_ENTRIES, _H_TOKENS, _H_FLOPS, _H_PEAK, _H_NAME_FLOATS, _H_STEP_S, _H_ALIGNED_END,
 _H_HOST, _H_HOST_SLOT, _H_SLOW) = range(12)
_HEADER = _H_SLOW + SLOW_FIELDS
_ENTRY = 8  # slot, reduction, sum, sum of squares, min, max, count, last
_REDUCTIONS = ("mean", "sum", "min", "max", "std", "last")  # codes in the entries
DRAIN_S = 5.0  # at a local ending: how long gathers already launched may take to finish


@dataclasses.dataclass
class _Window:
    step: int
    steps: int
    start_ns: int
    end_ns: int
    timing: str
    overhead_ns: dict[str, int]
    names: list[str]
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
        self._productive_ns = 0  # the windows' productive time, less what rollbacks took back
        self._window_productive_ns = 0  # ... before they took it: the difference is their share
        self._shown = (0, 0)  # the productive ns last shown, and the rollbacks seen by then
        # a rollback takes its thrown-away time and its recovery back (live.rewinds)
        self._rewound = RewoundTime(lambda a, b: sum(self._overhead_in(a, b, prune=False).values()))
        self._process_start_ns = process_start_ns if process_start_ns is not None else _process_start(recorder)
        # this attempt's goodput by the report's rules (record/live/goodput.py)
        self.attempt_goodput = AttemptGoodput(self._process_start_ns)
        self.final_goodput: float | None = None  # its value at finish (close)
        self._warned: set[str] = set()
        self._metric_names = MetricNames(self._warn)  # slots, and names learned from the gathers
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
            self._values[step].append((name, reduce, value))

    def _on_sync(self, step: int | None, t: int, how: str) -> None:
        if step is not None:
            with self._lock:
                self._syncs[step] = t
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
        if category == schema.DATA:  # in-step data loading: the goodput's data rule, not the split
            return
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
            self._rewound.step_ended(number, t1)
            if number % self.log_every == 0:
                self._waiting.append((number, self._ends + self.lag, t1))
            # A step whose body raised may be a crashing rank's last: no collective then (its
            # peers may never join it, and a gather in flight holds the process at exit). The
            # windows wait for the next step end, if there is one; windows go out in order, so
            # a late launch still meets the peers' gathers.
            while self._waiting and self._waiting[0][1] <= self._ends and sys.exc_info()[0] is None:
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
        try:
            size = len(window.vector)
            self._metric_names.learn([v for v in vectors if len(v) == size and v[_H_LAYOUT] == _LAYOUT],
                                     _HEADER + _ENTRY * self.max_metrics, _H_NAME_FLOATS)
        except Exception as exc:
            self._warn("names", f"metric names of a live window could not be read: {exc!r}")
        if self.transport.rank == 0 or getattr(self.recorder, "line_listeners", None):
            try:
                self._report(window, vectors)
            except Exception as exc:
                self._warn("report", f"live line for step {window.step} failed: {exc!r}")
        self.slowdown.choose(self._slow_fields(vectors, size))  # every rank alike: the next window's onsets

    @staticmethod
    def _slow_fields(vectors: Sequence[Sequence[float]], size: int) -> list[Sequence[float] | None]:
        return [v[_H_SLOW: _H_SLOW + SLOW_FIELDS] if len(v) == size and v[_H_LAYOUT] == _LAYOUT else None
                for v in vectors]

    def _pack(self, step: int, host_t1: int) -> _Window | None:
        prev = self._prev_step
        # Every value recorded up to this log step that no window has carried yet, those of
        # earlier steps that arrived late (a device time resolved after its window) included.
        steps_in = sorted(s for s in self._values if s <= step)
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
        elif prev is not None and self._rewound.resumed_at is not None:  # the first window after a rollback
            count = max(1, step - self._rewound.resumed_at + 1)
        else:  # the first window: from the first step seen up to this one
            count = max(1, step - (self._first_step if self._first_step is not None else step) + 1)
        overhead = self._overhead_in(start_ns, end_ns)
        # per-metric stats of this rank over the window
        stats: dict[str, list[float]] = {}
        reductions: dict[str, str] = {}
        for s in steps_in:
            for name, reduce, value in self._values.pop(s):
                entry = stats.get(name)
                if entry is None:
                    stats[name] = [value, value * value, value, value, 1.0, value]
                    reductions[name] = reduce
                    continue
                entry[0] += value
                entry[1] += value * value
                entry[2] = min(entry[2], value)
                entry[3] = max(entry[3], value)
                entry[4] += 1.0
                entry[5] = value
                if reduce != reductions[name]:
                    self._warn(f"reduce:{name}", f"metric {name!r} was recorded with reductions "
                               f"{reductions[name]!r} and {reduce!r}; the live line uses {reductions[name]!r}")
        names = sorted(stats)
        if len(names) > self.max_metrics:
            self._warn("max_metrics", f"more than {self.max_metrics} metrics per log step: the live line "
                       "shows the first ones by name (all are recorded)")
            names = names[: self.max_metrics]
        tokens = (self.tokens_per_step or 0.0) * count
        flops = (self.flops_per_step or 0.0) * count
        offset = getattr(self.recorder, "clock_offset_ns", None)  # to rank 0's clock, when measured
        aligned_end = end_ns + (offset if isinstance(offset, int) else self._wall_minus_clock)
        vector = [_LAYOUT, float(step), float(len(names)), tokens, flops, float(self.peak_flops or 0.0), 0.0,
                  (end_ns - start_ns) / 1e9 / count, float(aligned_end), self._host_id,
                  float(self._metric_names.slot(self._host)), *self.slowdown.fields()]
        for name in names:
            code = _REDUCTIONS.index(reductions[name]) if reductions[name] in _REDUCTIONS else 0
            vector.append(float(self._metric_names.slot(name)))
            vector.append(float(code))
            vector.extend(stats[name])
        vector.extend([0.0] * (_HEADER + _ENTRY * self.max_metrics - len(vector)))
        announced = self._metric_names.announce([self._host, *names])  # the host's name travels once too
        vector[_H_NAME_FLOATS] = float(len(announced))
        vector.extend(announced)
        vector.extend([0.0] * (NAME_FLOATS - len(announced)))
        self._prev_step = step
        self._prev_end_ns = end_ns
        return _Window(step, count, start_ns, end_ns, timing, overhead, names, vector)

    def _overhead_in(self, start: int, end: int, *, prune: bool = True) -> dict[str, int]:
        """Overhead time per category inside (start, end]; nested spans counted once (``prune``:
        the spans that end by ``end`` are dropped, no later window needs them)."""
        spans = sorted(self._overhead_spans, key=lambda s: (s[1], -s[2]))
        result: dict[str, int] = {}
        covered_until = start
        for category, t0, t1 in spans:
            lo, hi = max(t0, covered_until), min(t1, end)
            if hi > lo:
                result[category] = result.get(category, 0) + hi - lo
                covered_until = hi
        if prune:
            self._overhead_spans = [s for s in self._overhead_spans if s[2] > end]
        return result

    # ------------------------------------------------------------------ rank 0
    def _report(self, window: _Window, vectors: Sequence[Sequence[float]]) -> None:
        size = len(window.vector)
        merged: dict[int, list[float]] = {}  # slot -> sum, sum of squares, min, max, count, last, ranks
        codes: dict[int, int] = {}  # slot -> reduction code of the lowest rank that has a value
        ranks = 0
        tokens = flops = peak = 0.0
        for rank, vector in enumerate(vectors):
            if len(vector) != size or vector[_H_LAYOUT] != _LAYOUT:
                self._warn("layout", f"rank {rank} sent a live vector of another layout (another goodtrace "
                           "version, or another max_metrics); the live line leaves that rank out")
                continue
            ranks += 1
            tokens += vector[_H_TOKENS]
            flops += vector[_H_FLOPS]
            peak += vector[_H_PEAK]
            for index in range(min(int(vector[_H_ENTRIES]), self.max_metrics)):
                base = _HEADER + _ENTRY * index
                slot_value, code_value, s, sq, lo, hi, n, last = vector[base: base + _ENTRY]
                if not n > 0:
                    continue  # no value on this rank: a count of zero, nothing else
                slot, code = int(slot_value), int(code_value)
                entry = merged.get(slot)
                if entry is None:
                    merged[slot] = [s, sq, lo, hi, n, last, 1.0]
                    codes[slot] = code
                    continue
                entry[0] += s
                entry[1] += sq
                entry[2] = min(entry[2], lo)
                entry[3] = max(entry[3], hi)
                entry[4] += n
                entry[5] = last  # "last": the highest rank's last value
                entry[6] += 1.0
                if code != codes[slot]:
                    self._warn(f"reduce-slot:{slot}", f"ranks reduce metric {self._metric_names.names.get(slot, slot)!r} "
                               "differently; the live line uses the lowest rank's reduction")
        metrics: dict[str, MetricSummary] = {}
        for slot, (s, sq, lo, hi, n, last, with_value) in merged.items():
            name = self._metric_names.names.get(slot, f"metric#{slot:012x}")
            reduce = _REDUCTIONS[codes[slot]] if 0 <= codes[slot] < len(_REDUCTIONS) else "mean"
            mean = s / n
            variance = max(0.0, sq / n - mean * mean)
            metrics[name] = MetricSummary(name, reduce, int(n), s, mean, lo, hi, math.sqrt(variance), last,
                                          int(with_value))
        window_ns = window.end_ns - window.start_ns
        seconds = window_ns / 1e9 if window_ns > 0 else None
        overhead_total = sum(window.overhead_ns.values())
        if window_ns > 0:
            self._productive_ns += self._rewound.kept(window.start_ns, window.end_ns, max(0, window_ns - overhead_total))
            self._window_productive_ns += max(0, window_ns - overhead_total)
        for category, ns in window.overhead_ns.items():
            self._overhead_total_ns[category] = self._overhead_total_ns.get(category, 0) + ns
        per_rank = [v for v in vectors if len(v) == size and v[_H_LAYOUT] == _LAYOUT]
        ends = [float(v[_H_ALIGNED_END]) for v in per_rank]
        lateness = tuple(max(0.0, (end - min(ends)) / 1e9) for end in ends)
        step_time = seconds / window.steps if seconds else None
        train = max(0.0, (window_ns - overhead_total) / 1e9 / window.steps) if seconds else None
        overhead = {c: ns / 1e9 / window.steps for c, ns in sorted(window.overhead_ns.items())}
        tokens_per_s = tokens / seconds if seconds and tokens else None
        tflops = flops / seconds / 1e12 if seconds and flops else None
        mfu = (flops / seconds) / peak if seconds and flops and peak else None
        elapsed = window.end_ns - self._process_start_ns
        goodput, productive_ns = self._goodput_at(window.end_ns)
        hosts = [v[_H_HOST_SLOT] if len(v) == size and v[_H_LAYOUT] == _LAYOUT else None for v in vectors]
        judge_window(self.slowdown.candidates, self._slow_fields(vectors, size),
                     lambda r: self._metric_names.names.get(int(hosts[r] or 0), "?"), self.slowdowns)
        line = LiveLine(
            step=window.step, steps=window.steps, ranks=ranks, step_time_s=step_time, train_s=train,
            overhead_s=overhead, metrics=metrics, tokens_per_s=tokens_per_s, tflops_per_s=tflops, mfu=mfu,
            goodput=goodput, timing=window.timing, text="",
            elapsed_s=elapsed / 1e9 if elapsed > 0 else None,
            productive_s=productive_ns / 1e9,
            overhead_total_s={c: ns / 1e9 for c, ns in sorted(self._overhead_total_ns.items())},
            wall_ns=window.end_ns + self._wall_minus_clock, first_step=self._first_step, rank=self._rank,
            rank_step_s=tuple(float(v[_H_STEP_S]) for v in per_rank), rank_lateness_s=lateness,
            slowest_rank=max(range(len(lateness)), key=lateness.__getitem__) if len(lateness) > 1 else None,
            host_ranks=tuple(i for i, v in enumerate(per_rank) if v[_H_HOST] == self._host_id),
            slowdowns=tuple(self.slowdowns[r] for r in sorted(self.slowdowns)),
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
        """Launch the windows still waiting (and a last partial one), then complete them all.

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
                if last is not None and (self._prev_step is None or last[0] > max(
                        [self._prev_step, *(step for step, _ in launches)])):
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
                    self._warn("close", f"the last live windows were abandoned: the other ranks did not "
                               f"join their gather within {timeout:g} s")
                    self._in_flight.clear()
            finally:
                self._closed = True
                self._detach()
                self._final()

    def _goodput_at(self, t: int) -> tuple[float | None, int]:
        """(goodput, productive ns) of this attempt at ``t``: the partition rules'
        (live/goodput.py), less what rollbacks took back (live/rewinds.py)."""
        taken = max(0, self._window_productive_ns - self._productive_ns)
        productive = max(0, self.attempt_goodput.productive(t) - taken)
        # the two estimates of a window differ by a little: the figure only goes down at a rollback
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

    def _wait_in_flight(self, deadline: float, *, every: bool = False) -> bool:
        """Poll the oldest gather in flight (``every``: all of them) until it is done (True) or
        the deadline passes."""
        pause = 0.001
        while self._in_flight and not (all(h.done() for _, h, _ in self._in_flight) if every
                                       else self._in_flight[0][1].done()):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.05)
        return True

    def abandon(self, drain_s: float = DRAIN_S) -> None:
        """Stop without starting any collective (the process is exiting, perhaps after a crash).

        Gathers already launched are let finish for up to ``drain_s`` seconds (bounded by the
        recorder's ``finish_timeout_s``): the peers launch the same windows and complete them
        when they get there, and a process that exits with a gloo gather still in flight is
        aborted by the library at exit (SIGABRT instead of its own exit status)."""
        timeout = min(drain_s, float(getattr(getattr(self.recorder, "config", None), "finish_timeout_s", drain_s)))
        with self._lock:
            self._closed = True
            if not self._wait_in_flight(time.monotonic() + timeout, every=True):
                self._warn("abandon", f"{len(self._in_flight)} live gather(s) still in flight at exit after "
                           f"{timeout:g} s: the other ranks did not reach them")
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
