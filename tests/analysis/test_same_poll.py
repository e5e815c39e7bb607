"""Two completions found by the same readiness poll share one timestamp (steps shorter than the
poll interval, or a late poller): the second closes an honest zero-length interval, never a
dropped sync point, a false interval average or a warning (docs/semantics.md 1.4)."""

from __future__ import annotations

from pathlib import Path

from goodtrace.analysis import analyze
from goodtrace.read.load import load_run
from helpers.builders import Proc


def test_two_sync_points_at_one_instant_are_two_intervals(tmp_path: Path) -> None:
    p = Proc(tmp_path)
    for k in range(8):
        p.step(k, k * 0.01, k * 0.01 + 0.005)
        # steps 4 and 5 were found ready by one poll, at 0.06 s
        p.sync(k, 0.06 if k in (4, 5) else (k + 1) * 0.01, "poll")
    p.finish(0.1)
    p.write()
    result = analyze(load_run(tmp_path))
    rows = list(result.steps)
    assert [r.step for r in rows] == list(range(8))
    assert all(r.shared == 1 for r in rows)  # no "(avg)" row
    assert round(rows[4].step_time_s, 6) == 0.02 and rows[5].step_time_s == 0.0
    assert not any("ignored" in w or "sparse" in w for w in result.warnings), result.warnings
    assert result.ideal_step_s == 0.01  # the zero-length interval is not a step of its own in the ideal
