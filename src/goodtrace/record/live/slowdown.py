"""A rank's slowdown on the live line (docs/semantics.md section 7.1): the report's change-point
rule (record/live/change_point.py), kept up to date on every rank over its recent steps, and
judged across ranks by rank 0 from the gathered vectors.

Each rank keeps its last ``HISTORY`` steps' busy time: the time inside the step (entry to exit,
host clock) less the overhead spans inside it (in-step data loading, checkpoints, gc...), the
compute the step did. At each log step it looks for its own slowdown in them (a fixed cost:
the history is bounded; at most every 5 steps) and keeps the last one found. Its vector carries that slowdown (onset,
level before, level after) and its own change at the onsets other ranks announced in the
previous log interval (``CANDIDATES`` of them, chosen alike on every rank from the same gathered
vectors), so that rank 0 judges whether a slowdown is the rank's own with the report's rule:
larger by 10% than the other ranks' median change at the same step. A rank is named while its
own slowdown holds in its recent steps, from the second log interval that shows it on: a burst that
ends (which the report, seeing the whole run, does not name) is named no longer.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from goodtrace.record.live.change_point import change_at, its_own, own_slowdown, slower_since

__all__ = ["CANDIDATES", "FIELDS", "Candidate", "LiveSlowdown", "SlowdownTracker", "judge_candidates"]

HISTORY = 240  # steps of each rank kept for its live slowdown
SEARCH_EVERY = 5  # new steps between two searches at most (a line every step need not search each)
CANDIDATES = 4  # onsets per log interval at which every rank sends its own change
FIELDS = 3 + CANDIDATES  # onset, before, after, then the change at each candidate's onset
NONE = math.nan


class Candidate(NamedTuple):
    """A rank with a slowdown of its own, and the onset at which every rank sends its change."""

    rank: int
    onset_step: int


@dataclasses.dataclass(frozen=True)
class LiveSlowdown:
    """A rank named on the live line: slower than it was, by its own change point."""

    rank: int
    host: str
    onset_step: int
    before_s: float
    after_s: float
    others_increase: float | None

    @property
    def increase(self) -> float:
        return self.after_s / self.before_s - 1

    @property
    def text(self) -> str:
        """"rank 2 computes 30% slower since step 15 (host h2)"."""
        return f"rank {self.rank} {slower_since('compute', self.increase, self.onset_step)} (host {self.host})"


class SlowdownTracker:
    """This rank's busy time per step (recorder hooks) and its own slowdown in it."""

    def __init__(self, history: int = HISTORY) -> None:
        self.steps: collections.deque[int] = collections.deque(maxlen=history)
        self.busy_s: collections.deque[float] = collections.deque(maxlen=history)
        self.found: tuple[int, float, float] | None = None  # the own slowdown of the last search
        self.candidates: list[Candidate] = []  # from the last gathered log interval
        self._step_t0: int | None = None
        self._spans: list[tuple[int, int]] = []
        self._first = True
        self._unsearched = 0  # steps added since the last search

    def hooks(self) -> list[tuple[str, Callable[..., None]]]:
        return [("step_begin_listeners", self.on_step_begin), ("overhead_span_listeners", self.on_overhead_span),
                ("step_listeners", self.on_step_end)]

    def on_step_begin(self, number: int, t0: int) -> None:
        self._step_t0 = t0
        self._spans.clear()

    def on_overhead_span(self, category: str, t0: int, t1: int) -> None:
        if self._step_t0 is not None and t0 >= self._step_t0:
            self._spans.append((t0, t1))

    def on_step_end(self, number: int, t0: int, t1: int) -> None:
        overhead, covered = 0, t0
        for s0, s1 in sorted(self._spans):  # nested spans counted once
            lo, hi = max(s0, covered), min(s1, t1)
            if hi > lo:
                overhead += hi - lo
                covered = hi
        self._spans.clear()
        self._step_t0 = None
        if self._first:  # the first step (compile, warm-up) is not steady state, as in the report
            self._first = False
            return
        self.steps.append(number)
        self.busy_s.append(max(0, t1 - t0 - overhead) / 1e9)
        self._unsearched += 1

    def fields(self) -> list[float]:
        """This rank's part of its log interval's vector (``FIELDS`` floats)."""
        steps, busy = list(self.steps), list(self.busy_s)
        if self._unsearched >= SEARCH_EVERY:
            self._unsearched = 0
            self.found = own_slowdown(steps, busy)
        values = list(self.found) if self.found is not None else [NONE, NONE, NONE]
        for candidate in self.candidates:
            change = change_at(steps, busy, candidate.onset_step)
            values.append(NONE if change is None else change)
        return [float(v) for v in values] + [NONE] * (FIELDS - len(values))

    def choose(self, per_rank: Sequence[Sequence[float] | None]) -> None:
        """The candidates of the next interval, from a gathered log interval's fields (the same on
        every rank): the ranks with a slowdown of their own, the largest first."""
        found = [(fields[2] / fields[1] - 1, rank, int(fields[0])) for rank, fields in enumerate(per_rank)
                 if fields is not None and not math.isnan(fields[0]) and fields[1] > 0]
        self.candidates = [Candidate(rank, onset)
                           for _, rank, onset in sorted(found, key=lambda f: (-f[0], f[1]))][:CANDIDATES]


def judge_candidates(candidates: Sequence[Candidate], per_rank: Sequence[Sequence[float] | None],
                     host_of: Callable[[int], str], named: dict[int, LiveSlowdown]) -> None:
    """Rank 0: name each candidate of the previous log interval that still has its slowdown and whose
    slowdown is its own against the other ranks' changes at its onset, sent in this log interval;
    ``named`` holds the ranks named now: one whose own slowdown is gone (a burst that ended)
    is no longer named."""
    for rank in list(named):
        fields = per_rank[rank] if 0 <= rank < len(per_rank) else None
        if fields is None or math.isnan(fields[0]):
            del named[rank]
    for index, (rank, _onset) in enumerate(candidates):
        fields = per_rank[rank] if 0 <= rank < len(per_rank) else None
        if fields is None or math.isnan(fields[0]) or not fields[1] > 0:
            continue
        others = [f[3 + index] for r, f in enumerate(per_rank)
                  if r != rank and f is not None and not math.isnan(f[3 + index])]
        own, median = its_own(fields[2] / fields[1] - 1, others)
        if own:
            named[rank] = LiveSlowdown(rank, host_of(rank), int(fields[0]), fields[1], fields[2], median)
        else:
            named.pop(rank, None)
