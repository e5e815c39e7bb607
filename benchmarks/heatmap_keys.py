"""Benchmark: the HTML report's heat map of a long run, its step-execution keys packed in one
integer each against rows of three.

The heat map's columns are the run's distinct (attempt, step, k) keys of step executions (k:
the k-th run of that step in its session), found session by session, and each execution's cell
is its key's place among them. As rows of three the keys were sorted with ``np.lexsort`` and
each execution's place found by sorting its rows with the keys; packed in one int64 each
(attempt + 1, step + 2**31 and k in 15, 32 and 16 bits, while every key fits) they are one
column, sorted once and searched (``np.searchsorted``). Writes ``--ranks`` ranks of 100,000 and
1,000,000 steps each (``--quick``: 10,000 and 100,000; ``report_incremental.py``'s writer: three
spans a step, its sync point, a loss metric, a tag every 100 steps, a checkpoint every 1,000),
reads and analyses it once (as ``report --html`` does: the records kept, so that the heat map
can cut a rank again where the analysis did not keep its cut), then times in this process, alternated ``--repeat`` times (the
medians):

  packed: ``Heatmap(analysis)`` as the report makes it (any cut it makes again included);
  rows: the same with the keys kept as rows of three (``_Keys(packed=False)``), the baseline.

The two heat maps must be equal (the script fails otherwise). It prints per size the seconds of
each, their ratio (packed / rows) and the time per execution against the smaller size's (1.0:
linear); ``--json``: the last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from goodtrace.analysis import analyze
from goodtrace.read.engine import Engine
from goodtrace.read.load import load_run
from goodtrace.renderers import html_charts
from report_incremental import NOW, RankWriter


def _heatmap(analysis: Any, packed: bool) -> tuple[float, dict[str, Any]]:
    keys = html_charts._Keys
    html_charts._Keys = functools.partial(keys, packed=packed)  # type: ignore[misc,assignment]
    try:
        start = time.perf_counter()
        result = html_charts.Heatmap(analysis).result()
        return time.perf_counter() - start, result
    finally:
        html_charts._Keys = keys  # type: ignore[misc]


def measure(work: Path, steps: int, ranks: int, repeat: int) -> dict[str, Any]:
    root = work / f"run-{steps}"
    for rank in range(ranks):
        RankWriter(root, rank, ranks, 64 * 2**20).steps(steps)
    # as the HTML report analyses it: the records kept, so that a rank's cut can be made again
    analysis = analyze(load_run(root, engine=Engine(workers=1)), now_wall_ns=NOW)
    times: dict[str, list[float]] = {"packed": [], "rows": []}
    results: dict[str, dict[str, Any]] = {}
    for _ in range(repeat):
        for name in ("packed", "rows"):
            seconds, results[name] = _heatmap(analysis, name == "packed")
            times[name].append(seconds)
    if results["packed"] != results["rows"]:
        raise SystemExit(f"at {steps} steps the heat map with packed keys differs from the one with rows")
    shutil.rmtree(root, ignore_errors=True)
    executions = steps * ranks
    packed_s, rows_s = statistics.median(times["packed"]), statistics.median(times["rows"])
    return {"steps": steps, "ranks": ranks, "columns": len(results["packed"]["columns"]),
            "packed_s": round(packed_s, 3), "rows_s": round(rows_s, 3),
            "packed_us_per_execution": round(packed_s / executions * 1e6, 3),
            "packed_over_rows": round(packed_s / rows_s, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=None, help="steps per rank (default 100000 1000000)")
    parser.add_argument("--ranks", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--repeat", type=int, default=3, help="alternated runs of each variant (medians)")
    parser.add_argument("--quick", action="store_true", help="10,000 and 100,000 steps (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    args = parser.parse_args()
    sizes = args.steps or ([10_000, 100_000] if args.quick else [100_000, 1_000_000])
    work = Path(tempfile.mkdtemp(prefix="goodtrace-heatmap-keys-"))
    try:
        rows = [measure(work, steps, args.ranks, args.repeat) for steps in sizes]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for row in rows:
        row["per_execution_vs_smallest"] = round(row["packed_us_per_execution"] / rows[0]["packed_us_per_execution"], 3)
        print(f"{row['ranks']} x {row['steps']:,} steps ({row['columns']} columns): packed keys {row['packed_s']} s "
              f"({row['packed_us_per_execution']} us an execution), rows {row['rows_s']} s: "
              f"{row['packed_over_rows']}x; per execution vs the smallest {row['per_execution_vs_smallest']}x")
    if args.json:
        print(json.dumps({"benchmark": "heatmap_keys", "python": sys.version.split()[0], "sizes": rows}))


if __name__ == "__main__":
    main()
