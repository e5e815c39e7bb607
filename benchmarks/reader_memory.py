"""Benchmark: does the reader's peak on the driver grow with step-rank pairs, or stop at DuckDB's
memory limit?

Writes runs with ``report_steps.py``'s generator at a fixed number of steps per rank and several
rank counts (default 4, 16 and 48 ranks x 50,000 steps: 0.2 M to 2.4 M step-rank pairs, 12x
apart; ``--quick``: 2, 8 and 24 ranks x 5,000 steps), then reads each in a fresh process with
``goodtrace.read.load_run`` in one process (``Engine(workers=1)``: the driver's own work, no
pool), the segment cache off:

* ``load_peak_mib``: the process's peak RSS by the end of the reading;
* ``python_peak_mib``: the most Python itself held at once during it (tracemalloc, a second
  fresh process: tracing slows the read);
* ``floor_mib``: the baseline, measured in the same run: a fresh process that imports the
  reader and opens a DuckDB connection as the load does, and reads nothing.

It prints each run's figures and, between consecutive sizes, the peak's growth per step-rank
pair added: when the reading's memory is bounded, that growth falls towards zero as the runs
grow (DuckDB, which holds the records while it folds them, spills beyond
``duckdb_sql.FOLD_MEMORY`` to the load's temporary directory). ``--json``: the last line is one
JSON object with every figure.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _timing import OWN_PEAK
from report_steps import write_rank

_LOAD = OWN_PEAK + r"""
import json, os, sys, tracemalloc
os.environ["GOODTRACE_SEGMENT_CACHE"] = "0"
from goodtrace.read import duckdb_sql
from goodtrace.read.engine import Engine
from goodtrace.read.load import load_run
trace = sys.argv[2] == "trace"
if trace:
    tracemalloc.start()
if sys.argv[1] == "-":  # the floor: the reader imported, a connection opened as the load opens it
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        duckdb_sql.connect(tmp).close()
    sessions = 0
else:
    run = load_run(sys.argv[1], engine=Engine(workers=1))
    sessions = len(run.sessions)
out = {"peak_mib": own_peak_kib() / 1024, "sessions": sessions,
       "fold_memory": duckdb_sql.FOLD_MEMORY}
if trace:
    out["python_peak_mib"] = tracemalloc.get_traced_memory()[1] / 2**20
print(json.dumps(out))
"""


def _child(run: str, mode: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", _LOAD, run, mode], capture_output=True, text=True, check=True,
                          env={**os.environ, "GOODTRACE_PROGRESS": "0"})
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def measure(root: Path, ranks: list[int], steps: int) -> dict[str, Any]:
    floor = _child("-", "plain")
    rows = []
    for count in ranks:
        run = root / f"r{count}"
        run.mkdir()
        for rank in range(count):
            write_rank(run, rank, count, steps)
        json_bytes = sum(p.stat().st_size for p in run.rglob("*.jsonl"))
        plain, traced = _child(str(run), "plain"), _child(str(run), "trace")
        rows.append({"ranks": count, "steps": steps, "pairs": count * steps, "json_mib": json_bytes / 2**20,
                     "load_peak_mib": plain["peak_mib"], "python_peak_mib": traced["python_peak_mib"],
                     "peak_over_floor": plain["peak_mib"] / floor["peak_mib"]})
        for path in sorted(run.rglob("*"), reverse=True):  # make room for the next size
            path.unlink() if path.is_file() else path.rmdir()
        run.rmdir()
    growth = [(b["load_peak_mib"] - a["load_peak_mib"]) * 2**20 / (b["pairs"] - a["pairs"])
              for a, b in itertools.pairwise(rows)]
    return {"floor_mib": floor["peak_mib"], "fold_memory": floor["fold_memory"], "runs": rows,
            "growth_b_per_pair": growth,
            "largest_over_smallest_peak": rows[-1]["load_peak_mib"] / rows[0]["load_peak_mib"],
            "largest_over_smallest_pairs": rows[-1]["pairs"] / rows[0]["pairs"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 16, 48])
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--quick", action="store_true", help="2, 8 and 24 ranks x 5,000 steps")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    ranks, steps = ([2, 8, 24], 5_000) if args.quick else (args.ranks, args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        out = measure(Path(tmp), ranks, steps)
    print(f"floor (reader imported, DuckDB opened): {out['floor_mib']:.0f} MiB; "
          f"DuckDB memory limit while folding: {out['fold_memory']}")
    for row in out["runs"]:
        print(f"{row['ranks']:5d} ranks x {row['steps']:,} steps ({row['json_mib']:,.0f} MiB of JSON lines): "
              f"peak {row['load_peak_mib']:.0f} MiB ({row['peak_over_floor']:.2f}x the floor), "
              f"Python's own peak {row['python_peak_mib']:.0f} MiB")
    for (a, b), grew in zip(itertools.pairwise(out["runs"]), out["growth_b_per_pair"], strict=True):
        print(f"{a['ranks']} -> {b['ranks']} ranks: the peak grew {grew:.1f} B a step-rank pair added")
    print(f"largest run: {out['largest_over_smallest_pairs']:.0f}x the pairs, "
          f"{out['largest_over_smallest_peak']:.2f}x the peak")
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
