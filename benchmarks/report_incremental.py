"""Benchmark: re-reporting a growing run with the segment cache, against a cold report.

Writes a run of 2 ranks (``--ranks``) with 100,000 and 1,000,000 steps each (``--quick``:
10,000 and 100,000, in 4 MiB segments) in segments of 64 MiB (the writer's default;
``--segment-mib``), the
last one of each rank still open, the step content of ``report_steps.py`` (three spans, the
step, its sync point, a loss metric; a tag every 100 steps, a checkpoint every 1,000,
heartbeats each second). Then, each in a fresh process (the reader, then the analysis and
the JSON report without the step table, as ``report --json --no-steps``, timed apart):

  cold: the run read with the cache off (``GOODTRACE_SEGMENT_CACHE=0``), the baseline;
  fill: the first report with the cache on (every closed segment parsed and kept);
  then 1% more steps are appended (``--grow``), as the job goes on, and
  warm: the report with the cache on (the segments closed before come from the cache;
       the open ones and the new ones are parsed);
  cold again: the grown run with the cache off, in the same run of this script.

Each report process first makes the allocator setting ``goodtrace report`` makes
(``cli.analysed.return_freed_memory``: large blocks handed back at once, which bounds the
memory and costs fresh pages) and its collector setting (``collect_less_often``), so that the
times are the command's.
goodtrace's modules are compiled to bytecode first, as ``pip install`` does, so that no report
compiles their source (where ``PYTHONDONTWRITEBYTECODE`` is set, about 0.25 s a process).
The JSON reports of warm and cold-again must be identical (the script fails otherwise).
It prints per size the times and the ratios warm / cold-again for the whole report and for
each part; ``--json``: the last line is one JSON object with every figure.
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

from _timing import compile_package
from goodtrace.record.io.encoding import _Encoder
from report_scale import SECOND, WALL0, header
from report_steps import INIT, step_lines

NOW = WALL0 + 10**6 * SECOND  # "now" for the analysis: fixed, so that two reports compare

# fold (load_run) and analysis + JSON report, timed apart in one fresh process
REPORT = """
import json, sys, time
t0 = time.perf_counter()
from goodtrace.cli import analysed  # the allocator setting goodtrace report makes (its memory, and its time)
(getattr(analysed, "return_freed_memory", None) or analysed._return_freed_memory)()  # (private before 2026-11-28)
getattr(analysed, "collect_less_often", lambda: None)()  # the command's collector setting (since 2026-11-28)
from goodtrace.analysis import analyze
from goodtrace.read.engine import Engine
from goodtrace.read.load import load_run
from goodtrace.renderers.json_report import render_json
t1 = time.perf_counter()
loaded = load_run(sys.argv[1], engine=Engine(workers=1))
t2 = time.perf_counter()
text = render_json(analyze(loaded, now_wall_ns=int(sys.argv[2]), release_records=True, keep_cuts=False), include_steps=False)
t3 = time.perf_counter()
with open(sys.argv[3], "w") as handle:
    handle.write(text)
print(json.dumps({"import_s": t1 - t0, "fold_s": t2 - t1, "analysis_s": t3 - t2, "read_mb": loaded.read_bytes / 1e6}))
"""


class RankWriter:
    """One rank's session, written in segments of ``segment_bytes`` (a new segment, header
    first, once the open one is over the size, as the writer rotates), step after step."""

    def __init__(self, root: Path, rank: int, world: int, segment_bytes: int) -> None:
        self.enc = _Encoder()
        self.rank, self.world, self.segment_bytes = rank, world, segment_bytes
        self.mono0 = 5_000 * SECOND + rank * 7_919
        self.session = f"{WALL0:020d}-{20_000 + rank}-{rank:08x}"
        self.dir = root / f"rank-{rank:05d}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment = -1
        self.size = 0
        self.t = self.mono0 + 3 * SECOND
        self.next_heartbeat = self.mono0 + SECOND
        self.step_ns = SECOND // 2 + rank * 1_000_000
        self.k = 0
        self._rotate([self.enc.encode((INIT, self.mono0 + SECOND // 2, self.t, None, 1, None, None))])

    def _rotate(self, first: list[str]) -> None:
        self.segment += 1
        head = dict(header(self.rank, self.world, self.session, self.mono0, self.mono0), segment=self.segment)
        text = json.dumps(head, separators=(",", ":")) + "\n" + "".join(first)
        with open(self.dir / f"{self.session}.{self.segment:05d}.jsonl", "w", encoding="utf-8") as handle:
            handle.write(text)
        self.size = len(text)

    def _append(self, lines: list[str]) -> None:
        text = "".join(lines)
        with open(self.dir / f"{self.session}.{self.segment:05d}.jsonl", "a", encoding="utf-8") as handle:
            handle.write(text)
        self.size += len(text)

    def steps(self, count: int) -> None:
        lines: list[str] = []
        for k in range(self.k, self.k + count):
            self.t, self.next_heartbeat = step_lines(self.enc.encode, k, self.t, self.step_ns, self.mono0,
                                                     self.next_heartbeat, lines)
            if len(lines) > 20_000:  # a flush: appended, then rotated once over the size
                self._append(lines)
                lines = []
                if self.size >= self.segment_bytes:
                    self._rotate([])
        self._append(lines)
        self.k += count


def report(root: Path, cache: bool, out: Path) -> dict[str, float]:
    env = dict(os.environ, GOODTRACE_SEGMENT_CACHE="1" if cache else "0", GOODTRACE_PROGRESS="0")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", REPORT, str(root), str(NOW), str(out)], env=env,
                          capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"the report failed: {done.stderr}")
    parts: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return {"total_s": round(wall, 2), **{k: round(v, 3 if k == "read_mb" else 2) for k, v in parts.items()}}


def measure(root: Path, steps: int, ranks: int, grow: float, segment_bytes: int) -> dict[str, Any]:
    writers = [RankWriter(root, r, ranks, segment_bytes) for r in range(ranks)]
    t0 = time.perf_counter()
    for writer in writers:
        writer.steps(steps)
    row: dict[str, Any] = {"steps": steps, "ranks": ranks, "generate_s": round(time.perf_counter() - t0, 2),
                           "segments": sum(w.segment + 1 for w in writers)}
    out = root.parent / "out"
    out.mkdir(exist_ok=True)
    row["cold"] = report(root, False, out / "cold.json")
    row["fill"] = report(root, True, out / "fill.json")
    before = sum(p.stat().st_size for p in root.rglob("*.jsonl"))
    more = max(1, int(steps * grow))
    for writer in writers:
        writer.steps(more)
    after = sum(p.stat().st_size for p in root.rglob("*.jsonl"))
    row.update(more_steps=more, jsonl_mb=round(after / 1e6, 1), new_mb=round((after - before) / 1e6, 1),
               segments_after=sum(w.segment + 1 for w in writers))
    row["warm"] = report(root, True, out / "warm.json")
    row["cold_again"] = report(root, False, out / "cold_again.json")
    row["identical"] = (out / "warm.json").read_bytes() == (out / "cold_again.json").read_bytes()
    if not row["identical"]:
        raise SystemExit("the warm report differs from the cold one")
    cache = root / "compact" / "cache"
    row["cache_mb"] = round(sum(p.stat().st_size for p in cache.iterdir()) / 1e6, 1) if cache.is_dir() else 0.0
    for part in ("total_s", "fold_s", "analysis_s"):
        row[f"warm_over_cold_{part[:-2]}"] = round(row["warm"][part] / row["cold_again"][part], 3)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10k and 100k steps (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, nargs="+", help="the sizes (steps per rank)")
    parser.add_argument("--grow", type=float, default=0.01, help="steps appended, as a share of the run (0.01)")
    parser.add_argument("--segment-mib", type=float,
                        help="segment size in MiB (default: the writer's 64; --quick: 4, so that segments close)")
    args = parser.parse_args()
    sizes = args.steps or ([10_000, 100_000] if args.quick else [100_000, 1_000_000])
    compile_package()  # no report below compiles goodtrace's source: a user's install has its bytecode
    rows = []
    for steps in sizes:
        base = Path(tempfile.mkdtemp(prefix="goodtrace-incr-"))
        try:
            segment_mib = args.segment_mib or (4.0 if args.quick else 64.0)
            row = measure(base / "run", steps, args.ranks, args.grow, int(segment_mib * 2**20))
        finally:
            shutil.rmtree(base, ignore_errors=True)
        rows.append(row)
        print(f"{steps:>9,} steps x {args.ranks} ranks ({row['jsonl_mb']} MB, {row['segments_after']} segments), "
              f"+{row['more_steps']:,} steps ({row['new_mb']} MB): cold {row['cold_again']['total_s']} s "
              f"(fold {row['cold_again']['fold_s']}, analysis {row['cold_again']['analysis_s']}); "
              f"first report with the cache {row['fill']['total_s']} s; warm {row['warm']['total_s']} s "
              f"(fold {row['warm']['fold_s']}, analysis {row['warm']['analysis_s']}; JSON lines read "
              f"{row['warm']['read_mb']} MB) = "
              f"{row['warm_over_cold_total']}x the cold report (fold {row['warm_over_cold_fold']}x, analysis "
              f"{row['warm_over_cold_analysis']}x); cache {row['cache_mb']} MB; identical JSON: {row['identical']}",
              flush=True)
    if args.json:
        print(json.dumps({"benchmark": "report_incremental", "rows": rows}))


if __name__ == "__main__":
    main()
