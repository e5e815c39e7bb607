"""Benchmark: what a rank's own compactor (``compact_interval_s``) costs the job, and what it
saves the report.

Two ranks, real processes through the public API (the recorder, its native writer), each run
a CPU-bound loop of ``--steps`` steps (three spans, the step, a loss metric: about five records
a step, 20 us of busy work each: about 200,000 records a second and rank, far more than a
real job writes, and the worst case for the compactor, which competes with the ranks for the
machine's cores) in segments of ``--segment-mib`` MiB (8: many close during the
job), twice: with the compactor off, then on (``compact_interval_s=1``). This script makes
itself the *subreaper* of the compactors (``prctl(PR_SET_CHILD_SUBREAPER)``), so that when a
rank exits its compactor becomes this process's child, and its CPU time and peak memory are
read from ``wait4`` when it ends. Then, each in a fresh process, the JSON report (``report
--json --no-steps``) of the run with the cache off (every file parsed: the baseline) and with
the ranks' chunks (nothing parsed); the two must be identical.

Printed per size: the job's wall time off and on (ratio), the compactors' CPU seconds (all
ranks), per GB of JSON lines, and their peak RSS, the seconds from the ranks' exit to the
compactors' (their last pass), and the report's time cold and with the chunks (ratio).
``--quick``: 5,000 and 50,000 steps (under a minute); default 50,000 and 500,000.
``--json``: the last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RANK = r"""
import sys, time
import goodtrace as gt
run, rank, steps, segment, interval = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
gt.init(run, rank=rank, world_size=2, segment_bytes=segment, compact_interval_s=interval)
t0 = time.perf_counter()
for k in range(steps):
    with gt.step(k):
        with gt.span("data", "data"):
            pass
        with gt.span("forward", "compute"):
            end = time.perf_counter_ns() + 20_000  # 20 us of work: a regular step (the writer keeps up)
            while time.perf_counter_ns() < end:
                pass
        with gt.span("backward", "compute"):
            pass
        gt.metric("loss", 1.0 / (k + 1), step=k)
gt.finish()
print(time.perf_counter() - t0)
"""

REPORT = r"""
import json, sys, time
t0 = time.perf_counter()
from goodtrace.analysis import analyze
from goodtrace.read.engine import Engine
from goodtrace.read.load import load_run
from goodtrace.renderers.json_report import render_json
loaded = load_run(sys.argv[1], engine=Engine(workers=1), use_cache=sys.argv[3] == "1")
text = render_json(analyze(loaded, now_wall_ns=2_000_000_000_000_000_000, release_records=True, keep_cuts=False), include_steps=False)
with open(sys.argv[2], "w") as handle:
    handle.write(text)
print(json.dumps({"total_s": time.perf_counter() - t0, "read_mb": loaded.read_bytes / 1e6}))
"""

PR_SET_CHILD_SUBREAPER = 36


def subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("prctl(PR_SET_CHILD_SUBREAPER) failed: this benchmark needs Linux")


def job(run: Path, steps: int, segment: int, interval: float) -> dict[str, Any]:
    start = time.perf_counter()
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(run), str(rank), str(steps), str(segment),
                               str(interval)], stdout=subprocess.PIPE, text=True) for rank in range(2)]
    loops = []
    for proc in ranks:
        out, _ = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"a rank failed ({proc.returncode})")
        loops.append(float(out.strip().splitlines()[-1]))
    ended = time.perf_counter()
    cpu, rss, compactors = 0.0, 0, 0
    while True:  # the orphaned compactors, now children of this process
        try:
            _, _, usage = os.wait4(-1, 0)
        except ChildProcessError:
            break
        compactors += 1
        cpu += usage.ru_utime + usage.ru_stime
        rss = max(rss, usage.ru_maxrss)
    row: dict[str, Any] = {"job_s": round(ended - start, 2), "loop_s": round(max(loops), 2)}
    if interval > 0:
        row.update(compactors=compactors, compact_cpu_s=round(cpu, 2), compact_rss_mib=round(rss / 1024, 1),
                   last_pass_s=round(time.perf_counter() - ended, 2))
    return row


def report(run: Path, out: Path, cache: bool) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", REPORT, str(run), str(out), "1" if cache else "0"],
                          capture_output=True, text=True, check=False,
                          env=dict(os.environ, GOODTRACE_PROGRESS="0"))
    if done.returncode != 0:
        raise SystemExit(f"the report failed: {done.stderr}")
    return {k: round(v, 2) for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def measure(base: Path, steps: int, segment: int) -> dict[str, Any]:
    row: dict[str, Any] = {"steps": steps, "ranks": 2}
    row["off"] = job(base / "off", steps, segment, 0)
    row["on"] = job(base / "on", steps, segment, 1.0)
    run = base / "on"
    jsonl = sum(p.stat().st_size for p in run.rglob("*.jsonl"))
    row.update(jsonl_mb=round(jsonl / 1e6, 1), segments=len(list(run.rglob("*.jsonl"))),
               chunks_mb=round(sum(p.stat().st_size for p in (run / "compact").rglob("*.parquet")) / 1e6, 1))
    row["job_on_over_off"] = round(row["on"]["job_s"] / row["off"]["job_s"], 3)
    row["compact_cpu_s_per_gb"] = round(row["on"]["compact_cpu_s"] / (jsonl / 1e9), 1)
    row["report_cold"] = report(run, base / "cold.json", False)
    row["report_chunks"] = report(run, base / "chunks.json", True)
    row["identical"] = (base / "cold.json").read_bytes() == (base / "chunks.json").read_bytes()
    if not row["identical"]:
        raise SystemExit("the report from the ranks' chunks differs from the cold one")
    row["report_chunks_over_cold"] = round(row["report_chunks"]["total_s"] / row["report_cold"]["total_s"], 3)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5,000 and 50,000 steps (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    parser.add_argument("--steps", type=int, nargs="+", help="the sizes (steps per rank)")
    parser.add_argument("--segment-mib", type=float, default=8.0)
    args = parser.parse_args()
    subreaper()
    sizes = args.steps or ([5_000, 50_000] if args.quick else [50_000, 500_000])
    rows = []
    for steps in sizes:
        base = Path(tempfile.mkdtemp(prefix="goodtrace-rank-compact-"))
        try:
            row = measure(base, steps, int(args.segment_mib * 2**20))
        finally:
            shutil.rmtree(base, ignore_errors=True)
        rows.append(row)
        on, off = row["on"], row["off"]
        print(f"{steps:>9,} steps x 2 ranks ({row['jsonl_mb']} MB in {row['segments']} segments): job {off['job_s']} s "
              f"off, {on['job_s']} s on = {row['job_on_over_off']}x; compactors {on['compact_cpu_s']} CPU s "
              f"({row['compact_cpu_s_per_gb']} s/GB), peak {on['compact_rss_mib']} MiB, last pass done "
              f"{on['last_pass_s']} s after the ranks; chunks {row['chunks_mb']} MB; report cold "
              f"{row['report_cold']['total_s']} s, from the chunks {row['report_chunks']['total_s']} s "
              f"(read {row['report_chunks']['read_mb']} MB) = {row['report_chunks_over_cold']}x; identical JSON",
              flush=True)
    if args.json:
        print(json.dumps({"benchmark": "rank_compact", "rows": rows}))


if __name__ == "__main__":
    main()
