"""What the live goodput by the report's rules (record/live/goodput.py) costs the training
thread per step, with the live aggregator on (a line every 10 steps, one process,
LocalTransport): the same loop (a data span, a compute span, ``complete_on`` of a host value)
with the goodput's listeners attached and detached, in interleaved rounds; medians.

Usage: python benchmarks/live_goodput_overhead.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time

import goodtrace as gt
from goodtrace.record.live.aggregator import LiveAggregator, LocalTransport


def per_step(n: int, with_goodput: bool) -> float:
    with tempfile.TemporaryDirectory() as run_dir:
        recorder = gt.init(run_dir, record_gc=False)
        aggregator = LiveAggregator(recorder, LocalTransport(), log_every=10, printer=lambda line: None)
        if not with_goodput:
            for attr, hook in aggregator.attempt_goodput.hooks():
                getattr(recorder, attr).remove(hook)
        step, span = gt.step, gt.span
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter_ns()
            for k in range(n):
                with step(k) as s:
                    with span("data"):
                        pass
                    with span("forward"):
                        pass
                    s.complete_on(1.0)
            return (time.perf_counter_ns() - start) / n
        finally:
            gc.enable()
            aggregator.close()
            gt.finish()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    rounds, n = (5, 10_000) if args.quick else (15, 50_000)
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        for with_goodput in (False, True):
            times[with_goodput].append(per_step(n, with_goodput))
    result = {"step_ns": statistics.median(times[False]), "step_with_goodput_ns": statistics.median(times[True])}
    result["added_ns"] = result["step_with_goodput_ns"] - result["step_ns"]
    for key, value in result.items():
        print(f"{key:24s} {value:.0f}")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
