"""How much a SIGKILL loses: a process records at a fixed rate (a step and 19 spans per step,
optionally with a 1-byte write per step, the system call that once starved the writer) and is
killed at a random moment; the loss is the time between the kill and the newest record on disk.

The promise (DESIGN: crash-safe persistence) is at most one flush interval, plus the time to
write one chunk. Each rate is killed ``--kills`` times at random moments between 1 and 3 s
after start; the table gives the median and worst loss, as a ratio to the flush interval (the
baseline the promise is stated in), and how many kills lost more than one interval.

Usage: python benchmarks/kill_loss.py [--quick] [--json] [--kills K] [--flush-interval S] [--rows 2500s,500000]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from typing import Any

CHILD = textwrap.dedent(
    """
    import os, sys, time
    import goodtrace as gt
    run_dir, rate, syscall, flush = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1", float(sys.argv[4])
    rec = gt.init(run_dir, flush_interval_s=flush)
    fd = os.open(os.devnull, os.O_WRONLY)
    clock = time.perf_counter_ns
    span = gt.span
    start = clock()
    print("started", flush=True)
    next_report = start
    n = step = 0
    while True:
        with gt.step(step):
            for _ in range(19):
                with span("fwd"):
                    pass
        n += 20
        step += 1
        if syscall:
            os.write(fd, b"x")
        now = clock()
        if now >= next_report:
            next_report = now + 100_000_000
            print(n, (now - start) / 1e9, len(rec.buffer), flush=True)
        target = start + n * 1e9 / rate
        if target - now > 1_000_000:
            time.sleep((target - now) / 1e9)
        else:
            while clock() < target:
                pass
    """
)

RATES = [(2_500, True), (140_000, False), (140_000, True), (500_000, False), (500_000, True)]


def newest_record_ns(run_dir: str) -> int:
    paths = sorted(glob.glob(f"{run_dir}/rank-*/*.jsonl"))
    if not paths:
        return 0
    with open(paths[-1], "rb") as handle:
        handle.seek(0, os.SEEK_END)
        handle.seek(max(0, handle.tell() - (4 << 20)))
        tail = handle.read()
    newest = 0
    for line in tail.split(b"\n")[1:-1]:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record.get("t1"), int):
            newest = max(newest, record["t1"])
    return newest


def kill_once(rate: int, syscall: bool, flush: float, hold: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "run")
        child = subprocess.Popen([sys.executable, "-c", CHILD, run_dir, str(rate), "1" if syscall else "0",
                                  str(flush)], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        t_start = time.perf_counter_ns()
        child.stdout.readline()
        reports: list[str] = []
        reader = threading.Thread(target=reports.extend, args=(child.stdout,), daemon=True)
        reader.start()
        time.sleep(hold)
        t_kill = time.perf_counter_ns()
        child.send_signal(signal.SIGKILL)
        child.wait()
        reader.join(timeout=30)
        child.stdout.close()
        newest = newest_record_ns(run_dir) or t_start
        whole = [line.split() for line in reports if line.endswith("\n") and len(line.split()) == 3]
        last = whole[-1] if whole else ["0", "1", "0"]  # the kill may cut the last line
        return {
            "lost_s": (t_kill - newest) / 1e9,
            "rate": int(last[0]) / max(float(last[1]), 1e-9),
            "peak_buffer": max((int(fields[2]) for fields in whole), default=0),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 kills per rate (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    parser.add_argument("--kills", type=int, default=None, help="kills per rate (default 20)")
    parser.add_argument("--flush-interval", type=float, default=1.0)
    parser.add_argument("--rows", default=None, help="e.g. 2500s,500000 (rate, 's': a system call per step)")
    args = parser.parse_args()
    rates = RATES
    if args.rows:
        rates = [(int(x.rstrip("s")), x.endswith("s")) for x in args.rows.split(",")]
    kills = args.kills or (2 if args.quick else 20)
    rng = random.Random(12)
    rows = []
    for rate, syscall in rates:
        results = [kill_once(rate, syscall, args.flush_interval, rng.uniform(1.0, 3.0)) for _ in range(kills)]
        losses = sorted(r["lost_s"] for r in results)
        row = {
            "rate": rate, "syscall_per_step": syscall, "kills": kills,
            "achieved_rate": round(min(r["rate"] for r in results)),
            "median_lost_s": losses[len(losses) // 2], "max_lost_s": losses[-1],
            "over_one_interval": sum(1 for x in losses if x > args.flush_interval),
            "peak_buffer_records": max(r["peak_buffer"] for r in results),
        }
        rows.append(row)
        print(f"{rate:>7}/s syscall={syscall!s:5}: median {row['median_lost_s']:.3f} s, max {row['max_lost_s']:.3f} s, "
              f"{row['over_one_interval']}/{kills} over one interval", file=sys.stderr, flush=True)
    interval = args.flush_interval
    print(f"flush interval {interval} s; loss = kill time - newest record on disk; {kills} kills per row")
    print("| records/s (achieved) | syscall/step | median lost | worst lost | worst / interval | kills over one interval |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['rate']:,} ({r['achieved_rate']:,}) | {'yes' if r['syscall_per_step'] else 'no'} | "
              f"{r['median_lost_s']:.3f} s | {r['max_lost_s']:.3f} s | {r['max_lost_s'] / interval:.2f}x | "
              f"{r['over_one_interval']}/{r['kills']} |")
    if args.json:
        print(json.dumps({"flush_interval_s": interval, "rows": rows}))


if __name__ == "__main__":
    main()
