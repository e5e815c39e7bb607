"""The step intervals the timelines draw, from the run model (never cut again by a view).

:func:`session_intervals` gives a session's intervals exactly as the analysis cut them (with
the attempt-level relabels: warm-up, wasted progress), optionally only those holding a step of
a range; :func:`slice_clock_range` the part of the session's clock a slice of steps covers, and
:func:`slice_steps` the steps of the executions it draws (which files a trace reads). The
trace's steps track, the HTML heat map and gantt chart, and the report's step table all come
from the same :class:`goodtrace.analysis.cut.SessionCut`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from goodtrace.analysis.cut import NO_RELABELS, Piece, label_totals
from goodtrace.analysis.partition import PRODUCTIVE, interval_pieces
from goodtrace.analysis.selection import StepRange

if TYPE_CHECKING:
    from goodtrace.analysis import RunAnalysis

__all__ = ["IntervalView", "iter_session_intervals", "session_intervals", "slice_clock_range", "slice_steps"]


@dataclasses.dataclass(frozen=True)
class IntervalView:
    """One step interval (start, end] of one session, on that session's monotonic clock."""

    session: int
    index: int
    attempt: int
    start: int
    end: int
    how: str
    steps: tuple[int, ...]  # the step numbers of the executions sharing it, in order
    seqs: tuple[int, ...]
    pieces: tuple[Piece, ...]
    lost: frozenset[int]  # executions (indexes in the session's cut) a later attempt redid

    @property
    def duration_ns(self) -> int:
        return self.end - self.start

    @property
    def overhead_ns(self) -> dict[str, int]:
        return label_totals(self.pieces, skip=PRODUCTIVE)

    @property
    def productive_ns(self) -> int:
        return label_totals(self.pieces).get(PRODUCTIVE, 0)

    @property
    def first_step(self) -> int:
        return self.steps[0]

    @property
    def step(self) -> int:
        return self.steps[-1]

    @property
    def is_shared(self) -> bool:
        return len(self.steps) > 1


def _intervals_in_range(cut: Any, selected: StepRange | None) -> list[int]:
    """The intervals of a cut holding an execution of a step in ``selected`` (every interval when
    None), found on columns: a gantt of 20 steps looks at 20 intervals of each session, not all."""
    import numpy as np

    if selected is None or not cut.intervals:
        return list(range(cut.intervals))
    lo, hi = selected
    steps = np.frombuffer(cut.exec_step, dtype=np.int64)
    ok = np.ones(len(steps), dtype=bool)
    if lo is not None:
        ok &= steps >= lo
    if hi is not None:
        ok &= steps <= hi
    cum = np.concatenate(([0], np.cumsum(ok)))
    first = np.frombuffer(cut.interval_first, dtype=np.int64)
    count = np.frombuffer(cut.interval_count, dtype=np.int64)
    return np.flatnonzero(cum[first + count] > cum[first]).tolist()  # type: ignore[no-any-return]


def session_intervals(analysis: RunAnalysis, session: int, selected: StepRange | None = None) -> list[IntervalView]:
    """The session's intervals (those holding a step of ``selected``), from the run model."""
    return list(iter_session_intervals(analysis, session, selected))


def iter_session_intervals(analysis: RunAnalysis, session: int, selected: StepRange | None = None) -> Iterator[IntervalView]:
    """:func:`session_intervals` one at a time (a view of a window of a long run writes each as
    it is made: hundreds of thousands)."""
    cut = analysis.cuts.get(session)
    if cut is None:
        return
    relabels = analysis.relabels.get(session, NO_RELABELS)
    attempt = analysis.attempt_of.get(session, -1)
    for w in _intervals_in_range(cut, selected):
        executions = cut.executions_of(w)
        steps = tuple(cut.exec_step[i] for i in executions)
        pieces, lost = interval_pieces(cut, w, relabels)
        yield IntervalView(session, w, attempt, cut.interval_start[w], cut.interval_end[w], cut.interval_how[w], steps,
                           tuple(cut.exec_seq[i] for i in executions), tuple(pieces), lost)


def slice_steps(analysis: RunAnalysis, session: int, selected: StepRange | None) -> tuple[int, int] | None:
    """The lowest and highest step of the executions in the intervals of a session that hold a
    step of ``selected`` (what a slice of steps draws: a shared interval's steps past the
    range too); None when ``selected`` is None or no interval holds one."""
    import numpy as np

    cut = analysis.cuts.get(session)
    if cut is None or selected is None:
        return None
    found = _intervals_in_range(cut, selected)
    if not found:
        return None
    first = np.frombuffer(cut.interval_first, dtype=np.int64)[found]
    count = np.frombuffer(cut.interval_count, dtype=np.int64)[found]
    # each found interval's executions, first to last (consecutive in the cut)
    executions = np.arange(int(count.sum())) + np.repeat(first - (np.cumsum(count) - count), count)
    steps = np.frombuffer(cut.exec_step, dtype=np.int64)[executions]
    return int(steps.min()), int(steps.max())


def slice_clock_range(analysis: RunAnalysis, session: int, selected: StepRange | None) -> tuple[int, int] | None:
    """The part of a session's clock that a slice of steps covers (from its first interval in
    the range to its last); the whole session when ``selected`` is None; None when no interval
    of the session holds a step of the range."""
    cut = analysis.cuts.get(session)
    if cut is None:
        return None
    if selected is None:
        return (cut.start, max(cut.end, cut.last_end))
    found = _intervals_in_range(cut, selected)  # the intervals' bounds alone: no pieces carved
    return (cut.interval_start[found[0]], cut.interval_end[found[-1]]) if found else None
