"""How late goodtrace dates a step's completion: recorded sync point minus the moment the
simulated device finished the step's kernel, over many steps.

Loops on ``goodtrace.testing.SimulatedDevice`` (kernels of 5-30 ms on a worker thread, which
logs when each really finished), in three host behaviours:

  waiting    the host sleeps 1-5 ms per step (data loading that releases the GIL)
  busy       the host runs pure Python for 1-5 ms per step (never releases the GIL: the
             readiness thread must wait for the interpreter to switch threads, every 5 ms)
  tail       each value is looked at only 50 ms after its kernel ended (the idle-tail and
             data-stall shapes: without the readiness check it would be dated 50 ms late)

Reported per loop: the poll interval, how many sync points each way of dating gave, and
percentiles of (sync point - true end) in ms, with the same for ``poll_interval_s=0`` (dated
only when the training thread waits) beside it.

Usage: python benchmarks/completion_dating.py [--steps N] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from typing import Any

import goodtrace as gt
from goodtrace import schema
from goodtrace.read.sessions import read_run
from goodtrace.testing import DeviceValue, SimulatedDevice


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def run(shape: str, steps: int, poll_interval_s: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    device = SimulatedDevice()
    values: list[DeviceValue] = []
    with tempfile.TemporaryDirectory() as run_dir:
        gt.init(run_dir, poll_interval_s=poll_interval_s, lag=1 if shape != "tail" else 1000)
        for k in range(steps):
            with gt.step(k) as s:
                host = rng.uniform(0.001, 0.005)
                if shape == "busy":
                    _busy(host)
                else:
                    time.sleep(host)
                values.append(device.launch(rng.uniform(0.005, 0.030)))
                s.complete_on(values[-1])
            if shape == "tail":
                values[-1].block()
                time.sleep(0.050)  # nobody looks at it for 50 ms
        gt.finish()
        records = [r for _, r in read_run(run_dir).records(schema.SYNC)]
    device.close()
    late = sorted((r["t"] - values[r[schema.F_SEQ]].done_ns) / 1e6 for r in records)
    hows: dict[str, int] = {}
    for r in records:
        hows[r["how"]] = hows.get(r["how"], 0) + 1

    def pct(q: float) -> float:
        return float(late[min(len(late) - 1, round(q * (len(late) - 1)))])

    return {"hows": hows, "p50_ms": pct(0.5), "p90_ms": pct(0.9), "p99_ms": pct(0.99), "max_ms": late[-1],
            "min_ms": late[0], "mean_ms": statistics.fmean(late)}


def sleep_overshoot_ms(interval_s: float, samples: int = 300) -> dict[str, float]:
    late = []
    for _ in range(samples):
        t0 = time.perf_counter_ns()
        time.sleep(interval_s)
        late.append((time.perf_counter_ns() - t0) / 1e6 - interval_s * 1e3)
    late.sort()
    return {"p50_ms": late[len(late) // 2], "p99_ms": late[int(0.99 * (len(late) - 1))], "max_ms": late[-1]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, help="steps per loop (300; the tail loop a tenth, at least 20)")
    parser.add_argument("--quick", action="store_true", help="100 steps per loop (a few seconds)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    steps = args.steps or (100 if args.quick else 300)
    interval = gt.Config().poll_interval_s
    result: dict[str, Any] = {"poll_interval_ms": interval * 1e3, "sleep_overshoot": sleep_overshoot_ms(interval)}
    print(f"python {sys.version.split()[0]}; poll interval {interval * 1e3:.1f} ms; sleep({interval * 1e3:.0f} ms) "
          f"overshoot p50/p99/max {result['sleep_overshoot']['p50_ms']:.3f}/"
          f"{result['sleep_overshoot']['p99_ms']:.3f}/{result['sleep_overshoot']['max_ms']:.3f} ms")
    print(f"{'loop':<8} {'check':<5} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>7}  (ms after the true end)  dated by")
    for shape in ("waiting", "busy", "tail"):
        for label, poll in (("on", interval), ("off", 0.0)):
            stats = run(shape, steps if shape != "tail" else max(20, steps // 10), poll, seed=7)
            result[f"{shape}_{label}"] = stats
            print(f"{shape:<8} {label:<5} {stats['p50_ms']:7.3f} {stats['p90_ms']:7.3f} {stats['p99_ms']:7.3f} "
                  f"{stats['max_ms']:7.3f}  {stats['hows']}")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
