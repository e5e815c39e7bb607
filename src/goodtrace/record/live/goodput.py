"""This attempt's goodput on this rank while it runs, by the report's partition rules
(docs/semantics.md sections 3 and 9), computed incrementally from the recorder's listeners.

The report's rules, for one process: its time from the process start is startup until the first
step's entry, then step intervals ending at sync points (at step exits when there are none),
then the tail. In the intervals, the training thread's overhead and ``data`` spans (the
outermost wins) are not productive where the device had run out of queued work: a span counts
from the sync point of the last execution that exited before it on (the host-overhead rule,
3.4; a blocking span settles first, so it counts whole), nor is the first interval's excess
over the ideal step beyond noise (``warmup``). So the last figure, taken at ``finish()``, is the
report's goodput of a one-attempt job from rank 0's timeline (with CUDA device timing the
report charges data loading by the measured device-idle gap, which the live figure does not
see). Standard library only; the training thread pays a few list appends per step.
"""

from __future__ import annotations

import statistics
import threading
from array import array
from collections import deque
from collections.abc import Callable, Iterable

from goodtrace import schema

__all__ = ["AttemptGoodput"]

MAX_STEADY = 100_000  # per-step productive times kept for the ideal step (the first ones)
FREEZE_AFTER = 20  # steady intervals after which the warm-up is held (the live figure then only
# moves with the job; the report's ideal step, from every interval, differs from it by noise)
RECENT_EXECUTIONS = 256  # executions kept to find the device's busy bound of a span that closes late


def _covered(spans: Iterable[tuple[str, int, int]], start: int, end: int) -> dict[str, int]:
    """Time per category of ``spans`` inside (start, end], nested and overlapping spans counted
    once, for the span that began first (the outermost); data loading only where no other
    overhead span is."""
    result: dict[str, int] = {}
    covered_until = start
    data: list[tuple[int, int]] = []
    others: list[tuple[int, int]] = []  # the other spans' covered pieces, disjoint and in order
    for category, t0, t1 in sorted(spans, key=lambda s: (s[1], -s[2])):
        if category == schema.DATA:
            data.append((max(t0, start), min(t1, end)))
            continue
        lo, hi = max(t0, covered_until), min(t1, end)
        if hi > lo:
            result[category] = result.get(category, 0) + hi - lo
            covered_until = hi
            others.append((lo, hi))
    if data:
        merged = _union(data)
        total = sum(b - a for a, b in merged)
        if others:
            total -= sum(max(0, min(b, d) - max(a, c)) for a, b in merged for c, d in others)
        if total:
            result[schema.DATA] = total
    return result


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


class AttemptGoodput:
    """Feed it through :meth:`hooks` (the recorder's step, sync and span listeners) and ask
    :meth:`goodput` at any instant of the recorder's clock."""

    def __init__(self, process_start_ns: int, blocking: frozenset[str] = schema.BLOCKING_CATEGORIES) -> None:
        self.process_start_ns = process_start_ns
        self.blocking = blocking
        self.training_thread: int | None = None
        self._lock = threading.RLock()  # re-entered: a gc pause inside it is a span that comes back here
        self.first_entry: int | None = None
        self.last_interval_end: int | None = None  # the latest interval's end (a sync point, or an exit)
        self._has_syncs = False
        self._last_exit: int | None = None
        self._spans: list[tuple[str, int, int]] = []  # training-thread overhead and data spans
        # the recent executions: [step, entry, exit or None, sync point or None], in entry order
        self._executions: deque[list[int | None]] = deque(maxlen=RECENT_EXECUTIONS)
        # closed intervals: (start, end, steps in it) not yet final (spans may still come) ...
        self._open: list[tuple[int, int, int]] = []
        self._steps_since = 0  # executions entered since the last interval's end
        # ... and the finished ones' sums
        self.productive_ns = 0
        self.overhead_ns: dict[str, int] = {}
        self._first: tuple[int, int] | None = None  # the first interval: productive, steps
        self._steady = array("q")  # per-step productive time of later intervals
        self._steady_steps = array("q")
        self._frozen_warmup: int | None = None

    # ------------------------------------------------------------------ listeners
    def hooks(self) -> list[tuple[str, Callable[..., None]]]:
        """(recorder listener list, listener) pairs that feed this figure."""
        return [("step_begin_listeners", self.on_step_begin), ("step_listeners", self.on_step_end),
                ("sync_listeners", self.on_sync), ("overhead_span_listeners", self.on_span)]

    def on_step_begin(self, step: int, t0: int, thread: int | None = None) -> None:
        with self._lock:
            if self.training_thread is None:
                self.training_thread = threading.get_ident() if thread is None else thread
            if self.first_entry is None:
                self.first_entry = t0
            self._executions.append([step, t0, None, None])
            self._steps_since += 1

    def on_step_end(self, step: int, t0: int, t1: int) -> None:
        with self._lock:
            self._last_exit = t1
            for execution in reversed(self._executions):
                if execution[0] == step and execution[2] is None:
                    execution[2] = t1
                    break
            if not self._has_syncs:  # host-timed so far: the exit ends the interval
                self._close_interval(t1)

    def on_sync(self, step: int | None, t: int, how: str) -> None:
        with self._lock:
            if not self._has_syncs:  # the intervals so far were host-timed guesses: start over
                self._has_syncs = True
                self._reset_intervals()
            if step is not None:
                for execution in reversed(self._executions):
                    if execution[0] == step and execution[3] is None:
                        execution[3] = t
                        break
            if self.last_interval_end is None or t > self.last_interval_end or (
                    t == self.last_interval_end and self._steps_since):  # a tie: a zero-length interval
                self._close_interval(t)

    def on_span(self, category: str, t0: int, t1: int, thread: int | None = None) -> None:
        """An overhead or data span ended, on ``thread`` (default: the calling thread)."""
        if (threading.get_ident() if thread is None else thread) != self.training_thread:
            return  # only the training thread's time is partitioned
        with self._lock:
            self._spans.append((category, t0, t1))

    def busy_until(self, t: int) -> int | None:
        """Until when the device had work of the loop dispatched before host instant ``t``: the
        sync point of the last execution that exited before ``t`` (the report's rule,
        ``goodtrace.analysis.overhead.busy_until``); None where none is known."""
        with self._lock:
            return self._busy_until(t)

    def _busy_until(self, t: int) -> int | None:
        executions = self._executions
        k = len(executions) - 1
        while k >= 0 and executions[k][1] > t:  # type: ignore[operator]
            k -= 1
        if k >= 0 and not (executions[k][2] is not None and t > executions[k][2]):  # type: ignore[operator]
            k -= 1  # the span began inside this execution: it may not have dispatched yet
        while k >= 0:
            sync = executions[k][3]
            if sync is not None:
                return sync
            k -= 1
        return None

    # ------------------------------------------------------------------ intervals
    def _reset_intervals(self) -> None:
        self._frozen_warmup = None
        self.last_interval_end = None
        self._open.clear()
        self.productive_ns = 0
        self.overhead_ns = {}
        self._first = None
        for column in (self._steady, self._steady_steps):
            del column[:]

    def _close_interval(self, end: int) -> None:
        start = self.last_interval_end if self.last_interval_end is not None else self.first_entry
        if start is None or end < start or (end == start and self.last_interval_end is None):
            return
        self._open.append((start, end, max(1, self._steps_since)))
        self._steps_since = 0
        self.last_interval_end = end
        # an interval is final once a later one closed: the spans in it have ended by then
        while len(self._open) > 1:
            self._finish(self._open.pop(0))

    def _split(self, interval: tuple[int, int, int]) -> tuple[int, dict[str, int]]:
        """(productive, overhead by category) of one interval, each span counted from where the
        device had run out of queued work (a blocking span whole: it settled first)."""
        start, end, _ = interval
        spans = []
        for category, t0, t1 in self._spans:
            if t1 <= start or t0 >= end:
                continue
            if category not in self.blocking:
                bound = self._busy_until(t0)
                t0 = t0 if bound is None else max(t0, bound)
            if t1 > t0:
                spans.append((category, t0, t1))
        covered = _covered(spans, start, end)
        return end - start - sum(covered.values()), covered

    def _finish(self, interval: tuple[int, int, int]) -> None:
        productive, covered = self._split(interval)
        steps = interval[2]
        self.productive_ns += productive
        for category, ns in covered.items():
            self.overhead_ns[category] = self.overhead_ns.get(category, 0) + ns
        if self._first is None:
            self._first = (productive, steps)
        elif len(self._steady) < MAX_STEADY:
            self._steady.append(productive // steps)
            self._steady_steps.append(steps)
        end = interval[1]
        self._spans = [s for s in self._spans if s[2] > end]

    # ------------------------------------------------------------------ the figure
    def productive(self, now: int) -> int:
        """Productive ns of this attempt up to ``now`` (the report's rules)."""
        with self._lock:
            if not self._has_syncs and self._last_exit is not None and (
                    self.last_interval_end is None or self._last_exit > self.last_interval_end):
                self._close_interval(self._last_exit)
            productive = self.productive_ns
            first = self._first
            pending = [self._split(i) for i in self._open]
            if first is None and pending:
                first = (pending[0][0], self._open[0][2])
            steady = [(p // s, s) for (p, _), (_, _, s) in zip(pending, self._open, strict=True)]
            steady = steady[1:] if self._first is None else steady
            productive += sum(p for p, _ in pending)
            frozen = self._frozen_warmup
            values = [] if frozen is not None else list(zip(self._steady, self._steady_steps, strict=True)) + steady
        if frozen is not None:  # (no list of every interval per line once it is held)
            return productive - frozen
        warmup = self._warmup(first, values)
        if len(values) >= FREEZE_AFTER:  # known well enough: the figure no longer moves with it
            self._frozen_warmup = warmup
        return productive - warmup

    @staticmethod
    def _warmup(first: tuple[int, int] | None, values: list[tuple[int, int]]) -> int:
        """The first interval's productive time above the ideal step, when beyond noise: the
        median productive time per step of the later intervals (weighted by steps), noise
        max(5 x 1.4826 x MAD, 5% of the median)."""
        if first is None:
            return 0
        kept = [(v, s) for v, s in values if v > 0]
        productive, steps = first
        if kept:
            weighted = sorted(v for v, s in kept for _ in range(s)) if any(s > 1 for _, s in kept) else sorted(
                v for v, _ in kept)
            ideal = statistics.median(weighted)
            plain = [v for v, _ in kept]
            if len(plain) < 3:
                noise = 0.05 * statistics.median(plain)
            else:
                centre = statistics.median(plain)
                noise = max(5 * 1.4826 * statistics.median([abs(v - centre) for v in plain]), 0.05 * centre)
        else:  # only the first interval: it is its own ideal
            ideal, noise = productive / steps, 0.05 * productive / steps
        excess = productive - round(ideal * steps)
        return excess if excess > noise * steps and excess > 0 else 0

    def goodput(self, now: int) -> float | None:
        """Productive time / time since the process started, at ``now``."""
        elapsed = now - self.process_start_ns
        return min(1.0, max(0.0, self.productive(now) / elapsed)) if elapsed > 0 else None
