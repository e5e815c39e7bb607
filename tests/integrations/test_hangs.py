"""Hang detection on real gloo ranks: one rank blocks forever at step 20 (before the step's
all-reduce), the others then wait for it in the all-reduce. Every rank's watchdog records a
``hang`` event; the report names the rank that stopped first, with its stack, and where the
others wait, also when the job is SIGKILLed afterwards (as a launcher's timeout would). With
``on_hang="abort"`` the hung rank exits with the hang exit code after recording, and its
attempt ended ``hung``."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from helpers.cli import goodtrace
from helpers.ranks import free_port, rank_context

pytestmark = pytest.mark.processes

torch = pytest.importorskip("torch")

STEPS, HANG_AT, STEP_S = 40, 20, 0.02


def _spin(seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


def block_forever() -> None:
    threading.Event().wait()


def _worker(rank: int, world: int, port: int, run_dir: str, hung_rank: int, on_hang: str) -> None:
    import torch.distributed as dist

    import goodtrace as gt

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    gt.init(run_dir, rank=rank, world_size=world, flush_interval_s=0.2)
    gt.detect_hangs(floor_s=0.5, check_interval_s=0.05, on_hang=on_hang)
    total = torch.ones(4)
    for step in range(STEPS):
        with gt.step(step):
            with gt.span("forward"):
                _spin(STEP_S)
                if rank == hung_rank and step == HANG_AT:
                    block_forever()
            with gt.span("all_reduce"):
                dist.all_reduce(total)
        if step % 10 == 5:  # a checkpoint 10x the step: no alarm
            with gt.span("checkpoint"):
                time.sleep(10 * STEP_S)
    gt.finish()
    dist.destroy_process_group()


def _start(run_dir: Path, world: int, hung_rank: int, on_hang: str, ctx: Any = None) -> list[multiprocessing.process.BaseProcess]:
    ctx = ctx or rank_context()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, str(run_dir), hung_rank, on_hang)) for r in range(world)]
    for p in procs:
        p.start()
    return procs


def _hang_events(run_dir: Path) -> int:
    """Ranks whose files hold a hang event so far."""
    ranks = 0
    for rank_dir in run_dir.glob("rank-*"):
        if any(b'"name":"hang"' in f.read_bytes() for f in rank_dir.glob("*.jsonl")):
            ranks += 1
    return ranks


def _report(run_dir: Path) -> tuple[dict, str]:
    as_json = goodtrace("report", str(run_dir), "--json")
    assert as_json.returncode == 0, as_json.stderr
    console = goodtrace("report", str(run_dir), env={"COLUMNS": "200"})
    assert console.returncode == 0, console.stderr
    return json.loads(as_json.stdout), console.stdout


def test_a_rank_that_blocks_forever_is_named_first_also_after_a_sigkill(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    world, hung = 4, 2
    run_dir = tmp_path / "run"
    # spawned, not forked from the fork server: their stderr is this test's (capfd)
    procs = _start(run_dir, world, hung, "record", multiprocessing.get_context("spawn"))
    err = ""
    try:
        deadline = time.monotonic() + 120
        while (_hang_events(run_dir) < world or "goodtrace: hang:" not in err) and time.monotonic() < deadline:
            time.sleep(0.2)
            err += capfd.readouterr().err
        assert _hang_events(run_dir) == world, "not every rank recorded its hang"
        assert all(p.is_alive() for p in procs)  # recording a hang does not end the job
    finally:
        # every rank killed before any is waited for, as a launcher's timeout does (no finish
        # record): killed and joined one at a time, a waiting rank's all-reduce fails when a
        # peer's connection closes, and it went on to record that (progress after its hang)
        for p in procs:
            if p.pid is not None and p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
        for p in procs:
            p.join(timeout=30)
    report, console = _report(run_dir)
    hangs = report["hangs"]
    assert sorted(h["rank"] for h in hangs) == list(range(world))
    (first,) = [h for h in hangs if h["first"]]
    assert (first["rank"], first["step"], first["span"]) == (hung, HANG_AT, None)
    assert (first["in_span"], first["waiting"]) == ("forward", False)  # the span it is in, open
    assert first["function"] == "block_forever" and first["location"].startswith("test_hangs.py:")
    assert "block_forever()" in first["stack"] and "in _worker" in first["stack"]
    for h in hangs:
        assert h["silent_s"] > h["bound_s"] >= 0.5  # the floor
        if h is not first:  # the others went on to the all-reduce and wait there for it
            assert (h["step"], h["span"]) == (HANG_AT, "forward") and h["since_s"] > first["since_s"]
            assert "all_reduce" in h["stack"] and (h["in_span"], h["waiting"]) == ("all_reduce", True)
    assert f"rank {hung} (host " in console and "stuck in block_forever (test_hangs.py:" in console
    assert "), in 'forward', at step" in console
    assert f"{world - 1} ranks waiting at step {HANG_AT} in all_reduce (" in console
    assert f"rank {hung} on " in console and "stopped first" in console and "block_forever()" in console  # its stack
    # while it happened: each rank's own line, and rank 0's naming the rank that stopped first
    assert f"goodtrace: rank {hung} made no progress" in err
    assert f"at step {HANG_AT} in block_forever (test_hangs.py:" in err
    (line,) = [x for x in err.splitlines() if x.startswith("goodtrace: hang:")]
    assert line.startswith(f"goodtrace: hang: rank {hung} (host ") and "stuck in block_forever (test_hangs.py:" in line
    assert f"; {world - 1} ranks waiting at step {HANG_AT} in all_reduce (" in line


def test_on_hang_abort_exits_with_the_hang_exit_code(tmp_path: Path) -> None:
    from goodtrace.record.hang import HANG_EXIT_CODE

    world, hung = 2, 1
    run_dir = tmp_path / "run"
    procs = _start(run_dir, world, hung, "abort")
    for p in procs:
        p.join(timeout=120)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    # the hung rank leaves with the hang exit code; the others either do too, or fail in the
    # all-reduce when it has gone (gloo: "connection closed by peer"): the launcher restarts
    assert codes[hung] == HANG_EXIT_CODE and all(c not in (0, None) for c in codes), codes
    report, _ = _report(run_dir)
    (first,) = [h for h in report["hangs"] if h["first"]]
    assert (first["rank"], first["step"], first["action"]) == (hung, HANG_AT, "abort")
    (attempt,) = report["attempts"]
    assert attempt["ended"] == "hung", attempt
