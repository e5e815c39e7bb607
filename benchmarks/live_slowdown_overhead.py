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
import functools
import json

from _timing import interleaved_medians, live_loop_ns


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    rounds, lengths = (5, (2_000, 20_000)) if args.quick else (11, (10_000, 100_000))
    result: dict[str, float] = {}
    for n in lengths:
        medians = interleaved_medians(rounds, {
            "without": functools.partial(live_loop_ns, n, lambda aggregator: aggregator.slowdown.hooks()),
            "with": functools.partial(live_loop_ns, n, None),
        })
        result[f"step_{n}_ns"] = medians["without"]
        result[f"step_{n}_with_slowdown_ns"] = medians["with"]
        result[f"added_{n}_ns"] = result[f"step_{n}_with_slowdown_ns"] - result[f"step_{n}_ns"]
    for key, value in result.items():
        print(f"{key:32s} {value:.0f}")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
