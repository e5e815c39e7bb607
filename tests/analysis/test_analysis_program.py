"""Program goodput inputs: the accelerator table, the user override, FLOPs from a metric, and
the command's window/duration parsing."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from goodtrace.accelerators import ACCELERATORS, peak_flops
from goodtrace.analysis import AnalysisError, analyze
from goodtrace.cli.commands.report import parse_duration, parse_window
from helpers.builders import Proc, load


@pytest.mark.parametrize(
    ("name", "tflops"),
    [("A100", 312), ("h100", 989), ("H200", 989), ("b200", 2250), ("MI300X", 1307), ("tpu-v4", 275),
     ("TPU v5e", 197), ("v5p", 459), ("tpu_v6e", 918), ("trillium", 918)],
)
def test_accelerator_table(name: str, tflops: float) -> None:
    assert peak_flops(name) == tflops * 1e12


def test_unknown_accelerator_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="h100"):
        peak_flops("abacus")
    assert len(ACCELERATORS) >= 9


def test_flops_from_a_metric_and_a_user_peak(tmp_path: Path) -> None:
    p = Proc(tmp_path, world=2)
    p.loop(range(4), 0.0)
    p.metric("flops_per_step", 0, 4e12, 0.5)  # one rank's, as goodtrace.integrations.torch writes it
    p.lines.append({"kind": "event", "name": "model", "t": p.mono(0.5), "step": None,
                    "attrs": {"tokens_per_step": 512, "flops_per_step": 4e12, "peak_flops": 20e12}})
    p.finish(4.0)
    p.write()
    recorded = analyze(load(tmp_path)).program
    assert (recorded.flops_per_step, recorded.peak_flops_per_device, recorded.devices) == (8e12, 20e12, 2)
    assert recorded.mfu == pytest.approx(8e12 * 4 / 4.0 / (20e12 * 2))
    program = analyze(load(tmp_path), peak_flops=10e12, devices_per_rank=2).program
    assert program.flops_source == "flops_per_step metric of rank 0 x world size"
    assert program.devices == 4
    assert program.mfu == pytest.approx(8e12 * 4 / 4.0 / (10e12 * 4))
    assert program.scheduling_goodput is None  # no submit time
    with pytest.raises(AnalysisError, match="unknown accelerator"):
        analyze(load(tmp_path), accelerator="abacus", flops_per_step=1.0)


def test_window_and_duration_parsing() -> None:
    assert parse_duration("90") == 90.0 and parse_duration("15m") == 900.0 and parse_duration("1.5h") == 5400.0
    assert parse_window("10:20") == (10.0, 20.0)
    assert parse_window("1h") == (-3600.0, math.inf)
    assert parse_window("-10m:") == (-600.0, math.inf)
    assert parse_window(":30") == (0.0, 30.0)
    for bad in ("20:10", "x", "0"):
        with pytest.raises(ValueError):
            parse_window(bad)
