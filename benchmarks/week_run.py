"""Benchmark: a week of many ranks, written and read for real on this machine (not extrapolated).

Writes a run of ``--ranks`` ranks (64) with each size of ``--steps`` steps per rank (60,480 and
604,800: a tenth of a week and a week at one step a second), the step content of
``report_steps.py`` (three spans, the step, its sync point, a loss metric; a tag every 100 steps,
a checkpoint every 1,000, heartbeats each second; about 6.5 records a step and rank), in
segments of 64 MiB (the writer's default; ``--quick``: 4 ranks x 1,000 and 10,000 steps in 4 MiB
segments), the ranks written by a process per core. Then, each command in a fresh process
started as a user starts it (``goodtrace ...``, the default workers, its wall time and its own
peak RSS: ``_timing.run_measured``):

  first report: ``goodtrace report RUN --json --no-steps``, the segment cache on (the default:
      every line parsed, the closed segments' reductions kept);
  then ``--grow`` more steps (1,000) are appended to every rank, as the job goes on, and
  re-report: the same command (the closed segments from the cache, the new bytes parsed);
  cold report: the same command on the same grown files with the cache off
      (``GOODTRACE_SEGMENT_CACHE=0``), the re-report's baseline (the JSON must be identical);
  ``goodtrace report RUN --html FILE`` (after the re-report: the cache filled);
  ``goodtrace trace RUN -o FILE`` (the default: a slice of steps once the whole run would be
      past ``--limit-mb``);
  ``goodtrace watch RUN --once`` (the live view's first frame);
  ``goodtrace records RUN --json`` (the raw listing: every line decoded).

The baseline of the reading, in the same run: ``json.loads`` of every line of rank 0's files
(in this process), times the ranks: what any reader of the lines pays, on one core (of the files
the first report read; the cold report reads ``--grow`` steps more).
Prints per size every time, peak and ratio; ``--json``: the last line is one JSON object with
every figure. ``--keep DIR`` writes the runs under DIR and leaves them there.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _timing import compile_package, run_measured
from report_incremental import RankWriter

CORES = max(1, len(os.sched_getaffinity(0)))


def _write(root: str, ranks: list[int], world: int, steps: int, segment_bytes: int) -> list[RankWriter]:
    """Ranks ``ranks`` of the run, ``steps`` steps each (in a worker process); their writers, to go on."""
    writers = []
    for rank in ranks:
        writer = RankWriter(Path(root), rank, world, segment_bytes)
        writer.steps(steps)
        writers.append(writer)
    return writers


def _grow(writers: list[RankWriter], steps: int) -> None:
    for writer in writers:
        writer.steps(steps)


def _split(ranks: int) -> list[list[int]]:
    return [list(range(k, ranks, CORES)) for k in range(min(CORES, ranks))]


def _baseline_s(root: Path, ranks: int) -> float:
    """``json.loads`` of every line of rank 0's files, times the ranks (seconds)."""
    started = time.perf_counter()
    for path in sorted((root / "rank-00000").glob("*.jsonl")):
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                json.loads(line)
    return (time.perf_counter() - started) * ranks


def _command(cmd: list[str], out: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """``goodtrace CMD`` in a fresh process, its output in ``out``: its seconds and peak (MiB)."""
    with open(out, "w") as stdout, open(out.with_suffix(".err"), "w") as stderr:
        seconds, peak, code = run_measured([sys.executable, "-m", "goodtrace", *cmd], stdout=stdout, stderr=stderr,
                                           env={**os.environ, "GOODTRACE_PROGRESS": "0", **(env or {})})
    if code != 0:
        raise SystemExit(f"goodtrace {' '.join(cmd)} failed ({code}): {out.with_suffix('.err').read_text()[-2000:]}")
    return {"s": round(seconds, 2), "peak_mib": round(peak, 1)}


def measure(base: Path, ranks: int, steps: int, grow: int, segment_bytes: int) -> dict[str, Any]:
    root, out = base / "run", base / "out"
    out.mkdir(parents=True, exist_ok=True)
    context = multiprocessing.get_context("fork")
    started = time.perf_counter()
    with context.Pool(min(CORES, ranks)) as pool:
        parts = pool.starmap(_write, [(str(root), mine, ranks, steps, segment_bytes) for mine in _split(ranks)])
    row: dict[str, Any] = {"ranks": ranks, "steps": steps, "generate_s": round(time.perf_counter() - started, 1)}
    files = sorted(root.rglob("*.jsonl"))
    row["segments"] = len(files)
    row["jsonl_gb"] = round(sum(p.stat().st_size for p in files) / 1e9, 2)
    report = ["report", str(root), "--json", "--no-steps"]
    row["first_report"] = _command(report, out / "first.json")
    row["records"] = json.loads((out / "first.json").read_text())["records"]  # of the files it read
    row["baseline_s"] = round(_baseline_s(root, ranks), 2)
    with context.Pool(min(CORES, ranks)) as pool:
        pool.starmap(_grow, [(writers, grow) for writers in parts])
    row["more_steps"] = grow
    row["re_report"] = _command(report, out / "warm.json")
    row["cold_report"] = _command(report, out / "cold.json", {"GOODTRACE_SEGMENT_CACHE": "0"})
    row["identical"] = (out / "warm.json").read_bytes() == (out / "cold.json").read_bytes()
    if not row["identical"]:
        raise SystemExit("the re-report differs from the cold report")
    row["html"] = _command(["report", str(root), "--html", str(out / "r.html")], out / "html.txt")
    row["html"]["mb"] = round((out / "r.html").stat().st_size / 1e6, 1)
    row["trace"] = _command(["trace", str(root), "-o", str(out / "t.json")], out / "trace.txt")
    row["trace"]["mb"] = round((out / "t.json").stat().st_size / 1e6, 1)
    row["watch"] = _command(["watch", str(root), "--once"], out / "watch.txt")
    row["records_listing"] = _command(["records", str(root), "--json"], out / "records.json")
    cache = root / "compact"
    row["cache_gb"] = round(sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()) / 1e9, 2)
    row["re_report_over_cold"] = round(row["re_report"]["s"] / row["cold_report"]["s"], 3)
    row["first_report_over_baseline"] = round(row["first_report"]["s"] / row["baseline_s"], 2)
    row["cold_report_over_baseline"] = round(row["cold_report"]["s"] / row["baseline_s"], 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 ranks x 1,000 and 10,000 steps (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    parser.add_argument("--ranks", type=int, help="ranks (64; --quick: 4)")
    parser.add_argument("--steps", type=int, nargs="+", help="the sizes, steps per rank (60480 604800)")
    parser.add_argument("--grow", type=int, help="steps appended to every rank before the re-report (1,000)")
    parser.add_argument("--segment-mib", type=float, help="segment size in MiB (64; --quick: 4)")
    parser.add_argument("--keep", metavar="DIR", help="write the runs under DIR and leave them there")
    args = parser.parse_args()
    ranks = args.ranks or (4 if args.quick else 64)
    sizes = args.steps or ([1_000, 10_000] if args.quick else [60_480, 604_800])
    grow = args.grow or (100 if args.quick else 1_000)
    segment_bytes = int((args.segment_mib or (4.0 if args.quick else 64.0)) * 2**20)
    if ranks < 1 or grow < 1 or any(s < 1 for s in sizes) or segment_bytes < 1:
        parser.error("--ranks, --steps, --grow and --segment-mib must be positive")
    compile_package()  # no command below compiles goodtrace's source: a user's install has its bytecode
    rows = []
    for steps in sizes:
        base = Path(args.keep) / f"{ranks}x{steps}" if args.keep else Path(tempfile.mkdtemp(prefix="goodtrace-week-"))
        try:
            row = measure(base, ranks, steps, grow, segment_bytes)
        finally:
            if not args.keep:
                shutil.rmtree(base, ignore_errors=True)
        rows.append(row)
        print(f"{ranks} ranks x {steps:,} steps ({row['records']:,} records, {row['jsonl_gb']} GB, {row['segments']} "
              f"segments, written in {row['generate_s']} s); json.loads of every line {row['baseline_s']} s\n"
              f"  first report {row['first_report']['s']} s ({row['first_report_over_baseline']}x json.loads), peak "
              f"{row['first_report']['peak_mib']} MiB; cache {row['cache_gb']} GB\n"
              f"  +{grow:,} steps: re-report {row['re_report']['s']} s, peak {row['re_report']['peak_mib']} MiB; cold "
              f"report {row['cold_report']['s']} s ({row['cold_report_over_baseline']}x json.loads), peak "
              f"{row['cold_report']['peak_mib']} MiB: re-report {row['re_report_over_cold']}x the cold report, "
              f"identical JSON\n"
              f"  report --html {row['html']['s']} s, peak {row['html']['peak_mib']} MiB ({row['html']['mb']} MB); "
              f"trace {row['trace']['s']} s, peak {row['trace']['peak_mib']} MiB ({row['trace']['mb']} MB); watch "
              f"--once {row['watch']['s']} s, peak {row['watch']['peak_mib']} MiB; records {row['records_listing']['s']}"
              f" s, peak {row['records_listing']['peak_mib']} MiB", flush=True)
    if args.json:
        print(json.dumps({"benchmark": "week_run", "rows": rows}))


if __name__ == "__main__":
    main()
