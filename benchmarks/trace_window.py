"""Benchmark: ``goodtrace trace`` of a window of a long run, its time and peak memory against the
window's length.

A long run's trace is written as a window of its steps (``--steps A:B``, or the slice the
command picks when every step would be too much for the Perfetto UI). The trace holds the
analysis of the whole run (as every view does) and reads the window's records; what it keeps
of them while it writes should not grow with the window. Writes a run of 2 ranks x ``--steps``
steps (``report_incremental.py``'s writer: three spans a step, its sync point, a loss metric,
a tag every 100 steps, a checkpoint every 1,000, 64 MiB segments), fills its segment cache with
``report --json --no-steps`` (the baseline: the analysis alone, in the same run), then times,
each in a fresh process with its peak RSS, ``goodtrace trace RUN --steps 0:W-1 -o t.json`` for
each window W of ``--windows``. It prints per window the time, the peak, the peak above the
baseline's per window step (the trace's own memory: flat when it does not grow with the
window), and the time per window step; ``--json``: the last line is one JSON object with every
figure. ``--quick``: 100,000 steps, windows of 5,000 and 50,000 (under a minute).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from report_incremental import RankWriter
from report_scale import goodtrace_cmd, timed


def measure(root: Path, windows: list[int]) -> list[dict[str, Any]]:
    base_s, base_peak, _ = timed(goodtrace_cmd("report", str(root), "--json", "--no-steps"))
    base_s, base_peak, _ = timed(goodtrace_cmd("report", str(root), "--json", "--no-steps"))  # the cache filled
    rows = []
    for window in windows:
        out = root.parent / f"trace-{window}.json"
        seconds, peak, _ = timed(goodtrace_cmd("trace", str(root), "--steps", f"0:{window - 1}", "-o", str(out)))
        size = out.stat().st_size
        out.unlink()
        rows.append({"window_steps": window, "trace_s": round(seconds, 2), "trace_peak_mib": round(peak),
                     "trace_mb": round(size / 1e6, 1), "report_s": round(base_s, 2), "report_peak_mib": round(base_peak),
                     "above_report_kib_per_window_step": round((peak - base_peak) * 1024 / window, 3),
                     "us_per_window_step": round((seconds - base_s) / window * 1e6, 1)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000, help="steps per rank (default 1,000,000)")
    parser.add_argument("--windows", type=int, nargs="+", default=None,
                        help="window lengths in steps (default 10,000 and 100,000)")
    parser.add_argument("--quick", action="store_true", help="100,000 steps, windows of 5,000 and 50,000")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    args = parser.parse_args()
    steps = 100_000 if args.quick else args.steps
    windows = args.windows or ([5_000, 50_000] if args.quick else [10_000, 100_000])
    if max(windows) > steps:
        raise SystemExit(f"a window of {max(windows)} steps is longer than the run ({steps})")
    work = Path(tempfile.mkdtemp(prefix="goodtrace-trace-window-"))
    try:
        root = work / "run"
        for rank in range(2):
            RankWriter(root, rank, 2, 64 * 2**20).steps(steps)
        rows = measure(root, windows)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for row in rows:
        print(f"2 ranks x {steps:,} steps, a window of {row['window_steps']:,}: trace {row['trace_s']} s, "
              f"peak {row['trace_peak_mib']} MiB ({row['trace_mb']} MB of JSON); report --json {row['report_s']} s, "
              f"peak {row['report_peak_mib']} MiB; above it {row['above_report_kib_per_window_step']} KiB and "
              f"{row['us_per_window_step']} us a window step")
    if args.json:
        print(json.dumps({"benchmark": "trace_window", "python": sys.version.split()[0], "steps": steps,
                          "ranks": 2, "windows": rows}))


if __name__ == "__main__":
    main()
