"""Benchmark: ``goodtrace report`` of a short run on many ranks (a job on thousands of GPUs).

Generates RANKS x 20 steps (``report_scale.py``'s run: 10 spans a step, heartbeats, 8 ranks a
host) at two sizes an order of magnitude apart, 1,000 and 10,000 ranks (``--quick``: 200 and
2,000), then, each in a fresh process:

  baseline: every rank file read and each of its lines parsed with ``json.loads`` (the
            standard library's floor for reading the run, measured in the same run);
  cold:     ``goodtrace report RUN --json --no-steps`` with the segment cache off;
  warm:     the same with the cache filled by a first report (what a second report of a
            finished run pays: the analysis of every rank again);
  parts:    the warm report's fold (``load_run``) and its analysis with the JSON, timed apart
            in one process that first makes the command's memory and collector settings
            (``cli.analysed``).

The cold and warm reports must be identical (the script fails otherwise). It prints per size
the seconds and peak RSS, the ratios to the baseline, and the time per rank against the
smaller size's (1.0: linear in the ranks). ``--json``: the last line is one JSON object with
every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _timing import compile_package, run_measured
from report_scale import generate

STEPS = 20
SPANS = 10

BASELINE = """
import json, os, sys
n = 0
for folder, _, names in os.walk(sys.argv[1]):
    for name in names:
        if name.endswith(".jsonl"):
            with open(os.path.join(folder, name), "rb") as handle:
                for line in handle:
                    json.loads(line)
                    n += 1
print(n)
"""

# the warm report's fold and analysis timed apart, with the command's process settings
PARTS = """
import json, sys, time
from goodtrace.cli import analysed
analysed.return_freed_memory()
getattr(analysed, "collect_less_often", lambda: None)()  # (since 2026-11-28)
from goodtrace.analysis import analyze
from goodtrace.read.load import load_run
from goodtrace.renderers.json_report import render_json
t0 = time.perf_counter()
loaded = load_run(sys.argv[1])
t1 = time.perf_counter()
render_json(analyze(loaded, now_wall_ns=time.time_ns(), release_records=True, keep_cuts=False), include_steps=False)
t2 = time.perf_counter()
print(json.dumps({"fold_s": t1 - t0, "analysis_s": t2 - t1}))
"""


def timed(args: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MiB, from ``wait4``) and stdout of one fresh process."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        wall, peak, code = run_measured(args, env={**os.environ, "GOODTRACE_PROGRESS": "0", **(env or {})},
                                        stdout=out, stderr=err)
        out.seek(0)
        err.seek(0)
        if code:
            raise SystemExit(f"{' '.join(args[:4])} failed: {err.read()}")
        return wall, peak, out.read()


def report(run: Path, cache: bool) -> tuple[float, float, str]:
    return timed([sys.executable, "-m", "goodtrace", "report", str(run), "--json", "--no-steps"],
                 {"GOODTRACE_SEGMENT_CACHE": "1" if cache else "0"})


def measure(run: Path, ranks: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    records = generate(run, ranks, STEPS, SPANS, os.cpu_count() or 1)
    row: dict[str, Any] = {"ranks": ranks, "steps": STEPS, "records": records,
                           "jsonl_mb": round(sum(p.stat().st_size for p in run.rglob("*.jsonl")) / 1e6, 1),
                           "generate_s": round(time.perf_counter() - t0, 2)}
    row["baseline_s"] = round(timed([sys.executable, "-c", BASELINE, str(run)])[0], 2)
    cold_s, cold_mib, cold = report(run, cache=False)
    report(run, cache=True)  # fills the cache, as a first report does
    warm_s, warm_mib, warm = report(run, cache=True)
    if warm != cold:
        raise SystemExit("the warm report differs from the cold one")
    parts = json.loads(timed([sys.executable, "-c", PARTS, str(run)])[2].strip().splitlines()[-1])
    row.update(cold_s=round(cold_s, 2), cold_peak_mib=round(cold_mib), warm_s=round(warm_s, 2),
               warm_peak_mib=round(warm_mib), warm_fold_s=round(parts["fold_s"], 2),
               warm_analysis_s=round(parts["analysis_s"], 2),
               cold_over_baseline=round(cold_s / row["baseline_s"], 3),
               warm_over_baseline=round(warm_s / row["baseline_s"], 3),
               warm_ms_per_rank=round(warm_s / ranks * 1e3, 3),
               analysis_ms_per_rank=round(parts["analysis_s"] / ranks * 1e3, 3))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 and 2,000 ranks (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    parser.add_argument("--ranks", type=int, nargs="+", help="the sizes (ranks)")
    args = parser.parse_args()
    sizes = args.ranks or ([200, 2_000] if args.quick else [1_000, 10_000])
    compile_package()  # no report below compiles goodtrace's source: a user's install has its bytecode
    rows: list[dict[str, Any]] = []
    for ranks in sizes:
        base = Path(tempfile.mkdtemp(prefix="goodtrace-ranks-"))
        try:
            row = measure(base / "run", ranks)
        finally:
            shutil.rmtree(base, ignore_errors=True)
        if rows:
            for key in ("warm_ms_per_rank", "analysis_ms_per_rank"):
                row[f"{key}_vs_smallest"] = round(row[key] / rows[0][key], 3)
        rows.append(row)
        print(f"{ranks:>6,} ranks x {STEPS} steps ({row['records']:,} records, {row['jsonl_mb']} MB): "
              f"json.loads {row['baseline_s']} s; cold report {row['cold_s']} s ({row['cold_peak_mib']} MiB, "
              f"{row['cold_over_baseline']}x); warm {row['warm_s']} s ({row['warm_peak_mib']} MiB, "
              f"{row['warm_over_baseline']}x): fold {row['warm_fold_s']} s, analysis {row['warm_analysis_s']} s, "
              f"{row['warm_ms_per_rank']} ms a rank", flush=True)
    if args.json:
        print(json.dumps({"benchmark": "many_ranks_report", "rows": rows}))


if __name__ == "__main__":
    main()
