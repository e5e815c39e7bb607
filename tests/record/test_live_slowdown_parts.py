"""The live slowdown's parts (record/live/slowdown.py), driven by hand: a rank's busy time per
step is the time inside the step less its overhead spans; its own slowdown is the report's rule
on its recent steps; rank 0 names a candidate whose slowdown is its own and stops naming it
when its slowdown is gone."""

from __future__ import annotations

import math
import random

import pytest

from goodtrace.analysis.slowdown import slowdown_of
from goodtrace.record.live.slowdown import FIELDS, LiveSlowdown, SlowdownTracker, judge_candidates

MS = 1_000_000


def _run(tracker: SlowdownTracker, busy_ms: list[float], data_ms: float = 5.0) -> None:
    t = 0
    for step, busy in enumerate(busy_ms):
        tracker.on_step_begin(step, t)
        tracker.on_overhead_span("data", t, t + round(data_ms * MS))  # in-step data: not busy time
        tracker.on_step_end(step, t, t + round((busy + data_ms) * MS))
        t += round((busy + data_ms + 20) * MS)


def _noisy(n: int, level: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [level * (1 + rng.uniform(-0.03, 0.03)) for _ in range(n)]


def test_the_busy_time_leaves_out_overhead_spans_and_the_first_step() -> None:
    tracker = SlowdownTracker()
    _run(tracker, [100.0, 40.0, 41.0])
    assert list(tracker.steps) == [1, 2]
    assert [round(b * 1e3, 3) for b in tracker.busy_s] == [40.0, 41.0]


def test_a_slowdown_is_the_report_s_rule_on_the_recent_steps() -> None:
    series = [40.0, *_noisy(15, 40.0, 1), *_noisy(25, 52.0, 2)]
    tracker = SlowdownTracker()
    _run(tracker, series)
    fields = tracker.fields()
    assert len(fields) == FIELDS and all(math.isnan(v) for v in fields[3:])  # no candidates yet
    onset, before, after = fields[:3]
    expected = slowdown_of(list(range(1, len(series))), [v / 1e3 for v in series[1:]])
    assert expected is not None and int(onset) == expected[0]
    assert (before, after) == pytest.approx(expected[1:], rel=1e-6)  # the busy times are whole ns
    assert abs(onset - 16) <= 1 and after / before - 1 > 0.25


def _fields(onset: float, before: float, after: float, *changes: float) -> list[float]:
    return [onset, before, after, *changes] + [math.nan] * (FIELDS - 3 - len(changes))


def test_rank_0_names_a_candidate_whose_slowdown_is_its_own_then_no_longer_when_it_is_gone() -> None:
    nan = math.nan
    named: dict[int, LiveSlowdown] = {}
    candidates = [(2, 15)]
    quiet = _fields(nan, nan, nan, 0.01)
    judge_candidates(candidates, [quiet, quiet, _fields(15, 0.040, 0.052, 0.3)], lambda r: f"h{r}", named)
    assert [s.text for s in named.values()] == ["rank 2 computes 30% slower since step 15 (host h2)"]
    # every rank changed as much at step 15: a job-wide slowdown, not rank 2's own
    judge_candidates(candidates, [_fields(nan, nan, nan, 0.28), _fields(nan, nan, nan, 0.3),
                              _fields(15, 0.040, 0.052, 0.3)], lambda r: f"h{r}", named)
    assert named == {}
    judge_candidates(candidates, [quiet, quiet, _fields(15, 0.040, 0.052, 0.3)], lambda r: f"h{r}", named)
    assert list(named) == [2]
    judge_candidates([], [quiet, quiet, _fields(nan, nan, nan)], lambda r: f"h{r}", named)  # the burst ended
    assert named == {}


def test_every_rank_chooses_the_same_candidates_from_a_gathered_log_interval() -> None:
    nan = math.nan
    interval = [_fields(nan, nan, nan), _fields(20, 0.04, 0.05), _fields(15, 0.04, 0.06), _fields(nan, nan, nan)]
    first, second = SlowdownTracker(), SlowdownTracker()
    first.choose(interval)
    second.choose(list(reversed(list(reversed(interval)))))
    assert first.candidates == second.candidates == [(2, 15), (1, 20)]  # the largest first
