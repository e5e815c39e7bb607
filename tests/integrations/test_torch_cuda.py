"""CUDA ground truth: step timing on a real GPU, checked against CUDA events.

Runs only where a CUDA device exists (the suite skips it elsewhere). Each step queues a kernel
of a known length (``torch.cuda._sleep``, calibrated against CUDA events first) and returns at
once, as a real CUDA training step does; the truth for step k is the device time between the
end of step k-1's work and the end of step k's (events recorded after each step's kernel), and
for step 0 the time from entering the step to the end of its work. Everything runs under
``torch.cuda.set_sync_debug_mode("error")``: a synchronising call anywhere in the recording path
raises. The report (``goodtrace report --json``, a real process) must give each step that
interval, a checkpoint saved after step N its save alone in step N+1, and the device time of
each step (``device_s``, from the integration's own events) within the events' own precision.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import goodtrace as gt
from goodtrace.testing import capture
from helpers.cli import goodtrace
from helpers.loops import Slack

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.processes, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

# The readiness thread's poll (2 ms) plus one more: as in record/test_step_timing.py, plus how
# late this machine woke a sleeping thread during the loop (measured beside it).
TOLERANCE_NS = 3_000_000


def _cycles_per_second() -> float:
    """How many ``torch.cuda._sleep`` cycles make a second on this device, now."""
    torch.cuda._sleep(1_000_000)  # warm the kernel up
    begin = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    cycles = 50_000_000
    begin.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return float(cycles / (begin.elapsed_time(end) / 1e3))


def _report(run_dir: str) -> dict[str, Any]:
    out = goodtrace("report", run_dir, "--json")
    assert out.returncode == 0, out.stderr
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def test_cuda_steps_and_checkpoint_match_event_truth(tmp_path: Path) -> None:
    from goodtrace.integrations.torch import instrument

    durations = [0.120, 0.030, 0.045, 0.020, 0.060, 0.030, 0.025, 0.040]  # step 0 "compiles"
    checkpoint_after, save_s = 3, 0.050
    rate = _cycles_per_second()
    entered: list[int] = []
    ends: list[Any] = []
    marks: dict[str, int] = {}
    torch.cuda.synchronize()
    slack = Slack()
    with capture(tmp_path / "run") as cap:
        instrument(log_every=4, live=False)
        torch.cuda.set_sync_debug_mode("error")
        try:
            for k, seconds in enumerate(durations):
                entered.append(time.perf_counter_ns())
                with gt.step(k) as s:
                    torch.cuda._sleep(int(seconds * rate))
                    value = torch.ones(1, device="cuda") * k  # produced after the step's kernel
                    end = torch.cuda.Event(enable_timing=True)
                    end.record()
                    ends.append(end)
                    s.complete_on(value)
                    gt.metric("loss", value, "mean")
                    time.sleep(0.002)  # host work beside the device
                if k == checkpoint_after:
                    with gt.span("checkpoint"):  # the device barrier waits for step k first
                        marks["save_begin"] = time.perf_counter_ns()
                        time.sleep(save_s)
                        marks["save_end"] = time.perf_counter_ns()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    tolerance = TOLERANCE_NS + slack.stop()
    torch.cuda.synchronize()
    device_ns = [0.0] + [ends[k - 1].elapsed_time(ends[k]) * 1e6 for k in range(1, len(ends))]
    save_ns = marks["save_end"] - marks["save_begin"]

    report = _report(cap.run_dir)
    rows = {row["step"]: row for row in report["steps"]}
    assert sorted(rows) == list(range(len(durations)))
    measured = {k: rows[k]["step_time_s"] * 1e9 for k in rows}
    # Step 0: from entering it to the end of its kernel, at least its known length.
    assert measured[0] >= durations[0] * 1e9 - tolerance, (measured[0], tolerance)
    assert measured[0] == max(measured.values())
    for k in range(1, len(durations)):
        truth = device_ns[k]
        if k == checkpoint_after + 1:  # the device idled while the host saved
            truth = save_ns + durations[k] * 1e9
            assert abs(measured[k] - truth) <= 2 * tolerance + 0.05 * durations[k] * 1e9, (k, measured[k], truth)
        else:
            assert abs(measured[k] - truth) <= tolerance, (k, measured[k], truth, tolerance)
    (ckpt,) = [r for r in cap.records("span") if r["name"] == "checkpoint"]
    assert abs((ckpt["t1"] - ckpt["t0"]) - save_ns) <= tolerance  # the save alone, no wait in it
    assert rows[checkpoint_after + 1]["overhead_s"], rows[checkpoint_after + 1]
    # device/busy_s from the integration's begin/end events: each step's kernel length.
    for k in range(1, len(durations)):
        device_s = rows[k]["device_s"]
        assert device_s is not None and abs(device_s - durations[k]) <= 0.1 * durations[k], (k, device_s)
    syncs = cap.records("sync")
    assert sorted(r["step"] for r in syncs) == list(range(len(durations)))
    peaks = [r for r in cap.records("metric") if r["name"] == "memory/cuda_peak_allocated_bytes"]
    assert peaks and all(r["step"] % 4 == 0 and r["value"] > 0 for r in peaks), peaks
