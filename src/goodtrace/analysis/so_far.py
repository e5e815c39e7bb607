"""The whole job's goodput so far, while its latest attempt is still running (for live sinks).

The live line knows this attempt's productive time; the attempts before it are in the run
directory. :func:`earlier_attempts` takes from the analysis of the run the job's start and the
productive time of every earlier step execution that still counts; :meth:`EarlierAttempts.job_goodput`
adds this attempt's productive time, after dropping the earlier executions of the steps this
attempt has re-done (they became wasted progress), and divides by the job's time so far.
"""

from __future__ import annotations

import dataclasses

from goodtrace.analysis import RunAnalysis
from goodtrace.read.loaded import LoadedRun

__all__ = ["EarlierAttempts", "earlier_attempts"]


@dataclasses.dataclass(frozen=True)
class EarlierAttempts:
    """What the attempts before the running one contribute to the job's goodput."""

    job_start_wall_ns: int
    attempts: int
    steps: tuple[tuple[int, float], ...]  # (step, productive seconds) of counted earlier executions

    def job_goodput(
        self, first_step: int | None, last_step: int, attempt_productive_s: float, now_wall_ns: int
    ) -> float | None:
        """Productive time of the job so far / time since the job started (None before it)."""
        total_s = (now_wall_ns - self.job_start_wall_ns) / 1e9
        if total_s <= 0:
            return None
        low = last_step if first_step is None else first_step
        earlier = sum(seconds for step, seconds in self.steps if not low <= step <= last_step)
        return max(0.0, min(1.0, (earlier + attempt_productive_s) / total_s))


def earlier_attempts(run: LoadedRun, analysis: RunAnalysis, session: str) -> EarlierAttempts | None:
    """The attempts of ``session``'s job before the one ``session`` belongs to (None when the
    session is not in the analysed job: not written yet, or a different job)."""
    index = next((s.index for s in run.sessions if s.session == session), None)
    attempt = next((a for a in analysis.attempts if index in a.sessions), None)
    if attempt is None:
        return None
    rows = tuple((r.step, r.productive_s) for r in analysis.steps if r.attempt < attempt.index and r.counted)
    earlier = sum(1 for a in analysis.attempts if a.index < attempt.index)
    return EarlierAttempts(analysis.partition.start_wall_ns, earlier, rows)
