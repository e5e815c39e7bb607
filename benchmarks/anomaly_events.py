"""Benchmark: the anomalies of a run that records an event every step, or names a span after its step.

Beside each anomaly the report lists what overlapped it: the events of its steps, and the
spans that took unusually long there. The first walked every event of the session once per
anomaly; the second made, per span name, a column of every step (for its median) and summed
every name for each anomaly. So a run that records an event every step (a health check, a
data probe), or names a span after its step (``f"batch {k}"``), with many anomalies cost the
product of the two, growing with the square of the run. The events are now indexed by step
once per session (``StepDetail.events``), the medians come from the values sorted per name,
and an anomaly sums the names its steps have.

The run: one rank (``tests/helpers/builders.py``'s records), steps of 0.1 s with every fifth
one 0.5 s (an anomaly: a fifth of the steps), at two sizes an order of magnitude apart
(20,000 and 200,000 steps; ``--quick``: 2,000 and 20,000), three times: with an event in
every step ("events"), with a compute span named after its step in every step ("names"), and
with neither (the baseline, in the same run). It times ``analyze`` in this process and prints
per size the seconds of each, their ratios to the baseline, and the time per step against the
smaller size's (1.0: linear). ``--json``: the last line is one JSON object with every figure.
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


VARIANTS = ("events", "names", "baseline")


def write(root: Path, steps: int, variant: str) -> None:
    p = builders.Proc(root)
    t = 1.0
    for k in range(steps):
        length = 0.5 if k % 5 == 0 else 0.1
        p.step(k, t, t + length).sync(k, t + length)
        if variant == "events":
            p.event("probe", t + length / 2, step=k)
        elif variant == "names":
            p.span(f"batch {k}", t, t + length * 0.9, cat="compute", step=k)
        t += length
    p.finish(t)
    p.write()


def measure(work: Path, steps: int, variant: str) -> dict[str, Any]:
    root = work / f"{steps}-{variant}"
    write(root, steps, variant)
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
            row: dict[str, Any] = {"steps": steps, **{variant: measure(work, steps, variant) for variant in VARIANTS}}
            first = rows[0] if rows else row
            for variant in ("events", "names"):
                row[f"{variant}_over_baseline"] = round(row[variant]["analyze_s"] / row["baseline"]["analyze_s"], 2)
                row[f"{variant}_per_step_vs_smallest"] = round(row[variant]["analyze_s"] / steps
                                                               / (first[variant]["analyze_s"] / first["steps"]), 2)
            rows.append(row)
            print(f"{steps:,} steps, {row['baseline']['anomalies']:,} anomalies: analyze {row['events']['analyze_s']} s "
                  f"with an event every step ({row['events_over_baseline']}x the baseline; time per step "
                  f"{row['events_per_step_vs_smallest']}x the smallest size's), {row['names']['analyze_s']} s with a "
                  f"span named after its step ({row['names_over_baseline']}x; "
                  f"{row['names_per_step_vs_smallest']}x), {row['baseline']['analyze_s']} s with neither "
                  "(1.0 per step: linear)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps({"benchmark": "anomaly_events", "rows": rows}))


if __name__ == "__main__":
    main()
