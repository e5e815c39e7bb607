"""The live goodput drops when a rollback throws work away (docs/semantics.md 1.8, section 9):
one process on a fake clock, every step 1 s, a 1 s checkpoint restore before the re-run."""

from __future__ import annotations

import pytest

import goodtrace as gt
from goodtrace.record.live.aggregator import LiveAggregator, LocalTransport
from goodtrace.testing import FakeClock, capture


def _run(numbers: list[int], said: dict[int, int] | None = None) -> LiveAggregator:
    """Steps in this order; before the execution at position i, a 1 s restore (and the rollback
    event to ``said[i]`` when given) wherever the number goes back."""
    clock = FakeClock()
    with capture(clock=clock, lag=0):
        agg = LiveAggregator(gt.recorder(), LocalTransport(), log_every=1, printer=lambda line: None)
        for i, step in enumerate(numbers):
            if i and (step < numbers[i - 1] or (said and i in said)):
                with gt.span("restore"):
                    clock.advance(1.0)
                if said and i in said:
                    gt.event("rollback", to_step=said[i])
            with gt.step(step) as s:
                clock.advance(1.0)
                s.complete_on(1.0)
        agg.close()
    return agg


def test_an_inferred_rollback_takes_its_thrown_away_steps_back() -> None:
    agg = _run([*range(9), *range(5, 12)])
    productive = [line.productive_s for line in agg.lines]
    # the line of the first re-run step 5: four steps of productive time fewer than before
    at = next(i for i, line in enumerate(agg.lines) if i and line.step < agg.lines[i - 1].step)
    assert productive[at - 1] == pytest.approx(9.0)  # steps 0-8
    assert productive[at] == pytest.approx(9.0 - 4.0 + 1.0)  # 5-8 thrown away, the new 5 kept
    assert agg.lines[at].goodput is not None and agg.lines[at - 1].goodput is not None
    assert agg.lines[at].goodput < agg.lines[at - 1].goodput
    assert productive[-1] == pytest.approx(12.0)  # 0-4 and 5-11: what the report counts
    # the line after the rollback covers one step (the new 5) and its restore, not "steps 0-5"
    assert agg.lines[at].steps == 1
    assert agg.lines[at].overhead_s == {"checkpoint_restore": pytest.approx(1.0)}


def test_a_said_rollback_that_skips_batches_takes_back_every_thrown_step() -> None:
    # restore step 4, go on at 7: 5-8 thrown away (the numbers alone would say only 7 and 8)
    agg = _run([*range(9), *range(7, 12)], said={9: 4})
    assert agg.lines[-1].productive_s == pytest.approx(9.0 - 4.0 + 5.0)


def test_a_retry_takes_nothing_back() -> None:
    agg = _run([1, 2, 2, 3])
    assert agg.lines[-1].productive_s == pytest.approx(4.0)


def test_a_rollback_below_the_first_step_re_does_an_earlier_attempts_steps() -> None:
    # an attempt that started at 9 and restores step 4: the earlier attempt's 5-8 no longer
    # count for the sinks' goodput/job (the line's first_step says from where this attempt ran)
    agg = _run([9, 10, 11, 12], said={2: 4})
    assert agg.lines[0].first_step == 9
    assert agg.lines[-1].first_step == 5


def test_a_rollback_event_writes_its_to_step_and_warns_without_a_usable_one() -> None:
    with pytest.warns(gt.GoodtraceWarning, match="needs to_step="), capture(lag=0) as cap:
        with gt.step(3):
            gt.event("rollback", to_step=1)
            gt.event("rollback")
            gt.event("other", to_step=1)
    steps = [(e["name"], e["step"]) for e in cap.records("event")]
    # the rollback's step field is the step it restored, not the step in progress
    assert steps == [("rollback", 1), ("rollback", None), ("other", 3)]
    with pytest.warns(gt.GoodtraceWarning, match="step number must be an int"), capture(lag=0) as cap:
        gt.event("rollback", to_step="four")
    assert [e["step"] for e in cap.records("event")] == [None]


def test_an_in_process_restart_takes_its_recovery_back_too() -> None:
    # 0-8, then 2 s of re-initialisation in no span before the 1 s restore, then 5-11: the
    # recovery is not the new step 5's work (the report's disruption)
    clock = FakeClock()
    with capture(clock=clock, lag=0):
        agg = LiveAggregator(gt.recorder(), LocalTransport(), log_every=1, printer=lambda line: None)
        for i, step in enumerate([*range(9), *range(5, 12)]):
            if i == 9:
                clock.advance(2.0)
                with gt.span("restore"):
                    clock.advance(1.0)
            with gt.step(step) as s:
                clock.advance(1.0)
                s.complete_on(1.0)
        agg.close()
    assert agg.lines[-1].productive_s == pytest.approx(12.0)
