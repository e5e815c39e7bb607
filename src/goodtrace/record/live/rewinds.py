"""The live line's share of a rollback: productive time that a rewind inside this process threw
away leaves the live goodput when the rewind happens (the report's rule is the analysis's,
docs/semantics.md section 1.8; this is its running estimate on one rank).

A rewind is ``gt.event("rollback", to_step=N)``, or a step number lower than the one before
(unless such an event explains it: the step right after the event runs above N). The work
thrown away is the time from step N's completion to the last step completed before the rewind;
every log interval is kept in proportion to the part of it outside such times, log intervals reported
before the rewind and after it alike, and overlapping rewinds count the same time once. The
recovery (from that last completion to the rewind, outside overhead spans) is no step's work
either: it is taken from the log intervals reported next.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

__all__ = ["RewoundTime"]


class RewoundTime:
    """Thrown-away time of one process, and how much of each log interval it takes back."""

    def __init__(self, overhead_in: Callable[[int, int], int], max_steps: int = 100_000,
                 max_intervals: int = 100_000) -> None:
        self._overhead_in = overhead_in  # overhead ns inside (a, b]: the rest of a recovery is no work
        self._debt = 0  # recovery ns still to take from the log intervals reported next
        self._done: collections.OrderedDict[int, int] = collections.OrderedDict()  # step -> its latest end
        self._max_steps = max_steps
        self._last_end: int | None = None  # the latest step completion seen
        self._first_t0: int | None = None
        self._high: int | None = None  # the highest step since the last rewind
        self._said: int | None = None  # a rollback event's to_step: the next step above it is no rewind
        self.dead: list[tuple[int, int]] = []  # thrown-away times, disjoint, in order
        # start, end, productive, kept, recovery taken from it
        self._intervals: collections.deque[list[int]] = collections.deque(maxlen=max_intervals)
        self.rewinds = 0
        self.resumed_at: int | None = None  # the first step run after the latest rewind

    def step_began(self, step: int, t0: int) -> int:
        """A step execution began; the change to the productive total (ns) when it rewinds."""
        change = 0
        if self._first_t0 is None:
            self._first_t0 = t0
        said, self._said = self._said, None
        if said is not None and step > said:  # the rollback event explains this step
            self._high = self.resumed_at = step
        elif self._high is not None and step < self._high:
            change = self._rewind(step - 1, t0)
            self._high = self.resumed_at = step
        else:
            self._high = step if self._high is None else max(self._high, step)
        return change

    def step_ended(self, step: int, t1: int) -> None:
        """A step execution ended (host exit ``t1``)."""
        self._mark(step, t1)

    def step_synced(self, step: int, t: int) -> None:
        """When a step's value became ready: a better end than its host exit."""
        if step in self._done:
            self._mark(step, t)

    def rollback(self, to_step: int, t: int) -> int:
        """``gt.event("rollback", to_step=...)`` at ``t``; the change to the productive total (ns)."""
        change = self._rewind(to_step, t)
        self._said = to_step
        return change

    def kept(self, start: int, end: int, productive: int) -> int:
        """The part of a new log interval's productive time that counts (the rest was thrown away)."""
        kept = self._keep(start, end, productive)
        taken = min(kept, self._debt)
        self._debt -= taken
        self._intervals.append([start, end, productive, kept - taken, taken])
        return kept - taken

    # ------------------------------------------------------------------ internals
    def _mark(self, step: int, t: int) -> None:
        self._done[step] = t
        self._done.move_to_end(step)
        if len(self._done) > self._max_steps:
            self._done.popitem(last=False)
        self._last_end = t if self._last_end is None else max(self._last_end, t)

    def _restored_at(self, to_step: int) -> int | None:
        """When the restored step had completed: its latest execution's, else the highest step
        below it that ran; the first step's start when every step this process ran is above it."""
        if to_step in self._done:
            return self._done[to_step]
        below = [(step, t) for step, t in self._done.items() if step < to_step]
        if below:
            return max(below)[1]
        return self._first_t0

    def _rewind(self, to_step: int, t: int) -> int:
        self.rewinds += 1
        start, end = self._restored_at(to_step), self._last_end
        if end is not None and t > end:
            self._debt += max(0, t - end - self._overhead_in(end, t))
        if start is None or end is None or end <= start:
            return 0
        self.dead = _union(self.dead, (start, end))
        change = 0
        for interval in self._intervals:
            if interval[1] > start and interval[0] < end:
                kept = max(0, self._keep(interval[0], interval[1], interval[2]) - interval[4])
                change += kept - interval[3]
                interval[3] = kept
        return change

    def _keep(self, start: int, end: int, productive: int) -> int:
        if end <= start or not self.dead:
            return productive
        overlap = sum(max(0, min(end, b) - max(start, a)) for a, b in self.dead)
        return productive - productive * min(overlap, end - start) // (end - start)


def _union(intervals: list[tuple[int, int]], new: tuple[int, int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted([*intervals, new]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
