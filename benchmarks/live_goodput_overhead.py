"""What the live goodput by the report's rules (record/live/goodput.py) costs the training
thread per step, with the live aggregator on (a line every 10 steps, one process,
LocalTransport): the same loop (a data span, a compute span, ``complete_on`` of a host value)
with the goodput's listeners attached and detached, in interleaved rounds; medians.

Usage: python benchmarks/live_goodput_overhead.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json

from _timing import interleaved_medians, live_loop_ns


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    rounds, n = (5, 10_000) if args.quick else (15, 50_000)
    medians = interleaved_medians(rounds, {
        "step_ns": lambda: live_loop_ns(n, lambda aggregator: aggregator.attempt_goodput.hooks()),
        "step_with_goodput_ns": lambda: live_loop_ns(n, None),
    })
    result = dict(medians)
    result["added_ns"] = result["step_with_goodput_ns"] - result["step_ns"]
    for key, value in result.items():
        print(f"{key:24s} {value:.0f}")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
