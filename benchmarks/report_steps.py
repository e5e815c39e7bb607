"""Benchmark: does ``goodtrace report`` stay linear in the number of steps?

Writes runs of a few ranks (default 2) with 10,000, 100,000 and 1,000,000 steps each (``--quick``:
10,000, 30,000 and 100,000) through the writer's encoder: per step a data, a forward_backward
and an optimizer span, the step record, its sync point (lag), a loss metric; a tag every 100
steps, a checkpoint every 1,000, one slow step in 500 (3x: anomalies to explain), heartbeats
each second. Then, each in a fresh process with its peak RSS:

  baseline: ``json.loads`` of every line of the run once (what any reader pays; linear);
  ``goodtrace report RUN --json --no-steps``;
  ``goodtrace report RUN`` (the console report);
  ``goodtrace report RUN --html FILE`` (the HTML report; also the page's size).

``--synchronous``: the sync point at each step's host exit, so that each step's data loading is a
badput piece of its interval (the loop shape whose timeline has a piece or two a step).

It prints, per size, time and memory per step and the ratios that say whether they stay flat:
each report's time over the baseline's (measured in the same run), and its time per step over
the smallest size's. ``--json``: the last line is one JSON object with every figure.
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

from goodtrace import schema
from goodtrace.record.io.encoding import _Encoder
from goodtrace.record.spans import Span
from report_scale import SECOND, WALL0, goodtrace_cmd, header, timed

BASELINE = """
import json, sys
from pathlib import Path
n = 0
for path in sorted(Path(sys.argv[1]).glob("rank-*/*.jsonl")):
    with open(path, "rb") as handle:
        for line in handle:
            json.loads(line)
            n += 1
print(n)
"""


def _key(name: str, category: str) -> tuple[str, str, bool, type[Span]]:
    return (name, category, category in schema.BLOCKING_CATEGORIES, Span)


# the records of a step: its three spans, the step, its sync point and a loss metric; a tag
# every 100 steps, a checkpoint every 1,000, one slow step in 500; heartbeats each second
DATA, FWD, OPT = _key("data", "data"), _key("forward_backward", "compute"), _key("optimizer", "compute")
CKPT, INIT = _key("checkpoint", "checkpoint_save"), _key("init", "init")


def step_lines(encode: Any, k: int, t: int, step_ns: int, mono0: int, next_heartbeat: int,
               lines: list[str], synchronous: bool = False) -> tuple[int, int]:
    """Step ``k`` (entered at ``t``) appended to ``lines``: returns the next step's entry and the
    next heartbeat's time. ``synchronous``: the sync point at the step's host exit, before the
    next step enters (a synchronous loop: its in-step data loading is badput, a piece of every
    interval), not at the next step's entry (an asynchronous one)."""
    length = step_ns * (3 if k % 500 == 250 else 1) + (k * 7_919) % 5_000_000
    lines.append(encode((DATA, t, t + length // 20, k, 1, None, None)))
    lines.append(encode((FWD, t + length // 20, t + length * 17 // 20, k, 1, None, None)))
    lines.append(encode((OPT, t + length * 17 // 20, t + length * 19 // 20, k, 1, None, None)))
    # numbered as the recorder numbers them (seq: the execution, one a step here)
    lines.append(encode((schema.STEP, k, t, t + length * 19 // 20, k)))
    lines.append(encode((schema.SYNC, k, t + (length * 19 // 20 if synchronous else length), schema.SYNC_LAG, k)))
    lines.append(encode((schema.METRIC, "loss", k, 2.0 / (1 + k * 1e-4), "mean", t + length)))
    if k % 100 == 0:
        lines.append(encode((schema.TAG, k, "eval_window", t)))
    t += length
    if k % 1000 == 999:
        lines.append(encode((CKPT, t + 1_000, t + 1_000 + 2 * SECOND, k, 1, None, None)))
        t += 1_000 + 2 * SECOND
    while next_heartbeat <= t:
        lines.append(f'{{"kind":"heartbeat","wall":{WALL0 + next_heartbeat - mono0},'
                     f'"mono":{next_heartbeat},"dropped":0}}\n')
        next_heartbeat += SECOND
    return t, next_heartbeat


def write_rank(root: Path, rank: int, world: int, steps: int, synchronous: bool = False) -> int:
    """One rank's file, written in chunks (memory stays small for a million steps)."""
    encode = _Encoder().encode
    mono0 = 5_000 * SECOND + rank * 7_919
    session = f"{WALL0:020d}-{20_000 + rank}-{rank:08x}"
    rank_dir = root / f"rank-{rank:05d}"
    rank_dir.mkdir(parents=True, exist_ok=True)
    records = 0
    with open(rank_dir / f"{session}.00000.jsonl", "w", encoding="utf-8") as handle:
        lines = [json.dumps(header(rank, world, session, mono0, mono0), separators=(",", ":")) + "\n"]
        t = mono0 + 3 * SECOND
        lines.append(encode((INIT, mono0 + SECOND // 2, t, None, 1, None, None)))
        records += 1
        next_heartbeat = mono0 + SECOND
        step_ns = SECOND // 2 + rank * 1_000_000
        for k in range(steps):
            before = len(lines)
            t, next_heartbeat = step_lines(encode, k, t, step_ns, mono0, next_heartbeat, lines, synchronous)
            records += len(lines) - before
            if len(lines) > 100_000:
                handle.write("".join(lines))
                lines.clear()
        lines.append(encode((schema.FINISH, True, t + SECOND // 5, "finish")))
        handle.write("".join(lines))
    return records + 1


def measure(root: Path, steps: int, ranks: int, synchronous: bool = False) -> dict[str, Any]:
    t0 = time.perf_counter()
    records = sum(write_rank(root, r, ranks, steps, synchronous) for r in range(ranks))
    row: dict[str, Any] = {"steps": steps, "ranks": ranks, "records": records,
                           "generate_s": round(time.perf_counter() - t0, 2),
                           "jsonl_mb": round(sum(p.stat().st_size for p in root.rglob("*.jsonl")) / 1e6, 1)}
    seconds, peak, _ = timed([sys.executable, "-c", BASELINE, str(root)])
    row.update(baseline_s=round(seconds, 2), baseline_peak_mib=round(peak))
    seconds, peak, out = timed(goodtrace_cmd("report", str(root), "--json", "--no-steps"))
    report = json.loads(out)
    row.update(json_s=round(seconds, 2), json_peak_mib=round(peak), goodput=report["goodput"],
               anomalies=len(report["anomalies"]), skipped=report.get("skipped_lines", {}))
    seconds, peak, _ = timed(goodtrace_cmd("report", str(root)))
    row.update(console_s=round(seconds, 2), console_peak_mib=round(peak))
    page = root / "report.html"
    seconds, peak, _ = timed(goodtrace_cmd("report", str(root), "--html", str(page)))
    row.update(html_s=round(seconds, 2), html_peak_mib=round(peak), html_page_mb=round(page.stat().st_size / 1e6, 2))
    for form in ("json", "console", "html"):
        row[f"{form}_over_baseline"] = round(row[f"{form}_s"] / row["baseline_s"], 2)
        row[f"{form}_us_per_step"] = round(row[f"{form}_s"] / (steps * ranks) * 1e6, 2)
        row[f"{form}_kib_per_step"] = round(row[f"{form}_peak_mib"] * 1024 / (steps * ranks), 3)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10k, 30k and 100k steps (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, nargs="+", help="the sizes (steps per rank)")
    parser.add_argument("--synchronous", action="store_true",
                        help="a synchronous loop: each step's data loading a badput piece of its interval")
    args = parser.parse_args()
    sizes = args.steps or ([10_000, 30_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000])
    rows = []
    for steps in sizes:
        root = Path(tempfile.mkdtemp(prefix="goodtrace-steps-"))
        try:
            row = measure(root, steps, args.ranks, args.synchronous)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        rows.append(row)
        print(f"{steps:>9,} steps x {args.ranks} ranks ({row['records']:,} records, {row['jsonl_mb']} MB): "
              f"baseline {row['baseline_s']} s; report --json {row['json_s']} s ({row['json_over_baseline']}x, "
              f"{row['json_us_per_step']} us/step, peak {row['json_peak_mib']} MiB); console {row['console_s']} s "
              f"({row['console_over_baseline']}x, peak {row['console_peak_mib']} MiB); --html {row['html_s']} s "
              f"(peak {row['html_peak_mib']} MiB, page {row['html_page_mb']} MB); {row['anomalies']} anomalies",
              flush=True)
    first = rows[0]
    for row in rows:
        for form in ("json", "console", "html"):
            row[f"{form}_per_step_vs_smallest"] = round(row[f"{form}_us_per_step"] / first[f"{form}_us_per_step"], 2)
    last = rows[-1]
    print(f"time per step at {last['steps']:,} steps vs {first['steps']:,}: report --json "
          f"{last['json_per_step_vs_smallest']}x, console {last['console_per_step_vs_smallest']}x, "
          f"--html {last['html_per_step_vs_smallest']}x "
          "(1.0 = linear)")
    if args.json:
        print(json.dumps({"ranks": args.ranks, "quick": args.quick, "synchronous": args.synchronous,
                          "cpus": os.cpu_count(), "sizes": rows}))


if __name__ == "__main__":
    main()
