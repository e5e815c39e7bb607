"""Benchmark: the anomalies of a run that records an event every step.

Beside each anomaly the report lists what overlapped it, the events of its steps among them.
That list was made by walking every event of the session once per anomaly, so a run that
records an event every step (a health check, a data probe) with many anomalies cost the
product of the two: 27.6 s for 20,000 steps here, growing with the square of the run. The
events are now indexed by step once per session (``StepMarks.events``).

The run: one rank (``tests/helpers/builders.py``'s records), steps of 0.1 s with every fifth
one 0.5 s (an anomaly: a fifth of the steps), at two sizes an order of magnitude apart
(20,000 and 200,000 steps; ``--quick``: 2,000 and 20,000), once with an event in every step
and once without (the baseline, in the same run). It times ``analyze`` in this process and
prints per size the seconds with and without events, their ratio, and the time per step
against the smaller size's (1.0: linear). ``--json``: the last line is one JSON object with
every figure.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from _timing import load_file
from goodtrace.analysis import analyze

builders = load_file("builders", "tests/helpers/builders.py")


def write(root: Path, steps: int, events: bool) -> None:
    p = builders.Proc(root)
    t = 1.0
    for k in range(steps):
        length = 0.5 if k % 5 == 0 else 0.1
        p.step(k, t, t + length).sync(k, t + length)
        if events:
            p.event("probe", t + length / 2, step=k)
        t += length
    p.finish(t)
    p.write()


def measure(work: Path, steps: int, events: bool) -> dict[str, Any]:
    root = work / f"{steps}-{'events' if events else 'none'}"
    write(root, steps, events)
    loaded = builders.load(root)
    start = time.perf_counter()
    result = analyze(loaded)
    seconds = time.perf_counter() - start
    shutil.rmtree(root, ignore_errors=True)
    return {"analyze_s": round(seconds, 3), "anomalies": len(result.anomalies)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 and 20,000 steps (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    parser.add_argument("--steps", type=int, nargs="+", help="the sizes (steps)")
    args = parser.parse_args()
    sizes = args.steps or ([2_000, 20_000] if args.quick else [20_000, 200_000])
    work = Path(tempfile.mkdtemp(prefix="goodtrace-anomaly-events-"))
    rows: list[dict[str, Any]] = []
    try:
        for steps in sizes:
            row: dict[str, Any] = {"steps": steps, "events": measure(work, steps, True),
                                   "baseline": measure(work, steps, False)}
            row["over_baseline"] = round(row["events"]["analyze_s"] / row["baseline"]["analyze_s"], 2)
            first = rows[0] if rows else row
            row["per_step_vs_smallest"] = round(row["events"]["analyze_s"] / steps
                                                / (first["events"]["analyze_s"] / first["steps"]), 2)
            rows.append(row)
            print(f"{steps:,} steps, {row['events']['anomalies']:,} anomalies: analyze {row['events']['analyze_s']} s "
                  f"with an event every step, {row['baseline']['analyze_s']} s without ({row['over_baseline']}x); "
                  f"time per step {row['per_step_vs_smallest']}x the smallest size's (1.0: linear)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps({"benchmark": "anomaly_events", "rows": rows}))


if __name__ == "__main__":
    main()
