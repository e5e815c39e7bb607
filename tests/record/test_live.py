"""Live aggregation: reductions across real gloo ranks, and the loop never waits on the gather."""

from __future__ import annotations

import json
import math
import multiprocessing
import socket
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

import goodtrace as gt
from goodtrace.record.live import LiveAggregator, LiveLine, LocalTransport, format_line
from goodtrace.testing import FakeClock, capture

torch = pytest.importorskip("torch")

STEPS = 12
LOG_EVERY = 4


def _value(name: str, rank: int, step: int) -> float:
    """Deterministic per-rank inputs, different on every rank and step."""
    base = {"a": 1.0, "b": 0.5, "c": -2.0, "d": 3.0, "e": 7.0, "loss": 2.0}[name]
    return base * (rank + 1) + 0.25 * step * (1 if rank % 2 == 0 else -1) + 0.125 * rank * step


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _live_worker(rank: int, world: int, port: int, run_dir: str, out_dir: str) -> None:
    import torch.distributed as dist

    from goodtrace.integrations.torch import instrument

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    gt.init(run_dir, rank=rank, world_size=world)
    lines: list[str] = []
    integration = instrument(log_every=LOG_EVERY, memory=False, clock_sync_every=0, printer=lines.append)
    dist.barrier()
    for step in range(1, STEPS + 1):
        with gt.step(step) as s:
            time.sleep(0.05)
            if rank == 1 and step == 5:
                time.sleep(0.08)  # rank 1 launches the gather of step 4 late; rank 0 must not wait
            gt.metric("a", torch.tensor(_value("a", rank, step)), "mean")
            gt.metric("b", torch.tensor(_value("b", rank, step)), "sum")
            gt.metric("c", _value("c", rank, step), "min")
            gt.metric("d", _value("d", rank, step), "max")
            gt.metric("e", _value("e", rank, step), "std")
            loss = torch.tensor(_value("loss", rank, step))
            gt.metric("loss", loss, "mean")
            s.complete_on(loss)
    gt.finish()
    aggregator = integration.aggregator
    assert aggregator is not None
    result: dict[str, Any] = {
        "printed": lines,
        "blocking_waits": aggregator.blocking_waits,
        "completed_at": aggregator.completed_at,
        "lines": [
            {"step": line.step, "ranks": line.ranks, "rank_step_s": line.rank_step_s,
             "rank_lateness_s": line.rank_lateness_s, "slowest_rank": line.slowest_rank,
             "host_ranks": line.host_ranks,
             "metrics": {n: {"reduce": m.reduce, "value": m.value, "count": m.count, "mean": m.mean,
                             "sum": m.sum, "min": m.min, "max": m.max, "std": m.std}
                         for n, m in line.metrics.items()}}
            for line in aggregator.lines
        ],
    }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def _spawn(target: Any, world: int, *args: Any) -> None:
    ctx = multiprocessing.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=target, args=(rank, world, port, *args)) for rank in range(world)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    assert [p.exitcode for p in procs] == [0] * world


def test_two_gloo_ranks_reduce_by_hand_values_and_never_wait(tmp_path: Path) -> None:
    run_dir, out_dir = tmp_path / "run", tmp_path / "out"
    out_dir.mkdir()
    _spawn(_live_worker, 2, str(run_dir), str(out_dir))
    rank0 = json.loads((out_dir / "rank0.json").read_text())
    rank1 = json.loads((out_dir / "rank1.json").read_text())

    assert [line["step"] for line in rank0["lines"]] == [4, 8, 12]
    assert rank1["lines"] == [] and rank1["printed"] == []  # only rank 0 reports
    assert len(rank0["printed"]) == 3 and rank0["printed"][0].startswith("step 4 | loss ")
    for line in rank0["lines"]:
        window = range(line["step"] - LOG_EVERY + 1, line["step"] + 1)
        assert line["ranks"] == 2
        for name, reduce in (("a", "mean"), ("b", "sum"), ("c", "min"), ("d", "max"), ("e", "std"),
                             ("loss", "mean")):
            inputs = [_value(name, rank, step) for rank in (0, 1) for step in window]
            expected = {
                "mean": statistics.fmean(inputs), "sum": math.fsum(inputs), "min": min(inputs),
                "max": max(inputs), "std": statistics.pstdev(inputs),
            }[reduce]
            got = line["metrics"][name]
            assert got["reduce"] == reduce
            assert got["count"] == len(inputs)
            assert got["value"] == pytest.approx(expected, rel=1e-9, abs=1e-9), (name, line["step"])
    # Per rank: both on this host; rank 1 slept 0.08 s more in step 5, so in the window of steps
    # 5-8 its steps were slower and it reached the window's last sync point later.
    for line in rank0["lines"]:
        assert len(line["rank_step_s"]) == 2 and line["host_ranks"] == [0, 1]
        assert min(line["rank_lateness_s"]) == 0.0
    step8 = next(line for line in rank0["lines"] if line["step"] == 8)
    assert step8["rank_step_s"][1] > step8["rank_step_s"][0]
    assert step8["slowest_rank"] == 1 and step8["rank_lateness_s"][1] > 0.0
    # The gather of step 4 was launched at the end of step 5 (lag 1) and, rank 1 being late,
    # completed at a later step end, found done by a non-blocking check: the loop never waited.
    step4 = next(c for c in rank0["completed_at"] if c[0] == 4)
    assert step4[2] > step4[1]
    assert rank0["blocking_waits"] == 0


def test_single_process_line_has_step_time_split_and_throughput() -> None:
    clock = FakeClock()
    printed: list[str] = []
    with capture(clock=clock, lag=0) as cap:
        agg = LiveAggregator(gt.recorder(), LocalTransport(), log_every=2, tokens_per_step=1000,
                             flops_per_step=2e12, peak_flops=4e12, printer=printed.append)
        for step in (1, 2, 3, 4):
            with gt.step(step) as s:
                clock.advance(0.5)
                gt.metric("loss", 4.0 - step, "mean")
                s.complete_on(1.0)
            if step == 2:
                with gt.span("checkpoint"):
                    clock.advance(1.0)
        agg.close()
    assert cap.run is not None
    assert [line.step for line in agg.lines] == [2, 4]
    second: LiveLine = agg.lines[1]
    # steps 3 and 4 took 0.5 s each, plus the 1 s checkpoint between them: 2 s for 2 steps
    assert second.step_time_s == pytest.approx(1.0)
    assert second.overhead_s == {"checkpoint_save": pytest.approx(0.5)}
    assert second.train_s == pytest.approx(0.5)
    assert second.tokens_per_s == pytest.approx(1000.0)
    assert second.tflops_per_s == pytest.approx(2.0)
    assert second.mfu == pytest.approx(0.5)
    assert second.metrics["loss"].value == pytest.approx(0.5)
    assert printed[1] == format_line(second)
    assert "checkpoint_save" in printed[1] and "MFU 50.0%" in printed[1]


def test_bad_options_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="log_every"):
        LiveAggregator(gt.recorder(), LocalTransport(), log_every=0)
    with pytest.raises(ValueError, match="peak_flops"):
        LiveAggregator(gt.recorder(), LocalTransport(), peak_flops=-1)



def test_first_line_divides_by_its_own_steps_whatever_the_lag() -> None:
    clock = FakeClock()
    with capture(clock=clock, lag=1):
        agg = LiveAggregator(gt.recorder(), LocalTransport(), log_every=2, printer=lambda line: None)
        for step in range(6):
            with gt.step(step) as s:
                clock.advance(0.5)
                s.complete_on(1.0)
        agg.close()
    first = agg.lines[0]
    # the first window holds steps 0..first.step, each 0.5 s; it is launched lag steps later
    assert first.step_time_s == pytest.approx(0.5)
