"""The job's goodput so far (live sinks) from the earlier attempts: at the job's end it is the
analysis's own goodput, and a session outside the analysed job has no earlier attempts."""

from __future__ import annotations

from pathlib import Path

import pytest

from goodtrace.analysis import analyze
from goodtrace.analysis.so_far import earlier_attempts
from goodtrace.read.load import load_run

RESTART = Path(__file__).parent.parent / "data" / "runs" / "restart_2ranks"


def test_the_restarted_attempt_adds_up_to_the_analysis_at_the_end() -> None:
    loaded = load_run(RESTART)
    analysis = analyze(loaded)
    second = next(a for a in analysis.attempts if a.index == 1)
    session = next(s for s in loaded.sessions if s.index == second.reference_session).session
    earlier = earlier_attempts(loaded, analysis, session)
    assert earlier is not None and earlier.attempts == 1
    # attempt 0 ran steps 0-4; steps 3 and 4 were re-done by attempt 1, so 0-2 count (1 s each)
    assert earlier.steps == ((0, pytest.approx(1.0)), (1, pytest.approx(1.0)), (2, pytest.approx(1.0)))
    end = analysis.partition.end_wall_ns
    attempt_productive = sum(r.productive_s for r in analysis.steps if r.attempt == 1)
    assert earlier.job_goodput(3, 7, attempt_productive, end) == pytest.approx(analysis.partition.goodput)
    assert earlier.job_goodput(3, 7, attempt_productive, earlier.job_start_wall_ns) is None


def test_a_session_of_another_job_has_no_earlier_attempts() -> None:
    loaded = load_run(RESTART)
    assert earlier_attempts(loaded, analyze(loaded), "no-such-session") is None
