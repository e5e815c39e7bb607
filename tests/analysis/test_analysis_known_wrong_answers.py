"""Every "known wrong answer" of docs/semantics.md section 10, as a named test showing goodtrace gets
it right. Some record through the real API with a fake clock and a fake asynchronous device
(reading a value jumps the clock to when the device finishes it); others write timelines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import goodtrace as gt
from goodtrace.analysis import analyze
from goodtrace.testing import FakeClock
from helpers.builders import Proc, buckets_s, load
from helpers.shapes import MS, bound_ns, buckets, done_ns, retried
from helpers.views import assert_views_agree

DATA = Path(__file__).parent.parent / "data" / "runs"


class FakeValue:
    def __init__(self, device: FakeDevice, done_ns: int) -> None:
        self.device = device
        self.done_ns = done_ns

    def __goodtrace_ready__(self) -> bool:
        return self.device.clock.now_ns >= self.done_ns

    def __goodtrace_wait__(self) -> None:
        clock = self.device.clock
        clock.now_ns = max(clock.now_ns, self.done_ns)


class FakeDevice:
    """One in-order stream: a kernel starts when launched or when the previous one ends."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.busy_until = 0

    def launch(self, seconds: float) -> FakeValue:
        self.busy_until = max(self.busy_until, self.clock.now_ns) + round(seconds * 1e9)
        return FakeValue(self, self.busy_until)


def record_async_loop(run_dir: Path, *, blocking: str | None = None, blocking_s: float = 2.0) -> None:
    """Five steps dispatched in 10 ms each; step 0 runs 5 s on the device (compilation), the
    others 1 s; optionally a blocking span after step 2. Lag 1: step k is observed when
    step k+1 ends."""
    clock = FakeClock(start_ns=1_000_000_000)
    device = FakeDevice(clock)
    gt.init(run_dir, clock=clock, rank=0, world_size=1, record_gc=False)
    try:
        for k in range(5):
            with gt.step(k) as s:
                clock.advance(0.01)
                s.complete_on(device.launch(5.0 if k == 0 else 1.0))
            if blocking and k == 2:
                with gt.span(blocking):
                    clock.advance(blocking_s)
    finally:
        gt.finish(completed=True)


def test_step_zero_is_not_reported_fast_although_it_compiled(tmp_path: Path) -> None:
    record_async_loop(tmp_path)
    result = analyze(load(tmp_path))
    first = result.steps[0]
    assert first.step == 0 and first.step_time_s == pytest.approx(5.01)  # a host timer says 0.01 s
    # nothing says it compiled (no compile span): the excess is warm-up, named as inferred
    assert first.overhead_s == {"warmup": pytest.approx(4.01)}
    assert result.partition.buckets_ns["warmup"] == 4_010_000_000


def test_a_step_time_is_not_reported_under_another_step(tmp_path: Path) -> None:
    record_async_loop(tmp_path)
    result = analyze(load(tmp_path))
    # host time between step entries: 0.01, 5.0, 1.0, 1.0 -- step 0's compile lands on step 1
    assert [round(r.step_time_s, 6) for r in result.steps] == [5.01, 1.0, 1.0, 1.0, 1.0]
    assert buckets_s(result.partition) == {"productive": 5.0, "warmup": 4.01}


def test_checkpoint_time_is_neither_missing_nor_includes_the_wait_for_the_step(tmp_path: Path) -> None:
    record_async_loop(tmp_path, blocking="checkpoint")
    result = analyze(load(tmp_path))
    # The span settles step 2 first (a 1.99 s wait), then measures the 2 s save alone.
    assert result.partition.buckets_ns["checkpoint_save"] == 2_000_000_000
    rows = {r.step: r for r in result.steps}
    assert rows[3].overhead_s == {"checkpoint_save": 2.0}
    assert rows[3].step_time_s == pytest.approx(3.01) and rows[2].step_time_s == pytest.approx(1.0)
    assert sum(result.partition.buckets_ns.values()) == result.partition.total_ns


def test_eval_time_is_not_missing_from_all_steps(tmp_path: Path) -> None:
    record_async_loop(tmp_path, blocking="eval", blocking_s=3.0)
    result = analyze(load(tmp_path))
    assert result.partition.buckets_ns["eval"] == 3_000_000_000
    assert {r.step: r.overhead_s for r in result.steps}[3] == {"eval": 3.0}


@pytest.mark.processes
def test_an_idle_tail_after_the_last_step_is_not_productive(tmp_path: Path) -> None:
    """The real recorder in a child process on the simulated device: the last step's value is
    looked at only at finish(), 360 ms after the device finished it. Its completion must be
    dated when it became ready, so the tail is teardown (tolerance: see helpers.shapes)."""
    def check(truth: dict[str, Any], report: dict[str, Any]) -> list[str]:
        b = bound_ns(truth)
        ends = done_ns(truth)
        tail_truth = truth["device"][-1]["done_ns"]
        misses = []
        steps = report["steps"]
        last = steps[-1]
        if abs(last["step_time_s"] * 1e9 - (ends[-1] - ends[-2])) > b:
            misses.append(f"last step {last['step_time_s']:.4f} s, device {(ends[-1] - ends[-2]) / 1e9:.4f} s")
        teardown = buckets(report).get("teardown", 0)
        finish_t = report["attempts"][0]["end_wall_ns"]
        if teardown < 340 * MS:  # the 360 ms idle tail (and the finish) after the last completion
            misses.append(f"teardown {teardown / 1e6:.1f} ms < 340 ms")
        if report["attempts"][0]["ended"] != "completed" or finish_t <= 0 or tail_truth is None:
            misses.append(f"ended {report['attempts'][0]['ended']}")
        return misses

    run_dir, _, report = retried("idle_tail", tmp_path, check)
    assert_views_agree(run_dir)
    assert report["goodput"] < 0.5  # 8 x 40 ms productive of well over 0.7 s


def test_steps_logged_every_tenth_step_do_not_count_as_zero(tmp_path: Path) -> None:
    p = Proc(tmp_path)
    for k in range(30):
        p.step(k, k * 2.0, k * 2.0 + 0.01)
        if k % 10 == 9:
            p.sync(k, k * 2.0 + 2.0, "lag")
    p.finish(60.0)
    p.write()
    result = analyze(load(tmp_path))
    assert buckets_s(result.partition) == {"productive": 60.0}
    assert {r.productive_s for r in result.steps} == {2.0}


def test_a_restart_from_step_zero_is_wasted_progress_not_other(tmp_path: Path) -> None:
    a0 = Proc(tmp_path)
    a0.loop(range(10), 0.0)
    a0.heartbeat(10.0)
    a0.write()
    a1 = Proc(tmp_path, start=12.0)
    a1.loop(range(10), 12.0)
    a1.finish(22.0)
    a1.write()
    result = analyze(load(tmp_path))
    assert buckets_s(result.partition) == {"productive": 10.0, "wasted_progress": 10.0, "disruption": 2.0}
    assert "other" not in result.partition.buckets_ns


def test_buckets_never_add_up_to_more_than_100_percent(tmp_path: Path) -> None:
    p = Proc(tmp_path)
    p.span("init", -1.0, 0.5)  # before the process start: clipped
    p.loop(range(6), 0.5)
    p.span("eval", 1.0, 3.0, step=1)
    p.span("gc", 1.5, 2.5, step=1)  # nested
    p.span("checkpoint", 2.5, 4.0, step=2)  # partial overlap with eval
    p.span("checkpoint", 0.0, 6.0, tid=7)  # another thread
    p.span("profile", 5.5, 9.0)  # ends after finish(): the process lived until 9 s
    p.finish(7.0)
    p.write()
    partition = analyze(load(tmp_path)).partition
    assert sum(partition.buckets_ns.values()) == partition.total_ns == 9_000_000_000
    assert buckets_s(partition) == {
        "startup": 0.5, "eval": 2.0, "checkpoint_save": 1.0, "productive": 2.0, "profile": 3.5,
    }


def test_a_reused_run_name_does_not_silently_merge_two_jobs(tmp_path: Path) -> None:
    old = Proc(tmp_path, restart=0)
    old.loop(range(100, 110), 0.0)
    old.finish(10.0)
    old.write()
    new = Proc(tmp_path, restart=0, start=3600.0)
    new.loop(range(5), 3600.0)
    new.finish(3605.0)
    new.write()
    result = analyze(load(tmp_path))
    assert result.jobs == 2 and len(result.attempts) == 1
    assert result.partition.total_ns == 5_000_000_000
    assert any("reused run directory" in w for w in result.warnings)


def test_per_rank_durations_do_not_hide_a_rank_late_at_every_collective() -> None:
    result = analyze(load(DATA / "restart_2ranks"))
    medians = {f.rank: f.step_time_median_s for f in result.spread.per_rank}
    assert medians == {0: 1.0, 1: 1.0}  # per-rank step times look identical...
    (straggler,) = result.stragglers  # ...but rank 1 reaches every sync point 0.2 s late
    assert (straggler.rank, straggler.host) == (1, "node1")
    late = {f.rank: f.lateness_median_s for f in result.spread.per_rank}  # against the other ranks
    assert late[1] == pytest.approx(0.2) and late[0] == pytest.approx(-0.2)
    # each rank's own cut: rank 1's steps take as long as rank 0's, only later
    cuts = {result.sessions[i].rank: c for i, c in result.cuts.items() if result.attempt_of[i] == 0}
    assert list(cuts[1].exec_step) == list(cuts[0].exec_step)
    assert {cuts[1].interval_end[w] - cuts[1].interval_start[w] for w in (1, 2)} == {1_000_000_000}


@pytest.mark.parametrize("measured", [True, False])
def test_lateness_is_measured_on_the_aligned_clock(tmp_path: Path, measured: bool) -> None:
    """Rank 1's wall clock is 0.5 s ahead; its measured offset to rank 0 puts its sync points
    where they belong. Without a measurement the skew reads as lateness (and is reported: at
    more sampled steps than naming needs, evidence.MIN_SAMPLES)."""
    procs = [Proc(tmp_path, rank=r, world=2, host=f"node{r}", wall_skew=0.5 * r) for r in (0, 1)]
    for p in procs:
        p.loop(range(10), 0.0)
        p.finish(10.0)
    if measured:
        procs[1].clock(procs[0].mono_base - procs[1].mono_base, 0.5)
    for p in procs:
        p.write()
    result = analyze(load(tmp_path))
    late = {f.rank: f.lateness_median_s for f in result.spread.per_rank}
    if measured:
        assert late == {0: 0.0, 1: 0.0} and result.stragglers == ()
    else:
        assert late[1] == 0.5 and [s.rank for s in result.stragglers] == [1]
