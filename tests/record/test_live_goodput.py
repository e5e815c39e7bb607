"""One goodput, live and after: the live line's goodput follows the report's partition rules
(record/live/goodput.py), so the figure at ``finish()`` is the report's goodput of the same
one-attempt job, to 0.1 percentage point. Loops with what made them differ before: in-step data
loading in a synchronous loop (data badput) and in an asynchronous one where it overlapped queued
device work (productive), a slow
first step (warm-up), checkpoints, an eval, a gc pause inside a step, and an idle tail."""

from __future__ import annotations

import gc
import time
from pathlib import Path

import pytest

import goodtrace as gt
from goodtrace.analysis import analyze
from goodtrace.read.load import load_run
from goodtrace.record.live.aggregator import LiveAggregator, LocalTransport
from goodtrace.testing import SimulatedDevice


def _run(run_dir: Path, asynchronous: bool) -> LiveAggregator:
    gt.init(run_dir)
    printed: list[str] = []
    aggregator = LiveAggregator(gt.recorder(), LocalTransport(), log_every=5, printer=printed.append)
    device = SimulatedDevice() if asynchronous else None
    try:
        for step in range(30):
            with gt.step(step) as s:
                with gt.span("data"):
                    time.sleep(0.01)
                if device is not None:  # queued device work: the host runs ahead of it
                    s.complete_on(device.launch(0.03 if step else 0.15))
                else:
                    with gt.span("forward"):
                        time.sleep(0.03 if step else 0.15)  # a slow first step: warm-up
                    s.complete_on(1.0)
                if step == 12:
                    gc.collect()  # a gc pause inside the step
            if step % 10 == 9:
                with gt.span("checkpoint"):
                    time.sleep(0.05)
            if step == 14:
                with gt.span("eval"):
                    time.sleep(0.08)
        time.sleep(0.2)  # the idle tail: teardown, not productive
        aggregator.close()
    finally:
        gt.finish()
        if device is not None:
            device.close()
    assert printed[-1].startswith("goodtrace: finished: goodput ") and printed[-1].endswith("(this attempt, rank 0)")
    return aggregator


@pytest.mark.parametrize("asynchronous", [False, True])
def test_the_live_goodput_at_finish_is_the_reports(tmp_path: Path, asynchronous: bool) -> None:
    aggregator = _run(tmp_path, asynchronous)
    report = analyze(load_run(tmp_path))
    data_s = report.partition.seconds("data")
    # in-step data is badput in the synchronous loop; in the asynchronous one it overlapped the
    # previous step's kernel (30 ms queued against 10 ms of loading), so it stays productive
    assert (data_s > 0.2) != asynchronous
    assert (report.host_overhead.overlapped_ns > 0.2e9) == asynchronous
    assert aggregator.final_goodput is not None
    assert abs(aggregator.final_goodput - report.partition.goodput) < 0.001, (
        aggregator.final_goodput, report.partition.goodput, report.partition.to_dict())
    # and the line before finish counted by the same rules: not above the final figure by the data
    last = aggregator.lines[-1].goodput
    assert last is not None and last < report.partition.goodput + 0.05
