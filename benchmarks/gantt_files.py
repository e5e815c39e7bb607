"""Benchmark: the HTML report's gantt chart of a few steps of a long session, the files it reads.

The gantt chart draws every rank's spans in a range of about 20 steps, read again from the rank
files (``raw.session_records(..., spans_only=True)``). It read every file of each session; it
now reads only the files whose records' times reach the range (each file's earliest and latest
record time, ``LoadedRun.file_times``, and always a session's last file). Writes one rank of
each of ``--steps`` steps (``report_incremental.py``'s writer: three spans a step, its sync
point, a loss metric, a tag every 100 steps, a checkpoint every 1,000; ``--segment-mib`` MiB
segments), loads and analyses it once, then times in this process, alternated ``--repeat``
times (the medians), the spans of 20 steps in the middle of the session read

  files: as the gantt reads them now (the files around the range);
  every: every file of the session (no file times: as the gantt read them before).

Both must give the same spans (the script fails otherwise). It prints per size the files and
seconds of each and their ratio; the time of ``files`` should not grow with the session (the
same few files), that of ``every`` grows with it. ``--json``: the last line is one JSON object
with every figure. ``--quick``: 20,000 and 200,000 steps in 4 MiB segments (under a minute).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from goodtrace.analysis import analyze
from goodtrace.analysis.intervals import session_intervals
from goodtrace.read import raw
from goodtrace.read.engine import Engine
from goodtrace.read.load import load_run
from report_incremental import NOW, RankWriter

WINDOW = 20


def _spans(run: Any, window: tuple[int, int]) -> tuple[float, int]:
    start = time.perf_counter()
    count = sum(len(records) for _, records in raw.session_records(run, {0: window}, spans_only=True))
    return time.perf_counter() - start, count


def measure(work: Path, steps: int, segment_bytes: int, repeat: int) -> dict[str, Any]:
    root = work / f"run-{steps}"
    RankWriter(root, 0, 1, segment_bytes).steps(steps)
    run = load_run(root, engine=Engine(workers=1))
    analysis = analyze(run, now_wall_ns=NOW)
    middle = steps // 2
    intervals = session_intervals(analysis, 0, (middle, middle + WINDOW - 1))
    window = (intervals[0].start, intervals[-1].end)
    times = dict(run.file_times)
    files = len(run.files[0])
    read = len(raw._files_for(run, 0, window, True))
    seconds: dict[str, list[float]] = {"files": [], "every": []}
    counts: dict[str, int] = {}
    for _ in range(repeat):
        for name in ("files", "every"):
            run.file_times = times if name == "files" else {}
            taken, counts[name] = _spans(run, window)
            seconds[name].append(taken)
    if counts["files"] != counts["every"]:
        raise SystemExit(f"at {steps} steps the two reads found {counts['files']} and {counts['every']} spans")
    run.close()
    shutil.rmtree(root, ignore_errors=True)
    files_s, every_s = statistics.median(seconds["files"]), statistics.median(seconds["every"])
    return {"steps": steps, "files": files, "files_read": read, "spans": counts["files"],
            "files_s": round(files_s, 3), "every_s": round(every_s, 3), "files_over_every": round(files_s / every_s, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=None, help="session lengths (default 100000 1000000)")
    parser.add_argument("--segment-mib", type=float, default=None, help="segment size (default 64; --quick 4)")
    parser.add_argument("--repeat", type=int, default=3, help="alternated runs of each variant (medians)")
    parser.add_argument("--quick", action="store_true", help="20,000 and 200,000 steps, 4 MiB segments")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    args = parser.parse_args()
    sizes = args.steps or ([20_000, 200_000] if args.quick else [100_000, 1_000_000])
    segment_bytes = int((args.segment_mib or (4 if args.quick else 64)) * 2**20)
    work = Path(tempfile.mkdtemp(prefix="goodtrace-gantt-files-"))
    try:
        rows = [measure(work, steps, segment_bytes, args.repeat) for steps in sizes]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for row in rows:
        print(f"{row['steps']:>10,} steps ({row['files']} files): the {WINDOW} steps' {row['spans']:,} spans from "
              f"{row['files_read']} files {row['files_s']} s, from every file {row['every_s']} s: "
              f"{row['files_over_every']}x")
    if args.json:
        print(json.dumps({"benchmark": "gantt_files", "python": sys.version.split()[0], "window_steps": WINDOW,
                          "segment_bytes": segment_bytes, "sizes": rows}))


if __name__ == "__main__":
    main()
