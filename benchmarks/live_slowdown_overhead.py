"""What a rank's live slowdown (record/live/slowdown.py) costs the training thread per step,
with the live aggregator on (a line every 10 steps, one process, LocalTransport): the same loop
(a data span, a compute span, ``complete_on`` of a host value) with the slowdown tracker's
listeners attached and detached (detached, its history stays empty, so the change-point search
at each log step costs nothing either), in interleaved rounds, medians; at two run lengths, to
show the cost per step does not grow with the run (the history is bounded: linear in steps).

Usage: python benchmarks/live_slowdown_overhead.py [--quick] [--json]
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


def per_step(n: int, with_tracker: bool) -> float:
    with tempfile.TemporaryDirectory() as run_dir:
        recorder = gt.init(run_dir, record_gc=False)
        aggregator = LiveAggregator(recorder, LocalTransport(), log_every=10, printer=lambda line: None)
        if not with_tracker:
            for attr, hook in aggregator.slowdown.hooks():
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
    rounds, lengths = (5, (2_000, 20_000)) if args.quick else (11, (10_000, 100_000))
    result: dict[str, float] = {}
    for n in lengths:
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(rounds):
            for with_tracker in (False, True):
                times[with_tracker].append(per_step(n, with_tracker))
        result[f"step_{n}_ns"] = statistics.median(times[False])
        result[f"step_{n}_with_slowdown_ns"] = statistics.median(times[True])
        result[f"added_{n}_ns"] = result[f"step_{n}_with_slowdown_ns"] - result[f"step_{n}_ns"]
    for key, value in result.items():
        print(f"{key:32s} {value:.0f}")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
