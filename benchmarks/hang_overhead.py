"""What the hang watchdog (``gt.detect_hangs``) costs the training thread, and how soon after
its bound it records a hang.

1. ``step``: ns per ``with gt.step(k): pass`` without the watchdog and with it (its two
   listeners per step; its thread looks every 0.1 s), in interleaved rounds, medians, wall time
   and the training thread's CPU time. The writer runs as usual.
2. ``detection``: a loop of ~10 ms steps stalls (a sleep) for longer than its bound (floor
   0.3 s); the watchdog's recorded silence minus its bound is how late after the bound it saw
   it (its check interval is 0.05 s here): median and max over several stalls.

Usage: python benchmarks/hang_overhead.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import goodtrace as gt


def _steps(n: int) -> tuple[float, float]:
    step = gt.step
    gc.collect()
    gc.disable()
    try:
        wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
        for k in range(n):
            with step(k):
                pass
        return (time.perf_counter_ns() - wall) / n, (time.thread_time_ns() - cpu) / n
    finally:
        gc.enable()


def step_cost(rounds: int, n: int) -> dict[str, float]:
    walls: dict[bool, list[float]] = {False: [], True: []}
    cpus: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        for watched in (False, True):
            with tempfile.TemporaryDirectory() as run_dir:
                gt.init(run_dir, record_gc=False)
                if watched:
                    gt.detect_hangs()
                wall, cpu = _steps(n)
                gt.finish()
            walls[watched].append(wall)
            cpus[watched].append(cpu)
    return {
        "step_ns": statistics.median(walls[False]), "step_watched_ns": statistics.median(walls[True]),
        "step_cpu_ns": statistics.median(cpus[False]), "step_watched_cpu_ns": statistics.median(cpus[True]),
    }


def detection(stalls: int) -> dict[str, float]:
    late: list[float] = []
    for _ in range(stalls):
        with tempfile.TemporaryDirectory() as run_dir:
            gt.init(run_dir, flush_interval_s=0.1)
            gt.detect_hangs(floor_s=0.3, check_interval_s=0.05)
            for k in range(30):
                with gt.step(k):
                    time.sleep(0.01)
                    if k == 20:
                        time.sleep(1.0)
            gt.finish()
            events = [json.loads(line) for f in Path(run_dir).glob("rank-*/*.jsonl")
                      for line in f.read_text().splitlines() if '"name":"hang"' in line]
            late += [e["attrs"]["silent_s"] - e["attrs"]["bound_s"] for e in events]
    return {"stalls": stalls, "hangs_recorded": len(late),
            "late_after_bound_median_s": statistics.median(late) if late else float("nan"),
            "late_after_bound_max_s": max(late) if late else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    rounds, n, stalls = (5, 20_000, 3) if args.quick else (15, 100_000, 10)
    result: dict[str, Any] = step_cost(rounds, n) | detection(stalls)
    result["added_ns"] = result["step_watched_ns"] - result["step_ns"]
    result["added_cpu_ns"] = result["step_watched_cpu_ns"] - result["step_cpu_ns"]
    for key, value in result.items():
        print(f"{key:28s} {value:.4g}" if isinstance(value, float) else f"{key:28s} {value}")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
