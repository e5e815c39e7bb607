"""The recording API: spans, steps, tags, events, metrics, disabled mode, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import goodtrace as gt
from goodtrace import schema
from goodtrace.read.sessions import Session, assign_attempts, read_run
from goodtrace.record.config import Config, ConfigError
from goodtrace.record.process import discover_identity, process_start_mono_ns
from goodtrace.record.recorder import Recorder
from goodtrace.testing import FakeClock, capture
from helpers.cli import goodtrace


@pytest.mark.processes
def test_import_loads_the_standard_library_only() -> None:
    code = (
        "import sys, goodtrace; "
        "print([m for m in ('torch','jax','duckdb','rich','numpy','fsspec','goodtrace.analysis',"
        "'goodtrace.renderers','goodtrace.sinks','goodtrace.record.live.sink_hub','tensorboardX','tensorboard',"
        "'wandb','mlflow','prometheus_client','transformers','lightning') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_spans_with_a_fake_clock_have_exact_times() -> None:
    clock = FakeClock()
    with capture(clock=clock) as cap:
        with gt.step(0):
            with gt.span("data"):
                clock.advance(0.25)
            with gt.span("forward", attrs={"layers": 4}):
                clock.advance(0.5)
                with gt.span("attention"):
                    clock.advance(0.125)
    spans = {r["name"]: r for r in cap.records("span")}
    assert spans["data"]["t1"] - spans["data"]["t0"] == 250_000_000
    assert spans["data"]["cat"] == "data"
    assert spans["forward"]["t1"] - spans["forward"]["t0"] == 625_000_000
    assert spans["forward"]["attrs"] == {"layers": 4}
    assert spans["attention"]["cat"] == "compute"
    assert spans["forward"]["t0"] <= spans["attention"]["t0"] <= spans["attention"]["t1"] <= spans["forward"]["t1"]
    assert {r["step"] for r in spans.values()} == {0}


def test_default_categories_and_explicit_ones() -> None:
    with capture(record_gc=False, overhead_categories=("logging_upload",)) as cap:
        for name in ("checkpoint", "eval", "validate", "gc", "forward"):
            with gt.span(name):
                pass
        with gt.span("upload", category="logging_upload"):
            pass
    cats = {r["name"]: r["cat"] for r in cap.records("span")}
    assert cats == {
        "checkpoint": "checkpoint_save", "eval": "eval", "validate": "eval", "gc": "gc",
        "forward": "compute", "upload": "logging_upload",
    }


def test_exception_closes_the_span_marks_it_and_propagates() -> None:
    with capture(record_gc=False) as cap:
        with pytest.raises(ZeroDivisionError):
            with gt.span("boom"):
                1 / 0  # noqa: B018
        with gt.span("fine"):
            pass
    errors = {r["name"]: r["err"] for r in cap.records("span")}
    assert errors == {"boom": True, "fine": False}


def test_decorators_with_and_without_a_name_even_before_init() -> None:
    @gt.span("named")
    def named(x: int) -> int:
        return x + 1

    @gt.span
    def bare() -> str:
        return "ok"

    with capture() as cap:
        assert named(1) == 2
        assert bare() == "ok"
        assert named(2) == 3
    names = [r["name"] for r in cap.records("span")]
    assert names.count("named") == 2
    assert any(name.endswith("bare") for name in names)


def test_spans_from_threads_keep_their_own_thread_id() -> None:
    def worker() -> None:
        for _ in range(100):
            with gt.span("thread-work"):
                pass

    with capture() as cap:
        threads = [threading.Thread(target=worker) for _ in range(4)]
        for thread in threads:
            thread.start()
        with gt.span("main-work"):
            pass
        for thread in threads:
            thread.join()
    spans = cap.records("span")
    main_tid = cap.run.sessions[0].header["main_tid"]  # type: ignore[union-attr]
    assert sum(1 for r in spans if r["name"] == "thread-work") == 400
    assert len({r["tid"] for r in spans if r["name"] == "thread-work"} - {main_tid}) >= 1
    assert [r["tid"] for r in spans if r["name"] == "main-work"] == [main_tid]


def test_tags_events_metrics_and_host_completion() -> None:
    with capture() as cap:
        with gt.step(7) as s:
            gt.tag("lr_drop")
            gt.event("preempted", signal=15)
            gt.metric("loss", np.float32(2.5), reduce="mean")
            gt.metric("tokens", 1024, reduce="sum")
            gt.metric("nan", float("nan"))
            s.complete_on(np.float64(2.5))
    assert cap.records("tag") == [{"kind": "tag", "step": 7, "name": "lr_drop", "t": cap.records("tag")[0]["t"]}]
    (event,) = cap.records("event")
    assert event["name"] == "preempted" and event["attrs"] == {"signal": 15} and event["step"] == 7
    metrics = {r["name"]: (r["value"], r["reduce"]) for r in cap.records("metric")}
    assert metrics == {"loss": (2.5, "mean"), "tokens": (1024.0, "sum"), "nan": (None, "mean")}
    (sync,) = cap.records("sync")
    assert sync["how"] == "host" and sync["step"] == 7


def test_bad_input_warns_and_never_raises_into_the_loop() -> None:
    with capture() as cap:
        with pytest.warns(gt.GoodtraceWarning, match="reduce must be one of"):
            gt.metric("loss", 1.0, reduce="avg")
        with pytest.warns(gt.GoodtraceWarning, match="cannot wait on"):
            gt.complete_on(object())
        with pytest.warns(gt.GoodtraceWarning, match="not recorded"):
            gt.metric("vector", np.ones(3))
        with pytest.warns(gt.GoodtraceWarning, match="step number must be an int"):
            with gt.step("seven"):  # type: ignore[arg-type]
                pass
        with gt.step(np.int64(3)):
            pass
        with gt.span(["unhashable"]):  # type: ignore[call-overload]
            pass
        with gt.span("x", attrs={"obj": object(), "inf": float("inf")}):
            pass
    names = [r["name"] for r in cap.records("span")]
    assert "['unhashable']" in names
    (odd,) = [r for r in cap.records("span") if r["name"] == "x"]
    assert odd["attrs"]["inf"] is None and odd["attrs"]["obj"].startswith("<object")
    assert [r["step"] for r in cap.records("step")] == [0, 3]
    assert cap.run.problems == []  # type: ignore[union-attr]


def test_hostile_names_round_trip_unchanged() -> None:
    hostile = ['<img src=x onerror=alert(1)>', 'quote"back\\slash', "new\nline", "\u2028emoji 🚀", ""]
    with capture(record_gc=False) as cap:
        for name in hostile:
            with gt.span(name):
                pass
            gt.tag(name)
    assert [r["name"] for r in cap.records("span")] == hostile
    assert [r["name"] for r in cap.records("tag")] == hostile


def test_disabled_mode_is_one_shared_no_op_and_writes_nothing(tmp_path: Any) -> None:
    run_dir = tmp_path / "run"
    gt.init(run_dir, enabled=False)
    try:
        first, second = gt.span("a"), gt.span("b", category="eval")
        assert first is second
        with first:
            pass
        assert gt.step(1) is gt.step(2)

        @gt.span("f")
        def f() -> int:
            return 1

        assert f() == 1 and f.__name__ == "f"
        gt.metric("loss", 1.0)
        gt.complete_on(1.0)
        assert not gt.is_enabled()
    finally:
        gt.finish()
    assert not run_dir.exists()


def test_environment_disables_recording(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOODTRACE_ENABLED", "0")
    gt.init(tmp_path / "run")
    try:
        assert not gt.is_enabled()
    finally:
        gt.finish()


def test_excluded_ranks_get_the_no_op(tmp_path: Any) -> None:
    gt.init(tmp_path / "run", rank=3, world_size=8, ranks=[0])
    try:
        assert not gt.is_enabled()
    finally:
        gt.finish()


def test_init_twice_is_a_clear_error(tmp_path: Any) -> None:
    gt.init(tmp_path / "a")
    try:
        with pytest.raises(RuntimeError, match="already recording"):
            gt.init(tmp_path / "b")
    finally:
        gt.finish()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lag": -1}, "lag must be between"),
        ({"lag": 1.5}, "lag must be an int"),
        ({"flush_interval_s": float("nan")}, "flush_interval_s must be between"),
        ({"flush_interval_s": "1"}, "flush_interval_s must be a number"),
        ({"overhead_categories": "eval"}, "sequence of non-empty strings"),
        ({"bogus": 1}, "unknown config option"),
    ],
)
def test_config_rejects_bad_values_clearly(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Config.from_env({}, **options)


def test_config_from_environment() -> None:
    config = Config.from_env({"GOODTRACE_LAG": "2", "GOODTRACE_FLUSH_INTERVAL_S": "0.5"})
    assert config.lag == 2 and config.flush_interval_s == 0.5


def test_a_bad_environment_variable_is_warned_about_and_the_default_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launcher's ``GOODTRACE_LAG=x`` must not fail the job's ``init``: one warning naming the
    variable and value, the default used; the program's own bad keyword still raises."""
    monkeypatch.setenv("GOODTRACE_LAG", "x")
    monkeypatch.setenv("GOODTRACE_FLUSH_INTERVAL_S", "0")  # parses, but out of range
    monkeypatch.setenv("GOODTRACE_SINKS", "nonsense")
    with pytest.warns(gt.GoodtraceWarning) as caught:
        rec = gt.init(tmp_path / "run")
    messages = [str(w.message) for w in caught]
    assert sum("GOODTRACE_LAG='x'" in m for m in messages) == 1
    assert sum("GOODTRACE_FLUSH_INTERVAL_S='0'" in m for m in messages) == 1
    assert sum("GOODTRACE_SINKS" in m and "nonsense" in m for m in messages) == 1
    assert gt.is_enabled() and rec.config.lag == 1 and rec.config.flush_interval_s == Config().flush_interval_s
    assert rec.sink_hub is None  # type: ignore[union-attr]
    with gt.step(0):
        pass
    assert gt.finish()
    with pytest.raises(ConfigError, match="lag must be an int"):
        gt.init(tmp_path / "run2", lag="x")
    assert not gt.is_enabled()


def test_rank_discovery_from_launcher_variables() -> None:
    ident = discover_identity(environ={"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "TORCHELASTIC_RESTART_COUNT": "2"})
    assert (ident.rank, ident.world_size, ident.local_rank, ident.restart) == (3, 8, 1, 2)
    slurm = discover_identity(environ={"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_RESTART_COUNT": "1"})
    assert (slurm.rank, slurm.world_size, slurm.restart) == (5, 16, 1)
    assert discover_identity(environ={}).rank == 0
    with pytest.raises(ValueError, match="invalid rank 9 for world size 4"):
        discover_identity(environ={"RANK": "9", "WORLD_SIZE": "4"})


@pytest.mark.processes
def test_process_start_comes_from_the_os_and_precedes_init() -> None:
    code = (
        "import time; time.sleep(0.3); import goodtrace.record.process as p, time; "
        "s, src = p.process_start_mono_ns(); print(time.perf_counter_ns() - s, src)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    age_ns, source = out.stdout.split()
    assert source == "os"
    assert int(age_ns) >= 0.3e9  # interpreter start-up and the sleep are visible
    start, _ = process_start_mono_ns()
    assert start < time.perf_counter_ns()


def test_header_and_heartbeats_carry_clock_anchors(tmp_path: Any) -> None:
    gt.init(tmp_path / "run", rank=1, world_size=2, flush_interval_s=0.02)
    time.sleep(0.1)
    gt.finish()
    run = read_run(tmp_path / "run")
    (session,) = run.sessions
    header = session.header
    assert header["schema"] == schema.SCHEMA_VERSION
    assert (header["rank"], header["world"], header["pid"]) == (1, 2, os.getpid())
    assert header["proc_start_mono"] <= header["init_mono"] <= header["mono"]
    beats = session.of_kind("heartbeat")
    assert len(beats) >= 3
    for beat in beats:  # every heartbeat is a (wall, mono) anchor consistent with the header
        assert abs(session.wall_ns(beat["mono"]) - beat["wall"]) < 50_000_000
    assert session.finish is not None and session.finish["completed"] is True


def _session(rank: int, start_s: float, end_s: float, restart: int | None = None) -> Session:
    header = {
        "kind": "header", "schema": 1, "session": f"s{rank}-{start_s}", "rank": rank,
        "restart": restart, "wall": int(start_s * 1e9), "mono": 0, "proc_start_mono": 0,
    }
    return Session(header=header, records=[{"kind": "heartbeat", "mono": int((end_s - start_s) * 1e9)}])


def test_attempts_from_records_when_no_launcher_counter() -> None:
    sessions = [_session(0, 0, 100), _session(1, 0.5, 99), _session(0, 130, 200), _session(1, 131, 200),
                _session(0, 300, 400)]
    assign_attempts(sessions)
    assert [s.attempt for s in sessions] == [0, 0, 1, 1, 2]


def test_attempts_from_launcher_restart_counter() -> None:
    # The counter changing to 3 opens attempt 1 although rank 1 of attempt 0 was still alive.
    sessions = [_session(0, 0, 100, restart=0), _session(1, 5, 150, restart=0),
                _session(0, 120, 300, restart=3), _session(1, 121, 300, restart=3)]
    assign_attempts(sessions)
    assert [s.attempt for s in sessions] == [0, 0, 1, 1]


@pytest.mark.processes
def test_records_command_lists_sessions(tmp_path: Any) -> None:
    gt.init(tmp_path / "run")
    gt.finish()
    out = goodtrace("records", str(tmp_path / "run"), "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["sessions"]
    assert len(rows) == 1 and rows[0]["ended"] == "finished"
    bad = goodtrace("records", str(tmp_path / "nothing"))
    assert bad.returncode == 2 and "is not a directory" in bad.stderr and "Traceback" not in bad.stderr


def test_listeners_hear_step_begins_overhead_spans_and_finish() -> None:
    clock = FakeClock()
    heard: list[tuple[Any, ...]] = []
    with capture(clock=clock, overhead_categories=("upload",), blocking_categories=("sync_point",)):
        rec = gt.recorder()
        assert isinstance(rec, Recorder)
        rec.step_begin_listeners.append(lambda step, t0: heard.append(("begin", step)))
        rec.overhead_span_listeners.append(lambda cat, t0, t1: heard.append(("overhead", cat, t1 - t0)))
        rec.finish_listeners.append(lambda completed, reason: heard.append(("finish", completed, reason)))
        with gt.step(3):
            with gt.span("forward"):  # compute: no listener call on the fast path
                clock.advance(1)
            with gt.span("checkpoint"):
                clock.advance(2)
            with gt.span("push", category="upload"):
                clock.advance(0.5)
            with gt.span("wait", category="sync_point"):  # blocking but productive: not overhead
                clock.advance(0.25)
        rec.record_span("jit", schema.COMPILE, clock(), clock() + 10**9)
    assert heard == [
        ("begin", 3),
        ("overhead", "checkpoint_save", 2 * 10**9),
        ("overhead", "upload", 5 * 10**8),
        ("overhead", "compile", 10**9),
        ("finish", True, "finish"),
    ]
