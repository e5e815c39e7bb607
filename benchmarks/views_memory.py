"""Benchmark: the memory of the views that walk every rank's cut (``report --html``, ``trace``)
against ``report --json``, at two run lengths.

The HTML report's heat map and gantt chart and the trace read every session's cut after the
analysis (``RunAnalysis.cuts``). The analysis keeps the reference sessions' cuts, and others
within ``session_cuts.KEEP_CUTS_BYTES`` (128 MiB), in memory. The others were cut again from
the records when read, so those commands kept the loaded run model (its DuckDB tables) open
and its records; now every cut past the bound is written to a temporary file as it is made and
read back when asked for, and the records are released as each session is cut, as for
``report --json``.

Writes ``--ranks`` ranks (2) of S and 10 S steps (100,000 and 1,000,000; ``--quick``: 10,000 and
100,000) with ``report_incremental.py``'s writer (64 MiB segments), reads each once (the segment
cache filled, so that each command reads the same), then in a fresh process each measures the
time and peak RSS of

  json: ``goodtrace report RUN --json`` (the baseline: what the numbers hold);
  html: ``goodtrace report RUN --html FILE``;
  trace: ``goodtrace trace RUN -o FILE --steps A:B`` (20 steps in the middle).

It prints per size each command's seconds and peak and what html and trace hold beyond json,
and that excess per step-rank pair added from the smaller size to the larger; ``--keep-mib``
lowers the bound (a run this size then passes it as a week-long run of many ranks passes 128
MiB); ``--json``: the last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _timing import OWN_PEAK, compile_package
from report_incremental import RankWriter

# a goodtrace command (the cuts' memory bound lowered where asked); prints its peak RSS (KiB)
# last: its memory's own high-water mark (``_timing.OWN_PEAK``)
_COMMAND = OWN_PEAK + """
import sys
from goodtrace.analysis import session_cuts
if int(sys.argv[1]):
    session_cuts.KEEP_CUTS_BYTES = int(sys.argv[1])
from goodtrace.cli import main
code = main(sys.argv[2:])
print(own_peak_kib(), file=sys.stderr)
sys.exit(code)
"""


def _run(keep_bytes: int, argv: list[str]) -> dict[str, float]:
    env = dict(os.environ, GOODTRACE_PROGRESS="0")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _COMMAND, str(keep_bytes), *argv], capture_output=True, text=True,
                          env=env, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{argv[0]} failed: {done.stderr[-2000:]}")
    return {"s": round(seconds, 2), "peak_mib": round(int(done.stderr.strip().splitlines()[-1]) / 1024, 1)}


def measure(work: Path, ranks: int, steps: int, keep_bytes: int) -> dict[str, Any]:
    run = work / f"run-{steps}"
    for rank in range(ranks):
        RankWriter(run, rank, ranks, 64 * 2**20).steps(steps)
    _run(keep_bytes, ["report", str(run), "--json", "--no-steps"])  # the segment cache filled: each reads the same
    middle = steps // 2
    row: dict[str, Any] = {"ranks": ranks, "steps": steps, "pairs": ranks * steps}
    row["json"] = _run(keep_bytes, ["report", str(run), "--json"])
    row["html"] = _run(keep_bytes, ["report", str(run), "--html", str(work / "page.html")])
    row["trace"] = _run(keep_bytes, ["trace", str(run), "-o", str(work / "trace.json"), "--steps",
                                     f"{middle}:{middle + 19}"])
    for view in ("html", "trace"):
        row[f"{view}_over_json_mib"] = round(row[view]["peak_mib"] - row["json"]["peak_mib"], 1)
    shutil.rmtree(run, ignore_errors=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--steps", type=int, default=None, help="S: runs of S and 10 S steps (default 100,000)")
    parser.add_argument("--keep-mib", type=float, default=0.0, help="KEEP_CUTS_BYTES here, MiB (default: as shipped, 128)")
    parser.add_argument("--quick", action="store_true", help="10,000 and 100,000 steps (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    args = parser.parse_args()
    ranks = args.ranks
    steps = args.steps or (10_000 if args.quick else 100_000)
    keep_bytes = int(args.keep_mib * 2**20)
    compile_package()
    work = Path(tempfile.mkdtemp(prefix="goodtrace-views-memory-"))
    try:
        rows = [measure(work, ranks, n, keep_bytes) for n in (steps, 10 * steps)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    small, large = rows
    growth = {view: round((large[f"{view}_over_json_mib"] - small[f"{view}_over_json_mib"]) * 2**20
                          / (large["pairs"] - small["pairs"]), 1) for view in ("html", "trace")}
    for row in rows:
        print(f"{row['ranks']} ranks x {row['steps']:,} steps (cuts kept in memory: {args.keep_mib or 128:g} MiB): "
              + "; ".join(f"{name} {row[name]['s']} s, peak {row[name]['peak_mib']} MiB" for name in ("json", "html", "trace"))
              + f"; beyond json: html {row['html_over_json_mib']} MiB, trace {row['trace_over_json_mib']} MiB")
    print(f"what html and trace hold beyond json, per step-rank pair added: html {growth['html']} B, "
          f"trace {growth['trace']} B")
    if args.json:
        print(json.dumps({"benchmark": "views_memory", "python": sys.version.split()[0], "keep_mib": args.keep_mib or 128,
                          "sizes": rows, "beyond_json_b_per_pair": growth}))


if __name__ == "__main__":
    main()
