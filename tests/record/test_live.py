"""Live aggregation: reductions across real gloo ranks, and the loop never waits on the gather."""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

import goodtrace as gt
from goodtrace.record.live.aggregator import LiveAggregator, LiveLine, LocalTransport, format_line
from goodtrace.testing import FakeClock, capture
from helpers.ranks import leave_group, run_ranks

torch = pytest.importorskip("torch")

STEPS = 12
LOG_EVERY = 4


def _value(name: str, rank: int, step: int) -> float:
    """Deterministic per-rank inputs, different on every rank and step."""
    base = {"a": 1.0, "b": 0.5, "c": -2.0, "d": 3.0, "e": 7.0, "loss": 2.0}[name]
    return base * (rank + 1) + 0.25 * step * (1 if rank % 2 == 0 else -1) + 0.125 * rank * step


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
    leave_group()


def _spawn(target: Any, world: int, *args: Any) -> None:
    run_ranks(target, world, *args)


@pytest.mark.processes
def test_two_gloo_ranks_reduce_by_hand_values_and_never_wait(tmp_path: Path) -> None:
    run_dir, out_dir = tmp_path / "run", tmp_path / "out"
    out_dir.mkdir()
    _spawn(_live_worker, 2, str(run_dir), str(out_dir))
    rank0 = json.loads((out_dir / "rank0.json").read_text())
    rank1 = json.loads((out_dir / "rank1.json").read_text())

    assert [line["step"] for line in rank0["lines"]] == [4, 8, 12]
    assert rank1["lines"] == [] and rank1["printed"] == []  # only rank 0 reports
    assert len(rank0["printed"]) == 4 and rank0["printed"][0].startswith("step 4 | loss ")
    assert rank0["printed"][-1].startswith("goodtrace: finished: goodput ")  # the figure at finish
    for line in rank0["lines"]:
        interval = range(line["step"] - LOG_EVERY + 1, line["step"] + 1)
        assert line["ranks"] == 2
        for name, reduce in (("a", "mean"), ("b", "sum"), ("c", "min"), ("d", "max"), ("e", "std"),
                             ("loss", "mean")):
            inputs = [_value(name, rank, step) for rank in (0, 1) for step in interval]
            expected = {
                "mean": statistics.fmean(inputs), "sum": math.fsum(inputs), "min": min(inputs),
                "max": max(inputs), "std": statistics.pstdev(inputs),
            }[reduce]
            got = line["metrics"][name]
            assert got["reduce"] == reduce
            assert got["count"] == len(inputs)
            assert got["value"] == pytest.approx(expected, rel=1e-9, abs=1e-9), (name, line["step"])
    # Per rank: both on this host; rank 1 slept 0.08 s more in step 5, so in the log interval of steps
    # 5-8 its steps were slower and it reached the log interval's last sync point later.
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


def test_peak_flops_is_one_device_s_and_the_mfu_counts_the_devices_of_the_rank() -> None:
    clock = FakeClock()
    with capture(clock=clock, lag=0):
        agg = LiveAggregator(gt.recorder(), LocalTransport(), log_every=2, flops_per_step=2e12, peak_flops=4e12,
                             devices=4, printer=lambda text: None)
        for step in (1, 2):
            with gt.step(step) as s:
                clock.advance(0.5)
                s.complete_on(1.0)
        agg.close()
    # 2 TFLOP per 0.5 s step = 4 TFLOP/s, on four devices of 4 TFLOP/s each
    assert agg.lines[0].mfu == pytest.approx(0.25)


def test_bad_options_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="log_every"):
        LiveAggregator(gt.recorder(), LocalTransport(), log_every=0)
    with pytest.raises(ValueError, match="peak_flops"):
        LiveAggregator(gt.recorder(), LocalTransport(), peak_flops=-1)
    with pytest.raises(ValueError, match="devices"):
        LiveAggregator(gt.recorder(), LocalTransport(), devices=0)



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
    # the first log interval holds steps 0..first.step, each 0.5 s; it is launched lag steps later
    assert first.step_time_s == pytest.approx(0.5)


TOKENS = {0: 100.0, 1: 300.0}  # per step; ranks of a pipeline need not process the same tokens


def _pipeline_value(name: str, rank: int, step: int) -> float:
    return {"lr": 0.001 * step, "loss": 10.0 - 0.5 * step, "a": float(rank + step),
            "late_start": 2.0 * step, "device": 0.01 * (step + rank), "last": 100.0 * rank + step}[name]


def _pipeline_worker(rank: int, world: int, port: int, run_dir: str, out_dir: str) -> None:
    """Ranks record different metrics, as a pipeline does: ``lr`` on rank 0 only, ``loss`` on the
    last stage only, ``late_start`` from step 6 on rank 1 only, and on rank 0 a device time of
    step k that resolves during step k+3 (after its log interval was sent)."""
    import torch.distributed as dist

    from goodtrace.integrations.torch import instrument

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    gt.init(run_dir, rank=rank, world_size=world)
    lines: list[str] = []
    integration = instrument(log_every=LOG_EVERY, memory=False, clock_sync_every=0, printer=lines.append,
                             tokens_per_step=TOKENS[rank])
    dist.barrier()
    for step in range(1, STEPS + 1):
        with gt.step(step) as s:
            time.sleep(0.02)
            if rank == 0:
                gt.metric("lr", _pipeline_value("lr", rank, step), "last")
                if step > 3:
                    gt.metric("device", _pipeline_value("device", rank, step - 3), "max", step=step - 3)
            if rank == world - 1:
                gt.metric("loss", torch.tensor(_pipeline_value("loss", rank, step)), "mean")
                if step >= 6:
                    gt.metric("late_start", _pipeline_value("late_start", rank, step), "sum")
            gt.metric("a", _pipeline_value("a", rank, step), "std")
            gt.metric("last", _pipeline_value("last", rank, step), "last")
            s.complete_on(1.0)
    gt.finish()
    aggregator = integration.aggregator
    assert aggregator is not None
    result = {
        "printed": lines,
        "lines": [
            {"step": line.step, "steps": line.steps, "ranks": line.ranks, "tokens_per_s": line.tokens_per_s,
             "step_time_s": line.step_time_s,
             "metrics": {n: {"reduce": m.reduce, "value": m.value, "count": m.count, "ranks": m.ranks}
                         for n, m in line.metrics.items()}}
            for line in aggregator.lines
        ],
    }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    leave_group()


@pytest.mark.processes
def test_ranks_with_different_metric_names_all_count(tmp_path: Path) -> None:
    """No rank is left out of the live line because its metric names differ from rank 0's: a
    rank without a value for a metric contributes a count of zero, tokens/s counts every rank,
    and a value that arrives after its log interval was sent counts in the next interval."""
    run_dir, out_dir = tmp_path / "run", tmp_path / "out"
    out_dir.mkdir()
    _spawn(_pipeline_worker, 2, str(run_dir), str(out_dir))
    rank0 = json.loads((out_dir / "rank0.json").read_text())
    lines = rank0["lines"]
    assert [line["step"] for line in lines] == [4, 8, 12]
    # The device time of step k is recorded during step k + 3. The log interval of a log step L is
    # sent at the end of step L + 1 (lag 1), so it carries the device times recorded since the
    # previous log interval was sent, those of steps up to L - 2, some of which belong to the
    # previous log interval's steps; the last log interval is sent at finish().
    device_steps = {4: [1, 2], 8: [3, 4, 5, 6], 12: [7, 8, 9]}
    for line in lines:
        interval = list(range(line["step"] - LOG_EVERY + 1, line["step"] + 1))
        assert line["ranks"] == 2
        metrics = line["metrics"]
        expected: dict[str, tuple[str, float, int, int]] = {
            # name: (reduce, value, count, ranks with a value)
            "lr": ("last", _pipeline_value("lr", 0, interval[-1]), len(interval), 1),
            "loss": ("mean", statistics.fmean(_pipeline_value("loss", 1, s) for s in interval), len(interval), 1),
            "a": ("std", statistics.pstdev(_pipeline_value("a", r, s) for r in (0, 1) for s in interval),
                  2 * len(interval), 2),
            "last": ("last", _pipeline_value("last", 1, interval[-1]), 2 * len(interval), 2),
            "device": ("max", max(_pipeline_value("device", 0, s) for s in device_steps[line["step"]]),
                       len(device_steps[line["step"]]), 1),
        }
        late = [s for s in interval if s >= 6]
        if late:
            expected["late_start"] = ("sum", math.fsum(_pipeline_value("late_start", 1, s) for s in late),
                                      len(late), 1)
        assert set(metrics) == set(expected), line["step"]
        for name, (reduce, value, count, ranks) in expected.items():
            got = metrics[name]
            assert (got["reduce"], got["count"], got["ranks"]) == (reduce, count, ranks), (name, line["step"])
            assert got["value"] == pytest.approx(value, rel=1e-9, abs=1e-12), (name, line["step"])
        # tokens/s counts both ranks: (100 + 300) tokens per step over rank 0's step time
        assert line["tokens_per_s"] * line["step_time_s"] == pytest.approx(sum(TOKENS.values()), rel=1e-9)
    # the loss exists only on rank 1, and rank 0 prints it; the goodput says whose it is
    assert all(" | loss " in printed and "(this attempt, rank 0)" in printed for printed in rank0["printed"] if "loss" in printed)
