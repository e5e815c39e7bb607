"""Which part of a run a view shows: a step range, a set of ranks, one attempt.

Shared by the trace and the HTML gantt chart, with how a view of a few steps chooses them when
none are asked for (:func:`choose_range`); parsing the command line's ``A:B`` and
``0,3,8-15`` forms lives in :mod:`goodtrace.cli.ranges`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from goodtrace.analysis import RunAnalysis

__all__ = ["RANGE_STEPS", "Selection", "StepRange", "choose_range"]

StepRange = tuple[int | None, int | None]  # inclusive; None = open
RANGE_STEPS = 20  # the steps of a view of a few steps when none are asked for (the gantt chart)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Selection:
    """Which part of a run to show. ``steps`` is inclusive at both ends (``None`` = open)."""

    steps: tuple[int | None, int | None] | None = None
    ranks: frozenset[int] | None = None
    attempt: int | None = None

    def __post_init__(self) -> None:
        if self.steps is not None:
            first, last = self.steps
            if first is not None and last is not None and last < first:
                raise ValueError(f"step range {first}:{last} is empty (the range is inclusive: A <= B)")
        if self.attempt is not None and self.attempt < 0:
            raise ValueError(f"attempt must be 0 or more, got {self.attempt}")

    def step_in_range(self, step: int) -> bool:
        if self.steps is None:
            return True
        first, last = self.steps
        return (first is None or step >= first) and (last is None or step <= last)

    def sessions(self, analysis: RunAnalysis) -> list[int]:
        """The job's sessions (those the analysis cut) of the selected attempt and ranks, by
        rank then start."""
        chosen = [
            i for i in analysis.cuts
            if (self.attempt is None or analysis.attempt_of.get(i) == self.attempt)
            and (self.ranks is None or analysis.sessions[i].rank in self.ranks)
        ]
        return sorted(chosen, key=lambda i: (analysis.sessions[i].rank, analysis.sessions[i].start_wall))


def choose_range(
    analysis: RunAnalysis, steps: StepRange | None, attempt_asked: int | None, width: int = RANGE_STEPS,
) -> tuple[int, int, int] | None:
    """(attempt, first step, last step) of a view of a few steps (the HTML gantt chart, a trace
    too large to write whole): the asked range ``steps`` (in the last attempt that ran any of
    it, unless ``attempt_asked`` says which), else ``width`` (20) steps around the slowest step of
    the reference rank that is not the first of its attempt, else the last ``width`` steps."""
    import numpy as np

    # each attempt's executed step numbers, sorted, once each (the analysis's: no cut read here)
    executed = {a: s for a, s in analysis.executed_steps.items() if len(s)}
    if not executed:
        return None
    if steps is not None:
        low, high = steps
        lo = -(2**62) if low is None else low
        hi = 2**62 if high is None else high
        candidates = [a for a in sorted(executed) if ((executed[a] >= lo) & (executed[a] <= hi)).any()]
        if attempt_asked is not None:
            candidates = [a for a in candidates if a == attempt_asked]
        if not candidates:
            return None
        numbers = executed[candidates[-1]]
        inside = numbers[(numbers >= lo) & (numbers <= hi)]
        return candidates[-1], int(inside[0]), int(inside[-1])
    attempt = attempt_asked if attempt_asked in executed else max(executed)
    centre = int(executed[attempt][-1])
    table = analysis.steps  # the slowest row (the first of equals) not first of its attempt
    attempts = table.attempt
    slowest = ~table.first_of_attempt & (attempts == attempt)
    if attempt_asked is None and not slowest.any():
        slowest = ~table.first_of_attempt & np.isin(attempts, list(executed))
    if slowest.any():
        rows = np.flatnonzero(slowest)
        row = table[int(rows[np.argmax(table.step_time_s[rows])])]
        attempt, centre = row.attempt, row.step
    numbers = executed[attempt]
    at = int(np.searchsorted(numbers, centre))
    pos = at if at < len(numbers) and numbers[at] == centre else len(numbers) - 1
    lo_index = max(0, min(pos - width // 2, len(numbers) - width))
    chosen = numbers[lo_index:lo_index + width]
    return attempt, int(chosen[0]), int(chosen[-1])
