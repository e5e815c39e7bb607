"""Benchmark: ``goodtrace watch`` on many ranks, on a local disk and on an emulated network
filesystem: how long its first frame takes, how long until every rank's slowdown alarm has its
step times, and what a look costs once the run is read, against the number of ranks.

Writes runs of each of ``--ranks`` ranks x ``--steps`` steps (``report_incremental.py``'s
writer: three spans a step, its sync point, a loss metric, heartbeats; 64 MiB segments, or
``--segment-bytes``), then times, each in a fresh process:

- **whole** (the baseline): every record of the run read into the view's state in one poll, as
  the view's first look did before it read tails;
- **first frame**: ``View(run)`` and its first look: every header, the lowest rank whole, each
  other rank's present (its last 64 step completions) and the first part of the ranks' step
  histories (64 MiB);
- **all read**: looks until nothing is left to read (every rank's last 2,000 step times: the
  slowdown alarm armed; what ``--once`` waits for);
- **next look**: one more line written by every rank, then one look (what each redraw costs).

With ``--nfs-rtt-ms`` (default 1 ms; 0: not) the same on the emulated NFS of the storage tests
(``tests/helpers/storage_servers.py``: a FUSE passthrough adding a round trip to every call,
8 served at once). It prints each figure against the baseline and each one's growth from the
fewest ranks to the most (a cost linear in the ranks grows as they do). ``--json``: the last
line is one JSON object with every figure. ``--quick``: 20 and 200 ranks x 2,100 steps, local
only (under a minute).
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
from report_scale import timed

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

WHOLE = """
import sys, time
from goodtrace.analysis.watching import WatchState
from goodtrace.read.follow import RunFollower
t = time.perf_counter()
follower, state = RunFollower(sys.argv[1], poll_bytes=2**62), WatchState()
for _, header, record in follower.poll():
    state.add(header, record)
print(time.perf_counter() - t, follower.bytes_read)
"""

LOOKS = """
import sys, time
from pathlib import Path
from goodtrace.cli.commands.watch import View
t0 = time.perf_counter()
view = View(sys.argv[1])
view.look()
t1 = time.perf_counter()
while view.follower.pending:
    view.look()
t2 = time.perf_counter()
for rank_dir in sorted(Path(sys.argv[2]).glob("rank-*")):  # every rank writes one more line
    with open(sorted(rank_dir.glob("*.jsonl"))[-1], "ab") as handle:
        handle.write(b'{"kind":"heartbeat","mono":1,"wall":1,"dropped":0}\\n')
t3 = time.perf_counter()
view.look()
t4 = time.perf_counter()
assert not view.state.history and all(r.last_step is not None for r in view.state.ranks())
print(t1 - t0, t2 - t0, t4 - t3, view.follower.bytes_read)
"""


def measure(read_at: Path, write_at: Path) -> dict[str, Any]:
    row: dict[str, Any] = {}
    _, peak, out = timed([sys.executable, "-c", WHOLE, str(read_at)])
    whole_s, whole_read = out.split()
    row["whole_s"], row["whole_peak_mib"], row["whole_read_mb"] = round(float(whole_s), 2), round(peak), round(
        int(whole_read) / 1e6, 1)
    _, peak, out = timed([sys.executable, "-c", LOOKS, str(read_at), str(write_at)])
    first, everything, nxt, read = out.split()
    row.update(first_frame_s=round(float(first), 2), all_read_s=round(float(everything), 2),
               next_look_s=round(float(nxt), 3), looks_peak_mib=round(peak), looks_read_mb=round(int(read) / 1e6, 1))
    row["first_frame_over_whole"] = round(row["first_frame_s"] / row["whole_s"], 3)
    row["all_read_over_whole"] = round(row["all_read_s"] / row["whole_s"], 3)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[100, 1000], help="ranks of each run (100 and 1,000)")
    parser.add_argument("--steps", type=int, default=2_100, help="steps per rank (default 2,100)")
    parser.add_argument("--segment-bytes", type=int, default=64 * 2**20, help="segment size (default 64 MiB)")
    parser.add_argument("--nfs-rtt-ms", type=float, default=1.0, help="emulated NFS round trip (0: local only)")
    parser.add_argument("--quick", action="store_true", help="20 and 200 ranks, local only")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    args = parser.parse_args()
    sizes, rtt = ([20, 200], 0.0) if args.quick else (sorted(args.ranks), args.nfs_rtt_ms)
    rows: list[dict[str, Any]] = []
    for ranks in sizes:
        for where in ("local", "nfs") if rtt > 0 else ("local",):
            work = Path(tempfile.mkdtemp(prefix="goodtrace-watch-ranks-"))
            try:
                if where == "nfs":
                    from helpers.storage_servers import EmulatedNFS

                    with EmulatedNFS(str(work), rtt_ms=rtt) as nfs:
                        root = Path(nfs.serve_dir) / "run"
                        for rank in range(ranks):
                            RankWriter(root, rank, ranks, args.segment_bytes).steps(args.steps)
                        row = measure(Path(nfs.mountpoint) / "run", root)
                else:
                    root = work / "run"
                    for rank in range(ranks):
                        RankWriter(root, rank, ranks, args.segment_bytes).steps(args.steps)
                    row = measure(root, root)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            rows.append({"where": where, "ranks": ranks, "steps": args.steps, **row})
            print(f"{where}: {ranks} ranks x {args.steps:,} steps: whole {row['whole_s']} s ({row['whole_read_mb']} MB); "
                  f"first frame {row['first_frame_s']} s ({row['first_frame_over_whole']}x); all read "
                  f"{row['all_read_s']} s ({row['all_read_over_whole']}x); next look {row['next_look_s']} s; peak "
                  f"{row['looks_peak_mib']} MiB", flush=True)
    growth = {}
    for where in ("local", "nfs"):
        mine = [r for r in rows if r["where"] == where]
        if len(mine) > 1:
            growth[where] = {f"{name}_growth": round(mine[-1][f"{name}_s"] / mine[0][f"{name}_s"], 2)
                             for name in ("whole", "first_frame", "all_read", "next_look")}
            print(f"{where}, from {sizes[0]:,} to {sizes[-1]:,} ranks (x{sizes[-1] / sizes[0]:g}): " + ", ".join(
                f"{k.removesuffix('_growth').replace('_', ' ')} x{v}" for k, v in growth[where].items()))
    if args.json:
        print(json.dumps({"benchmark": "watch_many_ranks", "python": sys.version.split()[0], "runs": rows,
                          "growth": growth}))


if __name__ == "__main__":
    main()
