"""Hand-computed timelines: each test writes a small run directory (times in seconds on one
job clock), loads it through the DuckDB reader and asserts every bucket exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from goodtrace.analysis import analyze
from helpers.builders import WALL0, Proc, buckets_s, load, ns


def test_clean_run(tmp_path: Path) -> None:
    p = Proc(tmp_path)
    p.span("init", 0, 2)
    p.loop(range(5), 2.0)  # steps 0..4 over [2, 7]
    p.finish(8.0)
    p.write()
    result = analyze(load(tmp_path))
    assert buckets_s(result.partition) == {"productive": 5.0, "startup": 2.0, "teardown": 1.0}
    assert result.partition.startup_parts_ns["init"] == 2_000_000_000
    assert result.partition.total_ns == 8_000_000_000
    assert result.partition.goodput == 5 / 8
    assert [a.ended for a in result.attempts] == ["completed"]
    assert result.ideal_step_s == 1.0
    assert [r.step for r in result.steps] == [0, 1, 2, 3, 4]
    assert all(r.step_time_s == 1.0 and r.productive_s == 1.0 for r in result.steps)
    assert result.anomalies == ()


@pytest.mark.slow
def test_startup_and_compile_from_the_first_step(tmp_path: Path) -> None:
    p = Proc(tmp_path)
    p.span("init", 0, 1)
    p.span("restore", 1, 2)
    p.step(0, 2.0, 2.1).sync(0, 7.0, "lag")  # step 0 took 5 s on the device: it compiled
    for k in range(1, 5):
        p.step(k, 6.0 + k, 6.1 + k).sync(k, 7.0 + k, "lag")
    p.finish(11.0)
    p.write()
    result = analyze(load(tmp_path))
    # no compile span says it compiled: the excess is warm-up, inferred (and said so)
    assert buckets_s(result.partition) == {"productive": 5.0, "startup": 2.0, "warmup": 4.0}
    assert any("warm-up is inferred" in w for w in result.warnings)
    parts = result.partition.startup_parts_ns
    assert parts["init"] == 1_000_000_000 and parts["checkpoint_restore"] == 1_000_000_000
    first = result.steps[0]
    assert (first.step, first.step_time_s, first.productive_s, first.overhead_s) == (0, 5.0, 1.0, {"warmup": 4.0})


def test_explicit_compile_spans_count_once(tmp_path: Path) -> None:
    p = Proc(tmp_path)
    p.step(0, 0.0, 0.1).span("compile", 0.1, 3.1, step=0).sync(0, 5.0, "lag")
    for k in range(1, 4):
        p.step(k, 4.0 + k, 4.1 + k).sync(k, 5.0 + k, "lag")
    p.finish(8.0)
    p.write()
    result = analyze(load(tmp_path))
    # interval 0 = 3 s of compile span + 2 s productive, of which 1 s above the ideal step time:
    # compile is what the span measured, the rest of the excess is warm-up (inferred)
    assert buckets_s(result.partition) == {"productive": 4.0, "compile": 3.0, "warmup": 1.0}


def test_checkpoint_every_two_steps_lands_in_the_next_interval(tmp_path: Path) -> None:
    p = Proc(tmp_path)
    t = p.loop(range(2), 0.0)
    p.span("checkpoint", t, t + 2, step=1)
    t = p.loop(range(2, 4), t + 2)
    p.span("checkpoint", t, t + 2, step=3)
    t = p.loop(range(4, 6), t + 2)
    p.finish(t)
    p.write()
    result = analyze(load(tmp_path))
    assert buckets_s(result.partition) == {"productive": 6.0, "checkpoint_save": 4.0}
    rows = {r.step: r for r in result.steps}
    assert rows[2].step_time_s == 3.0 and rows[2].overhead_s == {"checkpoint_save": 2.0}
    assert rows[2].explain() == "3.000 s = 1.000 s productive + 2.000 s checkpoint_save"
    assert rows[1].step_time_s == 1.0 and rows[1].overhead_s == {}
    assert result.slowest_steps(2)[0].step in (2, 4)


def test_eval_with_nested_gc_counted_once(tmp_path: Path) -> None:
    p = Proc(tmp_path)
    t = p.loop(range(2), 0.0)
    p.span("eval", t, t + 3, step=1)
    p.span("gc", t + 1, t + 1.5, cat="gc", step=1)  # inside eval: the outermost wins
    p.span("checkpoint", 0.2, 1.8, tid=99)  # another thread: never double counted
    t = p.loop(range(2, 4), t + 3)
    p.finish(t)
    p.write()
    result = analyze(load(tmp_path))
    assert buckets_s(result.partition) == {"productive": 4.0, "eval": 3.0}


def test_crash_and_restart_from_a_checkpoint(tmp_path: Path) -> None:
    a0 = Proc(tmp_path, restart=0)
    t = a0.loop(range(3), 0.0)
    a0.span("checkpoint", 3, 4, step=2)
    a0.loop(range(3, 5), 4.0)  # steps 3, 4 over [4, 6]
    a0.heartbeat(6.5)  # crashed in step 5: no finish record
    a0.write()
    a1 = Proc(tmp_path, restart=1, start=10.0)
    a1.span("restore", 10, 11)
    a1.loop(range(3, 6), 11.0)
    a1.finish(14.0)
    a1.write()
    result = analyze(load(tmp_path))
    assert buckets_s(result.partition) == {
        "productive": 6.0, "startup": 1.0, "checkpoint_save": 1.0, "wasted_progress": 2.0, "disruption": 4.0,
    }
    assert [(a.ended, a.first_step, a.last_step) for a in result.attempts] == [("killed", 0, 4), ("completed", 3, 5)]
    assert [r.counted for r in result.steps] == [True, True, True, False, False, True, True, True]
    assert result.program.counted_steps == 6
    assert t == 3.0


def test_restart_from_step_zero_is_wasted_progress(tmp_path: Path) -> None:
    a0 = Proc(tmp_path)
    a0.loop(range(4), 0.0)
    a0.heartbeat(4.0)
    a0.write()
    a1 = Proc(tmp_path, start=6.0)
    a1.loop(range(6), 6.0)
    a1.finish(12.0)
    a1.write()
    result = analyze(load(tmp_path))
    assert result.jobs == 1
    assert buckets_s(result.partition) == {"productive": 6.0, "wasted_progress": 4.0, "disruption": 2.0}
    assert result.partition.goodput == 0.5


def test_several_restarts(tmp_path: Path) -> None:
    a0 = Proc(tmp_path, restart=0)
    a0.loop(range(5), 0.0)
    a0.heartbeat(5.5)
    a0.write()
    a1 = Proc(tmp_path, restart=1, start=7.0)
    a1.span("restore", 7, 8)
    a1.loop(range(3, 7), 8.0)
    a1.write()  # crashed right after its last step's sync point (12 s)
    a2 = Proc(tmp_path, restart=2, start=15.0)
    a2.span("restore", 15, 16)
    a2.loop(range(5, 10), 16.0)
    a2.finish(21.0)
    a2.write()
    result = analyze(load(tmp_path))
    assert buckets_s(result.partition) == {
        "productive": 10.0, "startup": 2.0, "wasted_progress": 4.0, "disruption": 5.0,
    }
    # no finish record and a later attempt exists: killed (an uncaught exception would say crashed)
    assert [a.ended for a in result.attempts] == ["killed", "killed", "completed"]
    assert result.partition.total_ns == 21_000_000_000


def test_idle_tail_is_teardown_not_productive(tmp_path: Path) -> None:
    p = Proc(tmp_path)
    p.loop(range(5), 0.0)
    for second in range(6, 66, 10):
        p.heartbeat(second)
    p.finish(65.0)
    p.write()
    result = analyze(load(tmp_path))
    assert buckets_s(result.partition) == {"productive": 5.0, "teardown": 60.0}


def test_steps_recorded_every_tenth_step_share_the_interval(tmp_path: Path) -> None:
    p = Proc(tmp_path)
    for k in range(20):
        p.step(k, k, k + 0.1)
    p.sync(9, 10.0, "lag").sync(19, 20.0, "lag")
    p.finish(20.0)
    p.write()
    result = analyze(load(tmp_path))
    assert buckets_s(result.partition) == {"productive": 20.0}
    assert len(result.steps) == 20
    assert all(r.step_time_s == 1.0 and r.productive_s == 1.0 and r.shared == 10 for r in result.steps)
    assert any("sparse" in w for w in result.warnings)


def test_data_loading_in_a_synchronous_loop_is_badput(tmp_path: Path) -> None:
    p = Proc(tmp_path)
    p.span("data", 0, 0.5)  # prefetch before the first step: part of startup
    p.loop(range(5), 0.5, data_s=0.25, how="host")
    p.finish(5.5)
    p.write()
    result = analyze(load(tmp_path))
    assert result.host_overhead.rule == "sync points" and result.host_overhead.overlapped_ns == 0
    assert buckets_s(result.partition) == {"productive": 3.75, "data": 1.25, "startup": 0.5}
    assert result.partition.startup_parts_ns["data"] == 500_000_000


def test_data_loading_while_the_device_ran_out_of_work_is_badput(tmp_path: Path) -> None:
    """The host entered each step as the previous one became ready (a tie at the next entry,
    observed later: an "asynchronous" loop by the old majority rule) and then loaded data with
    nothing queued: the device waited for every batch."""
    p = Proc(tmp_path)
    for k in range(5):
        p.step(k, k, k + 0.3).span("data", k, k + 0.25, step=k).sync(k, k + 1.0, "lag")
    p.span("gc", 2.05, 2.15, step=2)  # a gc pause inside data loading is gc
    p.finish(5.0)
    p.write()
    result = analyze(load(tmp_path))
    assert result.host_overhead.rule == "sync points"
    assert buckets_s(result.partition) == {"productive": 3.75, "data": 1.15, "gc": 0.1}
    assert result.host_overhead.overlapped_ns == 0 and result.host_overhead.uncertain_ns == 0


def test_data_loading_that_overlapped_queued_device_work_is_productive(tmp_path: Path) -> None:
    """The host runs ahead: step k loads its batch while the device still runs step k-1 (ready
    0.2 s into step k's data span): only the last 0.05 s of each span found the device idle."""
    p = Proc(tmp_path)
    for k in range(5):
        p.step(k, k, k + 0.3).span("data", k, k + 0.25, step=k).sync(k, k + 1.2, "lag")
    p.span("gc", 2.05, 2.15, step=2)  # overlapped queued device work too: productive
    p.finish(5.2)
    p.write()
    result = analyze(load(tmp_path))
    # step 0's batch had nothing queued before it: 0.25 s; steps 1-4: 0.05 s each
    assert buckets_s(result.partition) == {"productive": 4.75, "data": 0.45}
    assert [r.overhead_s.get("data", 0.0) for r in result.steps] == pytest.approx([0.25, 0.05, 0.05, 0.05, 0.05])
    assert result.host_overhead.overlapped_ns == 800_000_000  # 4 x 0.2 s of data (the gc within it)


def test_an_overhead_span_after_untraced_host_time_is_said_to_depend_on_the_rule(tmp_path: Path) -> None:
    """A log span 0.1 s after the step's entry, untraced: the step may have dispatched work in
    that time, which the sync points cannot see. Counted as lost after the previous step's sync
    point, and the report says how much depends on that."""
    p = Proc(tmp_path)
    for k in range(4):
        p.step(k, k, k + 0.5).span("log", k + 0.1, k + 0.4, step=k).sync(k, k + 1.0, "lag")
    p.finish(4.0)
    p.write()
    result = analyze(load(tmp_path))
    assert buckets_s(result.partition) == {"productive": 2.8, "log": 1.2}
    assert result.host_overhead.uncertain_ns == 1_200_000_000
    assert any("may have dispatched device work" in s for s in result.host_overhead.sentences())


def test_data_rule_override(tmp_path: Path) -> None:
    p = Proc(tmp_path)
    p.loop(range(4), 0.0, data_s=0.5, how="lag")
    p.finish(4.0)
    p.write()
    result = analyze(load(tmp_path), data_rule="synchronous")
    assert buckets_s(result.partition) == {"productive": 2.0, "data": 2.0}


def test_reused_run_directory_is_two_jobs(tmp_path: Path) -> None:
    a = Proc(tmp_path)
    a.loop(range(5), 0.0)
    a.finish(5.0)
    a.write()
    b = Proc(tmp_path, start=100.0)
    b.loop(range(3), 100.0)
    b.finish(103.0)
    b.write()
    loaded = load(tmp_path)
    last = analyze(loaded)
    assert (last.jobs, last.job) == (2, 1)
    assert buckets_s(last.partition) == {"productive": 3.0}
    assert any("reused run directory" in w for w in last.warnings)
    first = analyze(loaded, job=0)
    assert buckets_s(first.partition) == {"productive": 5.0}


def test_user_overhead_category_and_user_data_rule(tmp_path: Path) -> None:
    p = Proc(tmp_path, overhead=("sync_weights",))
    t = p.loop(range(2), 0.0)
    p.span("push", t, t + 1, cat="sync_weights")
    p.loop(range(2, 4), t + 1)
    p.finish(5.0)
    p.write()
    result = analyze(load(tmp_path))
    assert buckets_s(result.partition) == {"productive": 4.0, "sync_weights": 1.0}


def test_interval_goodput_and_rolling_periods(tmp_path: Path) -> None:
    p = Proc(tmp_path)
    p.span("init", 0, 2)
    p.loop(range(5), 2.0)
    p.finish(8.0)
    p.write()
    loaded = load(tmp_path)
    result = analyze(loaded, window=(1.0, 4.0), rolling_s=3.0)
    assert result.window is not None
    assert buckets_s(result.window) == {"startup": 1.0, "productive": 2.0}
    assert [(w.start_s, w.end_s, w.productive_s) for w in result.rolling] == [
        (0.0, 3.0, 1.0), (3.0, 6.0, 3.0), (6.0, 8.0, 1.0)
    ]
    last = analyze(loaded, window=(-2.0, -0.0 - 1e-12))
    assert last.window is not None and last.window.total_ns > 0


def test_anomaly_lists_what_overlapped(tmp_path: Path) -> None:
    p = Proc(tmp_path)
    t = 0.0
    for k in range(10):
        length = 3.0 if k == 6 else 1.0
        p.step(k, t, t + length).sync(k, t + length)
        p.span("forward", t, t + 0.5, cat="compute", step=k)  # usual in every step
        p.event("probe" if k != 6 else "nan_check", t + 0.25, step=k)  # an event every step
        if k == 6:
            p.tag(6, "lr_drop", t + 0.5)
            p.span("allreduce", t + 0.5, t + 2.5, cat="compute", step=6)
        t += length
    p.finish(t)
    p.write()
    result = analyze(load(tmp_path))
    (anomaly,) = result.anomalies
    assert anomaly.step == 6 and anomaly.productive_s == 3.0
    assert "tag:lr_drop" in anomaly.overlapped
    # the events of its own step, not the other steps'
    assert [x for x in anomaly.overlapped if x.startswith("event:")] == ["event:nan_check"]
    assert "span:allreduce 2.000s (usually 0.000s)" in anomaly.overlapped
    # a span that took its usual time in the slow step is not what made it slow: not listed
    assert not [x for x in anomaly.overlapped if x.startswith("span:forward")]


def test_mfu_and_goodput_product(tmp_path: Path) -> None:
    p = Proc(tmp_path, submit=-2.0, world=1)
    p.loop(range(4), 0.0)
    p.finish(4.0)
    p.write()
    result = analyze(load(tmp_path), flops_per_step=100e12, accelerator="h100")
    assert buckets_s(result.partition) == {"productive": 4.0, "scheduling": 2.0}
    program = result.program
    assert program.mfu == pytest.approx(100e12 / 989e12)
    assert program.scheduling_goodput == pytest.approx(4 / 6)
    assert program.runtime_goodput == 1.0
    assert program.ml_productivity_goodput == pytest.approx(4 / 6 * 100 / 989)


def test_missing_rank_zero_and_older_schema(tmp_path: Path) -> None:
    p = Proc(tmp_path, rank=1, world=2, schema_version=0)
    p.loop(range(3), 0.0)
    p.finish(3.0)
    p.write()
    result = analyze(load(tmp_path))
    assert result.reference_rank == 1
    assert buckets_s(result.partition) == {"productive": 3.0}
    text = " ".join(result.warnings)
    assert "older schema version 0" in text and "rank 0 has no records" in text and "1 of 2 ranks" in text


def test_device_idle_gap_charges_data_loading_in_an_asynchronous_loop(tmp_path: Path) -> None:
    p = Proc(tmp_path)
    for k in range(5):
        p.step(k, k, k + 0.3).span("data", k, k + 0.25, step=k).sync(k, k + 1.0, "lag")
        p.metric("device/busy_s", k, 0.9, k + 1.0)
        p.metric("device/idle_s", k, 0.1 if k == 2 else 0.0, k + 1.0)  # the device waited for step 2's batch
    p.finish(5.0)
    p.write()
    result = analyze(load(tmp_path))
    assert result.host_overhead.rule == "device idle"
    assert buckets_s(result.partition) == {"productive": 4.9, "data": 0.1}
    rows = {r.step: r for r in result.steps}
    assert rows[2].overhead_s == {"data": 0.1} and rows[2].device_s == 0.9


def test_an_attempt_without_rank_zero_is_stood_for_by_its_lowest_rank(tmp_path: Path) -> None:
    for rank in (0, 1):
        a0 = Proc(tmp_path, rank=rank, world=2, restart=0)
        a0.loop(range(3), 0.0)
        a0.heartbeat(3.5)
        a0.write()
    a1 = Proc(tmp_path, rank=1, world=2, restart=1, start=5.0)  # rank 0's files of attempt 1 are lost
    a1.loop(range(3, 6), 5.0)
    a1.finish(8.0)
    a1.write()
    result = analyze(load(tmp_path))
    assert buckets_s(result.partition) == {"productive": 6.0, "disruption": 2.0}
    assert any("attempt 1: rank 0 has no records" in w for w in result.warnings)


@pytest.mark.parametrize(("now", "ended", "tail"), [(12.0, "running", "in_progress"), (100.0, "lost", "disruption")])
def test_a_live_run_is_running_not_crashed(tmp_path: Path, now: float, ended: str, tail: str) -> None:
    p = Proc(tmp_path)
    p.loop(range(8), 0.0)
    p.heartbeat(10.0)  # alive at 10 s, no finish record yet
    p.write()
    result = analyze(load(tmp_path), now_wall_ns=WALL0 + ns(now))
    assert result.attempts[0].ended == ended
    assert buckets_s(result.partition) == {"productive": 8.0, tail: 2.0}
