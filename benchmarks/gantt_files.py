"""Benchmark: a view of a few steps of a long session (the HTML report's gantt chart, a trace
slice), the files it reads.

The gantt chart draws every rank's spans in a range of about 20 steps, and ``goodtrace trace
--steps A:B`` writes a slice's spans, tags, events and metrics, both read again from the rank
files (``raw.session_records``). They read every file of each session; they now read only the
files that can hold what they draw (``LoadedRun.file_ranges``: each file's earliest and latest
record time and its marks' lowest and highest step; always a session's last file). Writes one
rank of each of ``--steps`` steps (``report_incremental.py``'s writer: three spans a step, its
sync point, a loss metric, a tag every 100 steps, a checkpoint every 1,000; ``--segment-mib``
MiB segments), loads and analyses it once, then times in this process, alternated ``--repeat``
times (the medians), the records of 20 steps in the middle of the session read

  gantt: the spans, as the gantt reads them now (the files around the range);
  trace: the spans and marks, as the trace reads them now (with the steps its intervals close on);
  ... and each again from every file of the session (no file ranges: as they read before).

Each pair must give the same records (the script fails otherwise). It prints per size the files
and seconds of each and their ratio; a read now should not grow with the session (the same few
files), a read of every file grows with it. ``--json``: the last line is one JSON object with
every figure. ``--quick``: 20,000 and 200,000 steps in 4 MiB segments (under a minute).
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
from goodtrace.analysis.intervals import slice_clock_range, slice_steps
from goodtrace.read import raw
from goodtrace.read.engine import Engine
from goodtrace.read.load import load_run
from report_incremental import NOW, RankWriter

WINDOW = 20


def _read(run: Any, window: tuple[int, int], steps: tuple[int, int] | None, drawn: tuple[int, int] | None
          ) -> tuple[float, list[Any]]:
    start = time.perf_counter()
    records = [r for _, chunk in raw.session_record_chunks(
        run, {0: window}, steps=steps, spans_only=steps is None, drawn_steps={0: drawn} if drawn else None)
        for r in chunk]
    return time.perf_counter() - start, records


def measure(work: Path, steps: int, segment_bytes: int, repeat: int) -> dict[str, Any]:
    root = work / f"run-{steps}"
    RankWriter(root, 0, 1, segment_bytes).steps(steps)
    run = load_run(root, engine=Engine(workers=1))
    analysis = analyze(run, now_wall_ns=NOW)
    middle = steps // 2
    selected = (middle, middle + WINDOW - 1)
    window = slice_clock_range(analysis, 0, selected)
    drawn = slice_steps(analysis, 0, selected)
    assert window is not None
    ranges = dict(run.file_ranges)
    row: dict[str, Any] = {"steps": steps, "files": len(run.files[0])}
    for view, view_steps in (("gantt", None), ("trace", selected)):
        row[f"{view}_files_read"] = len(raw._files_for(run, 0, window, view_steps or selected, drawn, view == "gantt"))
        seconds: dict[str, list[float]] = {"now": [], "every": []}
        found: dict[str, list[Any]] = {}
        for _ in range(repeat):
            for name in ("now", "every"):
                run.file_ranges = ranges if name == "now" else {}
                taken, found[name] = _read(run, window, view_steps, drawn)
                seconds[name].append(taken)
        run.file_ranges = ranges
        if found["now"] != found["every"]:
            raise SystemExit(f"at {steps} steps the {view}'s two reads differ ({len(found['now'])} and "
                             f"{len(found['every'])} records)")
        now_s, every_s = statistics.median(seconds["now"]), statistics.median(seconds["every"])
        row.update({f"{view}_records": len(found["now"]), f"{view}_s": round(now_s, 3),
                    f"{view}_every_s": round(every_s, 3), f"{view}_over_every": round(now_s / every_s, 3)})
    run.close()
    shutil.rmtree(root, ignore_errors=True)
    return row


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
        for view in ("gantt", "trace"):
            print(f"{row['steps']:>10,} steps ({row['files']} files), {view}: the {WINDOW} steps' "
                  f"{row[f'{view}_records']:,} records from {row[f'{view}_files_read']} files {row[f'{view}_s']} s, "
                  f"from every file {row[f'{view}_every_s']} s: {row[f'{view}_over_every']}x")
    if args.json:
        print(json.dumps({"benchmark": "gantt_files", "python": sys.version.split()[0], "window_steps": WINDOW,
                          "segment_bytes": segment_bytes, "sizes": rows}))


if __name__ == "__main__":
    main()
