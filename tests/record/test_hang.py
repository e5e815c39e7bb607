"""The hang watchdog (goodtrace.record.hang): the bound it learns from the rank's own history
(steps, and phases of the same category seen before), its options, and a real stall seen by its
thread, recorded with the training thread's stack and then seen to be over."""

from __future__ import annotations

import json
import shutil
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

import goodtrace as gt
from goodtrace.record.hang import HANG_EVENT, HANG_OVER_EVENT, HangPolicy, HangWatchdog

pytestmark = pytest.mark.processes

MS = 1_000_000
S = 1_000_000_000


def _events(run_dir: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for f in sorted(run_dir.glob("rank-*/*.jsonl")) for line in f.read_text().splitlines()]
    return [r for r in lines if r["kind"] == "event" and r["name"] in (HANG_EVENT, HANG_OVER_EVENT)]


@pytest.fixture
def watchdog(tmp_path: Path) -> Any:
    """A watchdog on a real recorder, driven by hand (its thread not started): hooks and
    check() are called with chosen times. Without gc spans: one the collector records on this
    thread (with the real clock, far past the chosen times) is progress the watchdog reads from
    the recorder's buffer, and hides the silence a test sets up (seen on a loaded machine)."""
    gt.init(tmp_path, record_gc=False)
    dog = HangWatchdog(gt.recorder(), HangPolicy(floor_s=0.001, ceiling_s=1000.0))  # type: ignore[arg-type]
    dog.training_thread = threading.get_ident()
    yield dog
    gt.finish()


def _steps(dog: HangWatchdog, first: int, count: int, t: int, every: int = 100 * MS) -> int:
    for step in range(first, first + count):
        dog.on_step_begin(step, t)
        dog.on_step_end(step, t, t + every // 2)
        t += every
    return t


def test_no_bound_before_min_steps_then_ten_median_steps(watchdog: HangWatchdog) -> None:
    t = _steps(watchdog, 0, 4, 0)
    assert watchdog.bound_ns() is None  # 3 intervals: nothing learned yet
    t = _steps(watchdog, 4, 10, t)
    assert watchdog.bound_ns() == 10 * 100 * MS
    watchdog.check(t + 1 * S - 50 * MS)  # silent 0.95 s since the last step's end: below 1 s
    assert watchdog.hangs == 0
    watchdog.check(t + 2 * S)
    assert watchdog.hangs == 1 and watchdog.hung_since == t - 50 * MS


def test_a_checkpoint_is_bounded_by_the_longest_one_seen_and_a_first_one_by_the_ceiling(
        watchdog: HangWatchdog, tmp_path: Path) -> None:
    t = _steps(watchdog, 0, 20, 0)
    watchdog.on_blocking_span("checkpoint_save", t)
    assert watchdog.bound_ns() == 1000 * S  # never seen: the ceiling
    watchdog.check(t + 30 * S)  # a first checkpoint 300x the step: no alarm
    watchdog.on_overhead_span("checkpoint_save", t, t + 30 * S)
    t = _steps(watchdog, 20, 10, t + 30 * S)
    watchdog.on_blocking_span("checkpoint_save", t)
    assert watchdog.bound_ns() == 2 * 30 * S
    watchdog.check(t + 59 * S)
    assert watchdog.hangs == 0
    watchdog.check(t + 61 * S)
    assert watchdog.hangs == 1
    (event,) = _events(tmp_path)  # in the file already: the watchdog flushed it
    assert event["attrs"]["phase"] == "checkpoint_save" and event["attrs"]["step"] == 29
    assert event["attrs"]["silent_s"] == 61.0 and event["attrs"]["bound_s"] == 60.0


def test_a_span_closed_inside_the_step_is_progress(watchdog: HangWatchdog) -> None:
    """Seen in the Python writer's buffer, or read back from the file (the native writer)
    before a hang would be recorded."""
    t = _steps(watchdog, 0, 10, 0)  # bound: 1 s
    watchdog.on_step_begin(10, t)
    with gt.span("forward"):  # a real span of this (the training) thread
        pass
    closed_by = time.perf_counter_ns()
    watchdog.check(closed_by + S // 2)  # long after the step's entry, 0.5 s after the span
    assert watchdog.hangs == 0 and watchdog.last_span == "forward"
    assert t < watchdog.last_progress <= closed_by


def test_another_threads_span_is_no_progress(watchdog: HangWatchdog) -> None:
    """A gc pause paid by another thread (the watchdog's own, reading a stack's source) is
    recorded as a span there: it is not the training thread's progress."""
    t = _steps(watchdog, 0, 10, 0)
    other = threading.Thread(target=watchdog.on_overhead_span, args=("gc", t, t + S))
    other.start()
    other.join()
    assert watchdog.last_progress == t - 50 * MS  # the last step's end
    watchdog.on_overhead_span("gc", t, t + S)  # the training thread's own
    assert watchdog.last_progress == t + S


@gt.span("fetch")
def _decorated(check: Any) -> None:
    check()


def _callee(check: Any) -> None:
    check()


def test_the_hang_event_names_the_span_the_thread_is_in(watchdog: HangWatchdog, tmp_path: Path) -> None:
    """Spans record nothing until they close: the span a hung thread is in (open) is read from
    its stack's source, innermost first, through frames without one."""
    _steps(watchdog, 0, 10, 0)  # bound: 1 s
    step = 10

    def hang() -> None:
        nonlocal step
        watchdog.on_step_begin(step, time.perf_counter_ns())  # progress: a recorded hang is over
        step += 1
        for _ in range(2):  # (the hang over, then the next one)
            watchdog.check(time.perf_counter_ns() + 100 * S)

    with gt.span("data"):
        hang()
    label = "tokenize"
    with gt.span(label):
        hang()
    with gt.span("outer"), threading.Lock():
        with gt.span("inner"):
            hang()
    with gt.span("data"):
        _callee(hang)
    _decorated(hang)
    hang()
    watchdog.recorder.flush(5.0)
    found = [e["attrs"]["in_span"] for e in _events(tmp_path) if e["name"] == HANG_EVENT]
    assert found == ["data", "tokenize", "inner", "data", "fetch", None]


def test_the_floor_and_the_ceiling_clamp_the_bound(tmp_path: Path) -> None:
    gt.init(tmp_path)
    try:
        dog = HangWatchdog(gt.recorder(), HangPolicy(floor_s=5.0, ceiling_s=6.0))  # type: ignore[arg-type]
        _steps(dog, 0, 10, 0)  # 10 x 0.1 s = 1 s: the floor wins
        assert dog.bound_ns() == 5 * S
        _steps(dog, 10, 300, 10 * S, every=2 * S)  # 10 x 2 s = 20 s: the ceiling wins
        assert dog.bound_ns() == 6 * S
    finally:
        gt.finish()


@pytest.mark.parametrize("options, message", [
    ({"floor_s": 0}, "floor_s"), ({"ceiling_s": -1}, "ceiling_s"), ({"step_factor": float("nan")}, "step_factor"),
    ({"floor_s": 10, "ceiling_s": 5}, "below floor_s"), ({"min_steps": 1}, "min_steps"),
    ({"on_hang": "explode"}, "on_hang"), ({"check_interval_s": "1"}, "check_interval_s"),
])
def test_a_wrong_option_is_a_clear_error_before_the_job_runs(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        gt.detect_hangs(**options)


def test_detect_hangs_before_init_warns_and_does_nothing() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert gt.detect_hangs() is None
    assert any("call gt.init first" in str(w.message) for w in caught)


def _stall(until_recorded: Path, step: int) -> None:
    """1.5 s of nothing, and on until that run holds the hang event of ``step`` (a loaded
    machine can delay the watchdog, or start py-spy, after a fixed stall has ended)."""
    time.sleep(1.5)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(e["name"] == HANG_EVENT and e["attrs"].get("step") == step for e in _events(until_recorded)):
            return
        time.sleep(0.05)


def test_a_real_stall_is_recorded_with_the_stack_and_then_seen_to_be_over(tmp_path: Path) -> None:
    gt.init(tmp_path, flush_interval_s=0.1)
    dog = gt.detect_hangs(floor_s=0.5, check_interval_s=0.01)
    assert dog is not None
    for step in range(12):
        with gt.step(step):
            with gt.span("forward"):
                time.sleep(0.005)
            if step == 10:
                _stall(tmp_path, 10)
    gt.finish()
    events = _events(tmp_path)  # (a loaded machine may pause the loop elsewhere too: step 10's)
    at = next(i for i, e in enumerate(events) if e["name"] == HANG_EVENT and e["attrs"]["step"] == 10)
    hang, over = events[at: at + 2]
    assert hang["name"] == HANG_EVENT and over["name"] == HANG_OVER_EVENT
    attrs = hang["attrs"]
    assert (attrs["step"], attrs["span"], attrs["function"]) == (10, "forward", "_stall")
    assert attrs["location"].startswith("test_hang.py:") and "_stall(" in attrs["stack"]
    assert attrs["silent_s"] > attrs["bound_s"] >= 0.5
    assert over["attrs"]["since"] == attrs["since"] and over["attrs"]["silent_s"] >= attrs["silent_s"]


@pytest.mark.slow
def test_a_clean_run_with_checkpoints_and_evals_ten_times_the_step_records_no_hang(tmp_path: Path) -> None:
    """Steps of ~50 ms, checkpoints and evals of 10-12 steps' time; the floor (0.3 s) is below
    them, so only the phase rule keeps them from alarming."""
    gt.init(tmp_path, flush_interval_s=0.1)
    dog = gt.detect_hangs(floor_s=0.3, check_interval_s=0.01)
    assert dog is not None
    step_s = 0.05
    for step in range(40):
        with gt.step(step):
            with gt.span("forward"):
                time.sleep(step_s)
        if step % 10 == 9:
            with gt.span("checkpoint"):
                time.sleep((10 + step // 10 % 2) * step_s)  # 0.5 s, 0.55 s, ...
        if step % 15 == 14:
            with gt.span("eval"):
                time.sleep(12 * step_s)
    gt.finish()
    assert dog.bound_ns() is not None and dog.bound_ns() < 0.6 * S  # a long checkpoint would alarm
    assert _events(tmp_path) == []


def test_native_frames_where_py_spy_is_installed(tmp_path: Path) -> None:
    if shutil.which("py-spy") is None:
        pytest.skip("py-spy is not installed")
    gt.init(tmp_path, flush_interval_s=0.1)
    gt.detect_hangs(floor_s=0.5, check_interval_s=0.01)
    for step in range(8):
        with gt.step(step):
            if step == 6:
                _stall(tmp_path, 6)
            time.sleep(0.005)
    gt.finish()
    native = next(e for e in _events(tmp_path) if e["attrs"].get("step") == 6)["attrs"]["native"]
    assert native.startswith(f"Thread {threading.get_native_id()} ") and "_stall (test_hang.py:" in native
    assert "goodtrace-hang" not in native  # only the training thread's frames
