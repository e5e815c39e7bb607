"""Benchmark: the analysis of a run of many sessions (a job that restarted thousands of times).

``analyze(load_run(RUN))``, the library's default (``release_records=False``: every session's
records stay fetchable), went over the sessions three times: to cut them, then for the clock
alignment and for the event list. The loader fetches a block of sessions at a time, and a
session of a block fetched before alone, one query per table; so each later pass fetched the
sessions one by one, every query reading the whole table: time that grew with the square of
the sessions. The cut now keeps what the later passes read (``Reduced.records``).

The run: one rank (``tests/helpers/builders.py``'s records) that restarts after every 5 steps
(two of them re-done each time), at two sizes an order of magnitude apart (300 and 3,000
sessions; ``--quick``: 100 and 1,000). It times ``load_run`` and ``analyze`` in this process,
with the records kept (the library's default) and released (what ``goodtrace report`` does,
the baseline, in the same run; the two reports must be identical), and prints the seconds and
the time per session against the smaller size's (1.0: linear). ``--json``: the last line is
one JSON object with every figure.
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
from goodtrace.renderers.json_report import render_json

builders = load_file("builders", "tests/helpers/builders.py")
NOW = 2 * 10**18


def write(root: Path, sessions: int) -> None:
    t, k = 0.0, 0
    for restart in range(sessions):
        p = builders.Proc(root, start=t, restart=restart)
        t += 1.0
        for _ in range(5):
            p.step(k, t, t + 0.1).sync(k, t + 0.1)
            t, k = t + 0.1, k + 1
        k -= 2  # the crash lost two steps: re-done by the next attempt
        p.heartbeat(t)
        p.write()
        t += 0.5


def timed_analysis(root: Path, release: bool) -> tuple[float, float, str]:
    start = time.perf_counter()
    loaded = builders.load(root)
    loaded_s = time.perf_counter() - start
    start = time.perf_counter()
    result = analyze(loaded, now_wall_ns=NOW, release_records=release)
    return loaded_s, time.perf_counter() - start, render_json(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 and 1,000 sessions (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    parser.add_argument("--sessions", type=int, nargs="+", help="the sizes (sessions)")
    args = parser.parse_args()
    sizes = args.sessions or ([100, 1_000] if args.quick else [300, 3_000])
    work = Path(tempfile.mkdtemp(prefix="goodtrace-many-sessions-"))
    rows: list[dict[str, Any]] = []
    try:
        for sessions in sizes:
            root = work / str(sessions)
            write(root, sessions)
            load_s, kept_s, kept = timed_analysis(root, False)
            _, released_s, released = timed_analysis(root, True)
            if kept != released:
                raise SystemExit("the reports with the records kept and released differ")
            row: dict[str, Any] = {"sessions": sessions, "load_s": round(load_s, 3), "analyze_kept_s": round(kept_s, 3),
                                   "analyze_released_s": round(released_s, 3),
                                   "kept_over_released": round(kept_s / released_s, 2)}
            first = rows[0] if rows else row
            for key in ("load_s", "analyze_kept_s", "analyze_released_s"):
                row[f"{key[:-2]}_per_session_vs_smallest"] = round(row[key] / sessions / (first[key] / first["sessions"]), 2)
            rows.append(row)
            print(f"{sessions:,} sessions: load {row['load_s']} s, analyze {row['analyze_kept_s']} s with the records "
                  f"kept, {row['analyze_released_s']} s released ({row['kept_over_released']}x); time per session "
                  f"against the smallest size's: load {row['load_per_session_vs_smallest']}x, analyze kept "
                  f"{row['analyze_kept_per_session_vs_smallest']}x, released "
                  f"{row['analyze_released_per_session_vs_smallest']}x (1.0: linear); identical JSON", flush=True)
            shutil.rmtree(root, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps({"benchmark": "many_sessions", "rows": rows}))


if __name__ == "__main__":
    main()
