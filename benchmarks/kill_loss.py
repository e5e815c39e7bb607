"""How much a SIGKILL loses: a process records at a fixed rate (a step and 19 spans per step),
with nothing else per step, one system call per step (a 1-byte write: the GIL convoy that
starved the Python writer) or one fsync per step, and is SIGKILLed at a random moment; the loss
is the time between the kill and the newest record on disk.

The promise: at most one flush interval plus 50 ms. Each row is killed ``--kills`` times (100
by default, 3 with ``--quick``) at random moments 0.6-1.6 s after start; the table gives the
median and worst loss, the worst as a ratio to the flush interval (the baseline the promise is
stated in) and how many kills lost more than the bound. ``--writer python`` runs the Python
writer threads instead of the native writer (GOODTRACE_NATIVE_WRITER=0), the baseline of the
same run.

Usage: python benchmarks/kill_loss.py [--quick] [--json] [--kills K] [--flush-interval S]
       [--rows 2500f,2500s,140000,500000s] [--writer native|python]
(a row is a rate in records/s, with 's': a system call per step, 'f': an fsync per step)
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
    run_dir, rate, per_step, flush = sys.argv[1], float(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    rec = gt.init(run_dir, flush_interval_s=flush)
    syscall, fsync = per_step == "s", per_step == "f"
    fd = os.open(os.devnull, os.O_WRONLY)
    if fsync:
        fd = os.open(os.path.join(os.path.dirname(run_dir), "fsynced"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
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
        elif fsync:
            os.write(fd, b"x")
            os.fsync(fd)
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

# (records/s, per step: "" nothing, "s" a system call, "f" an fsync)
RATES = [(2_500, ""), (2_500, "s"), (2_500, "f"), (140_000, ""), (140_000, "s"), (140_000, "f"), (500_000, ""),
         (500_000, "s")]
SLACK_S = 0.05  # the promise: one flush interval plus this
PER_STEP = {"": "nothing", "s": "a system call", "f": "an fsync"}


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


def kill_once(rate: int, per_step: str, flush: float, hold: float, env: dict[str, str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "run")
        child = subprocess.Popen([sys.executable, "-c", CHILD, run_dir, str(rate), per_step or "-", str(flush)],
                                 stdout=subprocess.PIPE, text=True, env=env)
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
    parser.add_argument("--quick", action="store_true", help="3 kills per row (about a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    parser.add_argument("--kills", type=int, default=None, help="kills per row (default 100)")
    parser.add_argument("--flush-interval", type=float, default=0.2)
    parser.add_argument("--rows", default=None, help="e.g. 2500f,140000s,500000 (see the usage)")
    parser.add_argument("--writer", choices=("native", "python"), default="native")
    args = parser.parse_args()
    rates = RATES
    if args.rows:
        rates = [(int(x.rstrip("sf")), x[-1] if x[-1] in "sf" else "") for x in args.rows.split(",")]
    kills = args.kills or (3 if args.quick else 100)
    env = {**os.environ, "GOODTRACE_NATIVE_WRITER": "1" if args.writer == "native" else "0"}
    bound = args.flush_interval + SLACK_S
    rng = random.Random(12)
    rows = []
    for rate, per_step in rates:
        results = [kill_once(rate, per_step, args.flush_interval, rng.uniform(0.6, 1.6), env) for _ in range(kills)]
        losses = sorted(r["lost_s"] for r in results)
        row = {
            "rate": rate, "per_step": PER_STEP[per_step], "kills": kills,
            "achieved_rate": round(min(r["rate"] for r in results)),
            "median_lost_s": losses[len(losses) // 2], "max_lost_s": losses[-1],
            "over_bound": sum(1 for x in losses if x > bound),
            "peak_buffer_records": max(r["peak_buffer"] for r in results),
        }
        rows.append(row)
        print(f"{rate:>7}/s {PER_STEP[per_step]:>13} per step: median {row['median_lost_s']:.3f} s, "
              f"max {row['max_lost_s']:.3f} s, {row['over_bound']}/{kills} over {bound:.2f} s", file=sys.stderr, flush=True)
    interval = args.flush_interval
    print(f"{args.writer} writer; flush interval {interval} s; bound {bound:.2f} s (one interval + {SLACK_S * 1000:.0f} ms); "
          f"loss = kill time - newest record on disk; {kills} kills per row")
    print("| records/s (achieved) | per step | median lost | worst lost | worst / interval | kills over the bound | peak buffer |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['rate']:,} ({r['achieved_rate']:,}) | {r['per_step']} | {r['median_lost_s']:.3f} s | "
              f"{r['max_lost_s']:.3f} s | {r['max_lost_s'] / interval:.2f}x | {r['over_bound']}/{r['kills']} | "
              f"{r['peak_buffer_records']:,} |")
    if args.json:
        print(json.dumps({"writer": args.writer, "flush_interval_s": interval, "bound_s": bound, "rows": rows}))


if __name__ == "__main__":
    main()
