"""Benchmark: ``goodtrace watch`` on a long run: how long its first frame takes, against the run's
length.

``watch`` shows the goodput so far of the lowest rank's attempt (which needs that process's
records from its start) and, of every rank, its last step, its age, a hang and its recent step
times (which need only its tail). It opens a run at the cost of one process's history, read a
part at a time between frames, and every rank's tail. Writes runs of ``--ranks`` ranks x each
of ``--steps`` steps (``report_incremental.py``'s writer: three spans a step, its sync point, a
loss metric, a tag every 100 steps, a checkpoint every 1,000, heartbeats, 64 MiB segments), then
times, each in a fresh process with its peak RSS:

- **whole** (the baseline): every record of the run read into the view's state, in file order,
  as the view's first look did before it read tails (the same follower and state, no plan);
- **first frame**: the live view's first look (``View(run).look()``): the tails, and the first
  ``POLL_BYTES`` of the lowest rank's history;
- **--once**: ``goodtrace watch RUN --once``: the tails and the lowest rank's whole history.

It prints each against the baseline, and each one's growth from the shortest run to the longest
(a first frame that does not grow with the run: about 1x). ``--json``: the last line is one JSON
object with every figure. ``--quick``: 4 ranks x 5,000 and 50,000 steps (under a minute).
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

WHOLE = """
import sys
from goodtrace.analysis.watching import WatchState
from goodtrace.read.follow import RunFollower
follower, state = RunFollower(sys.argv[1], poll_bytes=2**62), WatchState()
for _, header, record in follower.poll():
    state.add(header, record)
print(follower.bytes_read)
"""

FIRST_FRAME = """
import sys, time
from rich.console import Console
from goodtrace.cli.commands.watch import View
from goodtrace.renderers.watch import render_watch
view = View(sys.argv[1])
view.look()
Console(file=open("/dev/null", "w")).print(render_watch(view.state, time.time_ns(), sys.argv[1]))
print(view.follower.bytes_read)
"""


def measure(root: Path) -> dict[str, Any]:
    run_bytes = sum(f.stat().st_size for f in root.glob("rank-*/*.jsonl"))
    row: dict[str, Any] = {"run_mb": round(run_bytes / 1e6, 1)}
    for name, cmd in (("whole", [sys.executable, "-c", WHOLE, str(root)]),
                      ("first_frame", [sys.executable, "-c", FIRST_FRAME, str(root)]),
                      ("once", goodtrace_cmd("watch", str(root), "--once"))):
        seconds, peak, out = timed(cmd)
        row[f"{name}_s"], row[f"{name}_peak_mib"] = round(seconds, 2), round(peak)
        if name != "once":
            row[f"{name}_read_mb"] = round(int(out.split()[-1]) / 1e6, 1)
    row["first_frame_over_whole"] = round(row["first_frame_s"] / row["whole_s"], 3)
    row["once_over_whole"] = round(row["once_s"] / row["whole_s"], 3)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8, help="ranks (default 8)")
    parser.add_argument("--steps", type=int, nargs="+", default=[10_000, 100_000],
                        help="steps per rank of each run (default 10,000 and 100,000)")
    parser.add_argument("--quick", action="store_true", help="4 ranks x 5,000 and 50,000 steps")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    args = parser.parse_args()
    ranks, sizes = (4, [5_000, 50_000]) if args.quick else (args.ranks, sorted(args.steps))
    rows = []
    for steps in sizes:
        work = Path(tempfile.mkdtemp(prefix="goodtrace-watch-"))
        try:
            root = work / "run"
            for rank in range(ranks):
                RankWriter(root, rank, ranks, 64 * 2**20).steps(steps)
            rows.append({"ranks": ranks, "steps": steps, **measure(root)})
        finally:
            shutil.rmtree(work, ignore_errors=True)
        row = rows[-1]
        print(f"{ranks} ranks x {steps:,} steps ({row['run_mb']} MB): whole {row['whole_s']} s "
              f"({row['whole_read_mb']} MB read, peak {row['whole_peak_mib']} MiB); first frame {row['first_frame_s']} s "
              f"({row['first_frame_over_whole']}x, {row['first_frame_read_mb']} MB read, peak "
              f"{row['first_frame_peak_mib']} MiB); --once {row['once_s']} s ({row['once_over_whole']}x, peak "
              f"{row['once_peak_mib']} MiB)")
    growth = {f"{name}_growth": round(rows[-1][f"{name}_s"] / rows[0][f"{name}_s"], 2)
              for name in ("whole", "first_frame", "once")}
    print(f"from {sizes[0]:,} to {sizes[-1]:,} steps: whole x{growth['whole_growth']}, first frame "
          f"x{growth['first_frame_growth']}, --once x{growth['once_growth']}")
    if args.json:
        print(json.dumps({"benchmark": "watch_first_look", "python": sys.version.split()[0], "runs": rows, **growth}))


if __name__ == "__main__":
    main()
