"""Rollbacks inside one process are wasted progress, against ground truth: a real child process
runs the loop on the simulated asynchronous device (40 ms kernels; the device logs when each
truly ended), a loss check restores a checkpoint (a 30 ms ``restore`` span) and the loop runs
the same steps again; ``goodtrace report --json`` must move exactly the thrown-away executions'
time to ``wasted_progress``, never count an execution twice, and keep a plain retry as it was.

Tolerance as in ``test_loop_shapes``: a measured sync point is late by at most the bound the
child measured (poll interval + wake-up slack + 2 ms), never early; a difference of two sync
points is therefore within one bound of the truth.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from goodtrace.analysis import analyze
from helpers.builders import Proc, buckets_s, load
from helpers.cli import goodtrace
from helpers.shapes import LOOPS, bound_ns, buckets, done_ns, retried
from helpers.views import assert_views_agree


def _interval_sum(done: list[int], executions: list[int]) -> int:
    """True length of the step intervals of these executions (each ends at its kernel's end,
    starts at the previous kernel's end)."""
    return sum(done[i] - done[i - 1] for i in executions)


def _counted(report: dict[str, Any]) -> list[tuple[int, bool]]:
    return [(r["step"], r["counted"]) for r in report["steps"]]


def _wasted_check(executions: list[int]) -> Any:
    def check(truth: dict[str, Any], report: dict[str, Any]) -> list[str]:
        b = bound_ns(truth)
        want = _interval_sum(done_ns(truth), executions)
        got = buckets(report).get("wasted_progress", 0)
        restore = sum(t1 - t0 for t0, t1 in truth["marks"]["restores"])
        measured_restore = buckets(report).get("checkpoint_restore", 0)
        misses = []
        if abs(got - want) > 2 * b:
            misses.append(f"wasted_progress {got / 1e6:.1f} ms, the thrown-away executions took {want / 1e6:.1f} ms")
        if not 0 <= measured_restore - restore <= 3 * b:
            misses.append(f"checkpoint_restore {measured_restore / 1e6:.1f} ms, the restores took {restore / 1e6:.1f} ms")
        return misses

    return check


@pytest.mark.processes
def test_an_inferred_rollback_makes_the_first_pass_wasted_progress(tmp_path: Path) -> None:
    # 0-8, the loss check fails after 8: restore the checkpoint of step 4, run 5-11 again
    run_dir, truth, report = retried("rollback", tmp_path, _wasted_check([5, 6, 7, 8]))
    assert truth["marks"]["numbers"] == [*range(9), *range(5, 12)]
    assert _counted(report) == [(k, True) for k in range(5)] + [(k, False) for k in range(5, 9)] + [
        (k, True) for k in range(5, 12)]
    (rewind,) = report["rewinds"]
    assert (rewind["from_step"], rewind["to_step"], rewind["resume_step"]) == (8, 4, 5)
    assert (rewind["redone"], rewind["skipped"], rewind["explicit"]) == (4, 0, False)
    assert rewind["text"].startswith("rolled back from step 8 to 4 at +")
    assert "4 steps re-done" in rewind["text"]
    assert abs(rewind["wasted_s"] * 1e9 - buckets(report)["wasted_progress"]) < 1_000  # ns: float rounding only
    partition = report["partition"]
    assert sum(buckets(report).values()) == partition["end_wall_ns"] - partition["start_wall_ns"]
    assert any("1 rollback(s) inside an attempt" in w for w in report["warnings"])
    assert_views_agree(run_dir)


@pytest.mark.processes
def test_the_programs_word_names_the_same_rollback(tmp_path: Path) -> None:
    _, _, report = retried("rollback_explicit", tmp_path, _wasted_check([5, 6, 7, 8]))
    (rewind,) = report["rewinds"]
    assert (rewind["from_step"], rewind["to_step"], rewind["redone"], rewind["explicit"]) == (8, 4, 4, True)
    assert "inferred" not in rewind["text"]
    assert [e["name"] for e in report["events"]] == ["rollback"] and report["events"][0]["step"] == 4


@pytest.mark.processes
def test_a_rollback_that_skips_batches_counts_each_step_once(tmp_path: Path) -> None:
    # restore step 4, skip the batches of 5 and 6 (the spike's), go on at 7: the first pass of
    # 5-8 was thrown away; 5 and 6 never run again and are not lost from the table
    run_dir, truth, report = retried("rollback_skipping", tmp_path, _wasted_check([5, 6, 7, 8]))
    assert truth["marks"]["numbers"] == [*range(9), *range(7, 12)]
    assert _counted(report) == [(k, True) for k in range(5)] + [(k, False) for k in range(5, 9)] + [
        (k, True) for k in range(7, 12)]
    counted = [r["step"] for r in report["steps"] if r["counted"]]
    assert counted == [0, 1, 2, 3, 4, 7, 8, 9, 10, 11]  # each once; 5 and 6 skipped
    (rewind,) = report["rewinds"]
    assert (rewind["to_step"], rewind["resume_step"], rewind["redone"], rewind["skipped"]) == (4, 7, 4, 2)
    assert "2 skipped" in rewind["text"]
    assert_views_agree(run_dir)


@pytest.mark.processes
def test_without_the_programs_word_a_skip_is_not_visible(tmp_path: Path) -> None:
    # the same loop without gt.event: the step numbers say only that 7 ran again
    _, _, report = retried("rollback_skipping_inferred", tmp_path, _wasted_check([7, 8]))
    (rewind,) = report["rewinds"]
    assert (rewind["to_step"], rewind["resume_step"], rewind["redone"], rewind["explicit"]) == (6, 7, 2, False)
    assert [r["step"] for r in report["steps"] if not r["counted"]] == [7, 8]


@pytest.mark.processes
def test_two_rollbacks_in_one_attempt(tmp_path: Path) -> None:
    # 0-8, back to 4; 5-10, back to 7; 8-12. The first pass of 8 is thrown away once, by the first.
    run_dir, truth, report = retried("two_rollbacks", tmp_path, _wasted_check([5, 6, 7, 8, 12, 13, 14]))
    assert truth["marks"]["numbers"] == [*range(9), *range(5, 11), *range(8, 13)]
    assert [(r["from_step"], r["to_step"], r["redone"]) for r in report["rewinds"]] == [(8, 4, 4), (10, 7, 3)]
    counted = [r["step"] for r in report["steps"] if r["counted"]]
    assert counted == list(range(13))
    assert_views_agree(run_dir)


@pytest.mark.processes
def test_an_in_process_restart_is_disruption_not_the_next_steps_work(tmp_path: Path) -> None:
    # after step 8 the host waits for it, spends 80 ms re-initialising (no span), restores,
    # and runs 5-11 again: the 80 ms are disruption, the restore checkpoint_restore.
    # The disruption runs from step 8's measured end (late by at most one bound, and the host's
    # wait may return before the recorder sees it) to the restore's start (just after the
    # recovery's end): against the truth, step 8's true end to the recovery's end, it is short
    # by at most one bound and long by no more than the moment between the two marks.
    def check(truth: dict[str, Any], report: dict[str, Any]) -> list[str]:
        b = bound_ns(truth)
        misses = _wasted_check([5, 6, 7, 8])(truth, report)
        ((_, recovered),) = truth["marks"]["recoveries"]
        want = recovered - done_ns(truth)[8]  # execution 8 is step 8's first pass
        measured = buckets(report).get("disruption", 0)
        if not -b <= measured - want <= b:
            misses.append(f"disruption {measured / 1e6:.1f} ms, step 8's end to the recovery's end took "
                          f"{want / 1e6:.1f} ms (bound {b / 1e6:.1f} ms)")
        return misses

    run_dir, _, report = retried("in_process_restart", tmp_path, check)
    second = next(r for r in report["steps"] if r["step"] == 5 and r["counted"])
    assert set(second["overhead_s"]) == {"disruption", "checkpoint_restore"}
    assert_views_agree(run_dir)


def _run(shape: str, run_dir: Path, log: Path) -> dict[str, Any]:
    child = subprocess.run([sys.executable, str(LOOPS), shape, str(run_dir), str(log)],
                           capture_output=True, text=True, timeout=120)
    truth: dict[str, Any] = json.loads(log.read_text())
    truth["returncode"] = child.returncode
    return truth


@pytest.mark.processes
def test_a_rollback_then_a_crash_and_a_restart_counts_nothing_twice(tmp_path: Path) -> None:
    """Attempt 0 runs 0-8, rolls back to 4, runs 5-9 and dies; attempt 1, a new process,
    restores step 6 and runs 7-12. Wasted: attempt 0's first pass of 5-8 (the rollback) and its
    second pass of 7-9 (the restart); the first pass of 7 and 8 only once."""
    misses: list[str] = []
    for attempt in range(3):
        run_dir = tmp_path / f"run-{attempt}"
        first = _run("rollback_then_crash", run_dir, tmp_path / f"a0-{attempt}.json")
        second = _run("restart_at_7", run_dir, tmp_path / f"a1-{attempt}.json")
        assert first["returncode"] == 3 and second["returncode"] == 0
        done = goodtrace("report", str(run_dir), "--json")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        b = max(bound_ns(first), bound_ns(second))
        ends = done_ns(first)
        want = _interval_sum(ends, [5, 6, 7, 8]) + _interval_sum(ends, [11, 12, 13])
        got = buckets(report).get("wasted_progress", 0)
        misses = [] if abs(got - want) <= 3 * b else [
            f"wasted_progress {got / 1e6:.1f} ms, the thrown-away executions took {want / 1e6:.1f} ms"]
        if not misses:
            break
    assert not misses, misses
    assert [a["ended"] for a in report["attempts"]] == ["killed", "completed"]
    assert buckets(report).get("disruption", 0) > 0
    counted = [(r["attempt"], r["step"]) for r in report["steps"] if r["counted"]]
    assert counted == [(0, k) for k in range(7)] + [(1, k) for k in range(7, 13)]
    thrown = [(r["attempt"], r["step"]) for r in report["steps"] if not r["counted"]]
    assert thrown == [(0, k) for k in (5, 6, 7, 8, 7, 8, 9)]
    (rewind,) = report["rewinds"]
    assert (rewind["attempt"], rewind["from_step"], rewind["to_step"], rewind["redone"]) == (0, 8, 4, 4)
    assert_views_agree(run_dir)


@pytest.mark.processes
def test_a_plain_retry_keeps_its_meaning(tmp_path: Path) -> None:
    # 1, 2, 2, 3, 4, 5: the second 2 is a retry of step 2, not a rewind; both executions count
    def check(truth: dict[str, Any], report: dict[str, Any]) -> list[str]:
        # both executions of 2 stay productive: the rows after the first add up to the device's time
        done, b = done_ns(truth), bound_ns(truth)
        got = sum(r["productive_s"] * 1e9 for r in report["steps"][1:] if r["counted"])
        want = done[-1] - done[0]
        return [] if abs(got - want) <= 2 * b else [f"productive {got / 1e6:.1f} ms, the device {want / 1e6:.1f} ms"]

    _, _, report = retried("repeated_steps", tmp_path, check)
    assert [r["step"] for r in report["steps"]] == [1, 2, 2, 3, 4, 5]
    assert all(r["counted"] for r in report["steps"])
    assert "wasted_progress" not in buckets(report)
    assert "rewinds" not in report


# ---------------------------------------------------------------- hand-computed (exact)


def test_the_programs_word_wins_over_inference(tmp_path: Path) -> None:
    """Steps 0-8 then 5-7, but the program says it restored step 2: 3-8 were thrown away, not 5-8;
    and the lower number right after the event is not a second rewind."""
    p = Proc(tmp_path)
    t = p.loop(range(9), 1.0)  # [1, 10]
    p.event("rollback", t + 0.5, step=2)
    p.loop(range(5, 8), t + 1.0)  # [11, 14]
    p.finish(14.0)
    p.write()
    result = analyze(load(tmp_path))
    assert [(r.step, r.counted) for r in result.steps] == [(k, k < 3) for k in range(9)] + [(k, True) for k in (5, 6, 7)]
    # 9 s of first pass (3 s kept); the second 5's interval (10, 12]: the 0.5 s before the
    # rollback is its recovery (disruption), the rest productive; 6-7
    assert buckets_s(result.partition) == {"startup": 1.0, "productive": 6.5, "wasted_progress": 6.0,
                                           "disruption": 0.5}
    (rewind,) = result.rewinds
    assert (rewind.from_step, rewind.to_step, rewind.resume_step, rewind.redone, rewind.skipped, rewind.explicit) == (
        8, 2, 5, 6, 2, True)


def test_a_rollback_event_on_a_retry_makes_it_a_rollback(tmp_path: Path) -> None:
    """1, 2, 2, 3 is a retry (both count) unless the program says it rolled back to 1."""
    for said in (False, True):
        run_dir = tmp_path / str(said)
        p = Proc(run_dir)
        p.loop(range(1, 3), 0.0)  # 1, 2 over [0, 2]
        if said:
            p.event("rollback", 2.5, step=1)
        p.loop(range(2, 4), 3.0)  # 2, 3 over [3, 5]
        p.finish(5.0)
        p.write()
        result = analyze(load(run_dir))
        assert [(r.step, r.counted) for r in result.steps] == [(1, True), (2, not said), (2, True), (3, True)]
        assert buckets_s(result.partition).get("wasted_progress", 0.0) == (1.0 if said else 0.0)
        assert len(result.rewinds) == int(said)


def test_a_restart_that_says_its_rollback_skips_batches_of_the_attempt_before(tmp_path: Path) -> None:
    """Attempt 0 runs 0-9 and dies; the new process restores step 4, says so, and skips to 7:
    attempt 0's 5-9 ran for nothing (not only 7-9, which is all the step numbers show)."""
    a0 = Proc(tmp_path, restart=0)
    a0.loop(range(10), 0.0)  # [0, 10]
    a0.heartbeat(10.5)
    a0.write()
    a1 = Proc(tmp_path, restart=1, start=12.0)
    a1.span("restore", 12, 13)
    a1.event("rollback", 13.0, step=4)
    a1.loop(range(7, 10), 13.0)
    a1.finish(16.0)
    a1.write()
    result = analyze(load(tmp_path))
    assert [(r.attempt, r.step) for r in result.steps if not r.counted] == [(0, k) for k in range(5, 10)]
    assert buckets_s(result.partition) == {"productive": 8.0, "wasted_progress": 5.0, "startup": 1.0,
                                           "disruption": 2.0}
    assert [(r.attempt, r.to_step, r.redone) for r in result.rewinds] == [(1, 4, 0)]


def test_a_rollback_event_that_does_not_explain_the_next_step_leaves_it_to_inference(tmp_path: Path) -> None:
    """An event naming step 8 (say an old file's event at the step in progress) before a loop
    that runs 5 again: the event threw nothing away, and 8 -> 5 is still a rewind."""
    p = Proc(tmp_path)
    t = p.loop(range(9), 1.0)
    p.event("rollback", t + 0.5, step=8)
    p.loop(range(5, 8), t + 1.0)
    p.finish(14.0)
    p.write()
    result = analyze(load(tmp_path))
    assert [(r.explicit, r.to_step, r.redone) for r in result.rewinds] == [(True, 8, 0), (False, 4, 4)]
    assert [r.step for r in result.steps if not r.counted] == [5, 6, 7, 8]


def test_an_in_process_restart_is_disruption_then_wasted_progress(tmp_path: Path) -> None:
    """Steps 0-8, then 3 s of in-process recovery no span covers (re-initialisation), a 1 s
    restore, and 5-7 again: the recovery is disruption, the restore checkpoint_restore, the
    first pass of 5-8 wasted progress; the second 5's row says so."""
    p = Proc(tmp_path)
    t = p.loop(range(9), 1.0)  # [1, 10]
    p.span("load_checkpoint", t + 3.0, t + 4.0)
    p.loop(range(5, 8), t + 4.0)  # [14, 17]
    p.finish(17.0)
    p.write()
    result = analyze(load(tmp_path))
    assert buckets_s(result.partition) == {"startup": 1.0, "productive": 8.0, "wasted_progress": 4.0,
                                           "disruption": 3.0, "checkpoint_restore": 1.0}
    row = result.steps[9]
    assert (row.step, row.step_time_s, row.productive_s) == (5, 5.0, 1.0)
    assert row.overhead_s == {"disruption": 3.0, "checkpoint_restore": 1.0}
