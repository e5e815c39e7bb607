"""This attempt's goodput on this rank while it runs, by the report's partition rules
(docs/semantics.md sections 3 and 9), computed incrementally from the recorder's listeners.

The report's rules, for one process: its time from the process start is startup until the first
step's entry, then step intervals ending at sync points (at step exits when there are none),
then the tail. In the intervals, the training thread's overhead spans (the outermost wins) are
not productive, nor are its in-step ``data`` spans unless the loop runs ahead of the device
(the data rule: asynchronous when the host entered the next step before most steps were
ready), nor the first interval's excess over the ideal step beyond noise (``warmup``). So the
last figure, taken at ``finish()``, is the report's goodput of a one-attempt job from rank 0's
timeline. Standard library only; the training thread pays a few list appends per step.
"""

from __future__ import annotations

import statistics
import threading
from array import array
from collections.abc import Callable, Iterable

from goodtrace import schema

__all__ = ["AttemptGoodput"]

MAX_STEADY = 100_000  # per-step productive times kept for the ideal step (the first ones)
FREEZE_AFTER = 20  # steady intervals after which the warm-up is held (the live figure then only
# moves with the job; the report's ideal step, from every interval, differs from it by noise)


def _covered(spans: Iterable[tuple[str, int, int]], start: int, end: int) -> dict[str, int]:
    """Time per category of ``spans`` inside (start, end], nested and overlapping spans counted
    once, for the span that began first (the outermost)."""
    result: dict[str, int] = {}
    covered_until = start
    for category, t0, t1 in sorted(spans, key=lambda s: (s[1], -s[2])):
        lo, hi = max(t0, covered_until), min(t1, end)
        if hi > lo:
            result[category] = result.get(category, 0) + hi - lo
            covered_until = hi
    return result


class AttemptGoodput:
    """Feed it through :meth:`hooks` (the recorder's step, sync and span listeners) and ask
    :meth:`goodput` at any instant of the recorder's clock."""

    def __init__(self, process_start_ns: int) -> None:
        self.process_start_ns = process_start_ns
        self.training_thread: int | None = None
        self._lock = threading.RLock()  # re-entered: a gc pause inside it is a span that comes back here
        self.first_entry: int | None = None
        self.last_interval_end: int | None = None  # the latest interval's end (a sync point, or an exit)
        self._has_syncs = False
        self._last_exit: int | None = None
        self._spans: list[tuple[str, int, int]] = []  # training-thread overhead and data spans
        # closed intervals: (start, end, steps in it) not yet final (spans may still come) ...
        self._open: list[tuple[int, int, int]] = []
        self._steps_since = 0  # executions entered since the last interval's end
        # ... and the finished ones' sums: productive (data counted productive), in-step data
        self.productive_ns = 0
        self.data_ns = 0
        self.overhead_ns: dict[str, int] = {}
        self._first: tuple[int, int, int] | None = None  # the first interval: productive, data, steps
        self._steady = array("q")  # per-step productive time (data productive) of later intervals
        self._steady_data = array("q")  # ... and their in-step data per step
        self._steady_steps = array("q")
        # the data rule: did the host enter the next step before this one was ready?
        self._entries: dict[int, int] = {}  # step -> the next execution's entry, awaiting its sync
        self._syncs: dict[int, tuple[int, str]] = {}  # step -> its sync point and how, awaiting the next entry
        self._last_step: int | None = None
        self.ahead = 0
        self.behind = 0
        self._frozen_warmup: tuple[bool, int] | None = None  # (data rule it was for, warm-up ns)

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
            if self._last_step is not None:
                ready = self._syncs.pop(self._last_step, None)
                if ready is None:
                    self._entries[self._last_step] = t0  # compared when its sync point comes
                else:
                    self._count(t0, *ready)
            self._last_step = step
            self._steps_since += 1

    def on_step_end(self, step: int, t0: int, t1: int) -> None:
        with self._lock:
            self._last_exit = t1
            if not self._has_syncs:  # host-timed so far: the exit ends the interval
                self._close_interval(t1)

    def on_sync(self, step: int | None, t: int, how: str) -> None:
        with self._lock:
            if not self._has_syncs:  # the intervals so far were host-timed guesses: start over
                self._has_syncs = True
                self._reset_intervals()
            if step is not None:
                entry = self._entries.pop(step, None)
                if entry is not None:
                    self._count(entry, t, how)
                elif step == self._last_step:  # ready before the next step began
                    self._syncs[step] = (t, how)
            if self.last_interval_end is None or t > self.last_interval_end:
                self._close_interval(t)

    def _count(self, next_entry: int, ready: int, how: str) -> None:
        """One step for the data rule: the host entered the next step before it was ready? (On
        a tie, by how its sync point was taken: found complete when looked at later, as the
        report's rule, ``cut._data_rule``, counts it.)"""
        if next_entry < ready or (next_entry == ready and how in schema.SYNC_LOOKED_LATER):
            self.ahead += 1
        else:
            self.behind += 1

    def on_span(self, category: str, t0: int, t1: int, thread: int | None = None) -> None:
        """An overhead or data span ended, on ``thread`` (default: the calling thread)."""
        if (threading.get_ident() if thread is None else thread) != self.training_thread:
            return  # only the training thread's time is partitioned
        with self._lock:
            self._spans.append((category, t0, t1))

    # ------------------------------------------------------------------ intervals
    def _reset_intervals(self) -> None:
        self._frozen_warmup = None
        self.last_interval_end = None
        self._open.clear()
        self.productive_ns = self.data_ns = 0
        self.overhead_ns = {}
        self._first = None
        for column in (self._steady, self._steady_data, self._steady_steps):
            del column[:]

    def _close_interval(self, end: int) -> None:
        start = self.last_interval_end if self.last_interval_end is not None else self.first_entry
        if start is None or end <= start:
            return
        self._open.append((start, end, max(1, self._steps_since)))
        self._steps_since = 0
        self.last_interval_end = end
        # an interval is final once a later one closed: the spans in it have ended by then
        while len(self._open) > 1:
            self._finish(self._open.pop(0))

    def _split(self, interval: tuple[int, int, int]) -> tuple[int, int, dict[str, int]]:
        """(productive with in-step data counted productive, in-step data, overhead by
        category) of one interval."""
        start, end, _ = interval
        covered = _covered(self._spans, start, end)
        data = covered.pop(schema.DATA, 0)
        return end - start - sum(covered.values()), data, covered

    def _finish(self, interval: tuple[int, int, int]) -> None:
        productive, data, covered = self._split(interval)
        steps = interval[2]
        self.productive_ns += productive
        self.data_ns += data
        for category, ns in covered.items():
            self.overhead_ns[category] = self.overhead_ns.get(category, 0) + ns
        if self._first is None:
            self._first = (productive, data, steps)
        elif len(self._steady) < MAX_STEADY:
            self._steady.append(productive // steps)
            self._steady_data.append(data // steps)
            self._steady_steps.append(steps)
        end = interval[1]
        self._spans = [s for s in self._spans if s[2] > end]

    # ------------------------------------------------------------------ the figure
    @property
    def data_is_productive(self) -> bool:
        """The data rule: asynchronous (the loop ran ahead of the device) when the host entered
        the next step before most steps were ready; without sync points, not."""
        return self._has_syncs and self.ahead > self.behind

    def productive(self, now: int) -> int:
        """Productive ns of this attempt up to ``now`` (the report's rules)."""
        with self._lock:
            if not self._has_syncs and self._last_exit is not None and (
                    self.last_interval_end is None or self._last_exit > self.last_interval_end):
                self._close_interval(self._last_exit)
            productive, data = self.productive_ns, self.data_ns
            first = self._first
            pending = [self._split(i) for i in self._open]
            if first is None and pending:
                first = (pending[0][0], pending[0][1], self._open[0][2])
            steady = [(p // s, d // s, s) for (p, d, _), (_, _, s) in zip(pending, self._open, strict=True)]
            steady = steady[1:] if self._first is None else steady
            productive += sum(p for p, _, _ in pending)
            data += sum(d for _, d, _ in pending)
            with_data = self.data_is_productive
            frozen = self._frozen_warmup if self._frozen_warmup is not None and self._frozen_warmup[0] == with_data else None
            values = [] if frozen is not None else (
                list(zip(self._steady, self._steady_data, self._steady_steps, strict=True)) + steady)
        if not with_data:
            productive -= data
        if frozen is not None:  # (no list of every interval per line once it is held)
            return productive - frozen[1]
        warmup = self._warmup(first, values, with_data)
        if len(values) >= FREEZE_AFTER:  # known well enough: the figure no longer moves with it
            self._frozen_warmup = (with_data, warmup)
        return productive - warmup

    @staticmethod
    def _warmup(first: tuple[int, int, int] | None, values: list[tuple[int, int, int]], with_data: bool) -> int:
        """The first interval's productive time above the ideal step, when beyond noise: the
        median productive time per step of the later intervals (weighted by steps), noise
        max(5 x 1.4826 x MAD, 5% of the median)."""
        if first is None:
            return 0
        per_step = [p - (0 if with_data else d) for p, d, _ in values]
        kept = [(v, s) for v, (_, _, s) in zip(per_step, values, strict=True) if v > 0]
        productive = first[0] - (0 if with_data else first[1])
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
            ideal, noise = productive / first[2], 0.05 * productive / first[2]
        excess = productive - round(ideal * first[2])
        return excess if excess > noise * first[2] and excess > 0 else 0

    def goodput(self, now: int) -> float | None:
        """Productive time / time since the process started, at ``now``."""
        elapsed = now - self.process_start_ns
        return min(1.0, max(0.0, self.productive(now) / elapsed)) if elapsed > 0 else None
