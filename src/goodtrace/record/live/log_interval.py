"""One rank's log intervals: what it recorded since the previous log step, ready to be packed.

A :class:`LogIntervals` keeps the metric values, sync points and overhead spans the recorder
reports, and at each log step closes the interval since the previous one: its steps, its ends
(the latest sync point in it, else the log step's host exit), its overhead per category (nested
spans counted once) and per metric this rank's sum, sum of squares, min, max, count and last
value. A value that arrives after its interval was closed counts in the next one.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable

__all__ = ["LogInterval", "LogIntervals"]


@dataclasses.dataclass
class LogInterval:
    """One closed log interval of this rank (``vector`` is filled in by the aggregator)."""

    step: int  # the log step that closes it
    steps: int
    start_ns: int
    end_ns: int
    timing: str  # "sync": it ends at a sync point; "host": at the log step's host exit
    overhead_ns: dict[str, int]
    stats: dict[str, list[float]]  # metric -> sum, sum of squares, min, max, count, last
    reductions: dict[str, str]  # metric -> its reduction (the first one recorded)
    vector: list[float] = dataclasses.field(default_factory=list)


class LogIntervals:
    """The values, sync points and overhead spans not yet in a closed interval."""

    def __init__(self, warn: Callable[[str, str], None], busy_until: Callable[[int], int | None] | None = None,
                 blocking: frozenset[str] = frozenset()) -> None:
        self._warn = warn
        # the host-overhead rule (docs/semantics.md 3.4): until when the device had queued work at
        # a span's start (AttemptGoodput.busy_until); a span counts from there on, a blocking one whole
        self._busy_until = busy_until
        self._blocking = blocking
        self._values: dict[int, list[tuple[str, str, float]]] = collections.defaultdict(list)
        self._syncs: dict[int, int] = {}
        self._overhead_spans: list[tuple[str, int, int]] = []
        self.prev_step: int | None = None  # the log step that closed the previous interval
        self.prev_end_ns: int | None = None

    def add_value(self, name: str, step: int, value: float, reduce: str) -> None:
        self._values[step].append((name, reduce, value))

    def add_sync(self, step: int, t: int) -> None:
        self._syncs[step] = t

    def add_overhead(self, category: str, t0: int, t1: int) -> None:
        self._overhead_spans.append((category, t0, t1))

    def close(self, step: int, host_t1: int, first_t0: int | None, first_step: int | None,
              resumed_at: int | None) -> LogInterval:
        """The interval closed by log step ``step`` (``host_t1``: its host exit; ``first_t0``,
        ``first_step``: the first step this rank saw; ``resumed_at``: the step a rollback
        resumed at, if any)."""
        prev = self.prev_step
        # Every value recorded up to this log step that no interval has carried yet, those of
        # earlier steps that arrived late (a device time resolved after its interval) included.
        steps_in = sorted(s for s in self._values if s <= step)
        syncs = [(s, t) for s, t in self._syncs.items() if s <= step and (prev is None or s > prev)]
        if syncs:
            end_ns, timing = max(syncs, key=lambda item: item[0])[1], "sync"
        else:
            end_ns, timing = host_t1, "host"
        for done in [s for s in self._syncs if s <= step]:
            del self._syncs[done]
        start_ns = self.prev_end_ns if self.prev_end_ns is not None else (first_t0 or end_ns)
        if prev is not None and step > prev:
            count = step - prev
        elif prev is not None and resumed_at is not None:  # the first interval after a rollback
            count = max(1, step - resumed_at + 1)
        else:  # the first interval: from the first step seen up to this one
            count = max(1, step - (first_step if first_step is not None else step) + 1)
        overhead = self.overhead_in(start_ns, end_ns)
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
        self.prev_step = step
        self.prev_end_ns = end_ns
        return LogInterval(step, count, start_ns, end_ns, timing, overhead, stats, reductions)

    def overhead_in(self, start: int, end: int, *, prune: bool = True) -> dict[str, int]:
        """Overhead time per category inside (start, end]; nested spans counted once (``prune``:
        the spans that end by ``end`` are dropped, no later interval needs them)."""
        spans = sorted(self._clipped(), key=lambda s: (s[1], -s[2]))
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

    def _clipped(self) -> list[tuple[str, int, int]]:
        if self._busy_until is None:
            return self._overhead_spans
        out = []
        for category, t0, t1 in self._overhead_spans:
            if category not in self._blocking:
                bound = self._busy_until(t0)
                t0 = t0 if bound is None else max(t0, bound)
            if t1 > t0:
                out.append((category, t0, t1))
        return out
