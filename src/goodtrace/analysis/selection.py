"""Which part of a run a view shows: a step range, a set of ranks, one attempt.

Shared by the trace and the HTML gantt chart; parsing the command line's ``A:B`` and
``0,3,8-15`` forms lives in :mod:`goodtrace.cli.ranges`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from goodtrace.analysis import RunAnalysis

__all__ = ["Selection", "StepRange"]

StepRange = tuple[int | None, int | None]  # inclusive; None = open


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
