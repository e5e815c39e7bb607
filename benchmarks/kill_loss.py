"""How much a SIGKILL loses: a process records at a fixed rate (a step and 19 spans per step),
with nothing else per step, one system call per step (a 1-byte write: the GIL convoy that
starved the Python writer) or one fsync per step, and is SIGKILLed at a random moment; the loss
is the time between the kill and the newest record in the segments once the reader has
recovered the dead process's ring (``goodtrace.read.ring``, run by ``list_segments``).

With the native writer's ring in a file (the default) the promise is at most 50 ms whatever the
load: every record that reached the ring is recovered. Each kill also checks that no step is
missing or there twice, and, from a note the loop keeps in a mapped file after every step (a
store, no system call), whether every step it had appended is in the segments, and how long it
had made no progress before the kill (the scheduler's share of the loss). The baseline, measured in the same run, is the ring in the process's
memory (``GOODTRACE_RING_FILE=0``: at most one flush interval plus 50 ms, when the writer thread
gets a core), ``--baseline-kills`` per row; ``--no-ring`` measures only that, ``--writer python``
the Python writer threads (GOODTRACE_NATIVE_WRITER=0). Each row is killed ``--kills`` times
(100 by default, 3 with ``--quick``) at random moments 0.6-1.6 s after start; the table gives
the median and worst loss, the worst as a ratio to the flush interval and to the baseline's,
how many kills lost more than the bound, and the worst loss before the recovery (what was in
the segment files at the kill).

Usage: python benchmarks/kill_loss.py [--quick] [--json] [--kills K] [--baseline-kills K]
       [--flush-interval S] [--rows 2500f,2500s,140000,500000s] [--writer native|python] [--no-ring]
(a row is a rate in records/s, with 's': a system call per step, 'f': an fsync per step)
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import re
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from typing import Any

CHILD = textwrap.dedent(
    """
    import mmap, os, struct, sys, time
    import goodtrace as gt
    run_dir, rate, per_step, flush = sys.argv[1], float(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    progress_fd = os.open(sys.argv[5], os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(progress_fd, 16)
    progress = mmap.mmap(progress_fd, 16)  # the last step appended and when: a store, no system call
    pack = struct.Struct("<qq").pack_into
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
        pack(progress, 0, step, clock())
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


def _steps(run_dir: str) -> tuple[int, int, int]:
    """(steps, steps missing below the highest, steps there twice) over every segment."""
    seen: dict[int, int] = {}
    for path in glob.glob(f"{run_dir}/rank-*/*.jsonl"):
        with open(path, "rb") as handle:
            for number in re.findall(rb'\{"kind":"step","step":(\d+),[^\n]*\}\n', handle.read()):
                seen[int(number)] = seen.get(int(number), 0) + 1
    top = max(seen, default=-1)
    return len(seen), top + 1 - len(seen), sum(count - 1 for count in seen.values())


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
        progress_path = os.path.join(tmp, "progress")
        child = subprocess.Popen([sys.executable, "-c", CHILD, run_dir, str(rate), per_step or "-", str(flush),
                                  progress_path], stdout=subprocess.PIPE, text=True, env=env)
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
        on_disk = newest_record_ns(run_dir) or t_start
        from goodtrace.read.segments import list_segments

        problems: list[str] = []
        list_segments(run_dir, problems, in_place=True)  # compact's: the ring into a segment of the run
        newest = newest_record_ns(run_dir) or t_start
        steps, missing, twice = _steps(run_dir)
        with open(progress_path, "rb") as handle:
            last_step, last_step_ns = struct.unpack("<qq", handle.read(16))
        whole = [line.split() for line in reports if line.endswith("\n") and len(line.split()) == 3]
        last = whole[-1] if whole else ["0", "1", "0"]  # the kill may cut the last line
        return {
            "lost_s": (t_kill - newest) / 1e9,
            "on_disk_lost_s": (t_kill - on_disk) / 1e9,
            "steps": steps, "missing": missing, "twice": twice,
            # steps the loop had appended (its own note) that are not in the segments
            "appended_not_written": max(0, last_step + 1 - steps),
            # the time the loop itself made no progress before the kill (the scheduler's, not the recorder's)
            "idle_before_kill_s": (t_kill - last_step_ns) / 1e9 if last_step_ns else 0.0,
            "recovered": sum(1 for p in problems if "recovered from its ring" in p),
            "rate": int(last[0]) / max(float(last[1]), 1e-9),
            "peak_buffer": max((int(fields[2]) for fields in whole), default=0),
        }


def measure(rate: int, per_step: str, flush: float, kills: int, env: dict[str, str], bound: float,
            rng: random.Random) -> dict[str, Any]:
    results = [kill_once(rate, per_step, flush, rng.uniform(0.6, 1.6), env) for _ in range(kills)]
    losses = sorted(r["lost_s"] for r in results)
    return {
        "rate": rate, "per_step": PER_STEP[per_step], "kills": kills,
        "achieved_rate": round(min(r["rate"] for r in results)),
        "median_lost_s": losses[len(losses) // 2], "max_lost_s": losses[-1],
        "over_bound": sum(1 for x in losses if x > bound), "bound_s": bound,
        "max_on_disk_lost_s": max(r["on_disk_lost_s"] for r in results),
        "rings_recovered": sum(r["recovered"] for r in results),
        "steps_missing": sum(r["missing"] for r in results), "steps_twice": sum(r["twice"] for r in results),
        "steps_appended_not_written": sum(r["appended_not_written"] for r in results),
        "kills_with_steps_lost": sum(1 for r in results if r["appended_not_written"]),
        "max_idle_before_kill_s": max(r["idle_before_kill_s"] for r in results),
        "max_lost_beyond_idle_s": max(r["lost_s"] - r["idle_before_kill_s"] for r in results),
        "peak_buffer_records": max(r["peak_buffer"] for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 kills per row, 2 for the baseline (about two minutes)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    parser.add_argument("--kills", type=int, default=None, help="kills per row (default 100)")
    parser.add_argument("--baseline-kills", type=int, default=None,
                        help="kills per row of the baseline, the ring in memory (default 20; 0: none)")
    parser.add_argument("--flush-interval", type=float, default=0.2)
    parser.add_argument("--rows", default=None, help="e.g. 2500f,140000s,500000 (see the usage)")
    parser.add_argument("--writer", choices=("native", "python"), default="native")
    parser.add_argument("--no-ring", action="store_true", help="the native writer's ring in memory only")
    args = parser.parse_args()
    rates = RATES
    if args.rows:
        rates = [(int(x.rstrip("sf")), x[-1] if x[-1] in "sf" else "") for x in args.rows.split(",")]
    kills = args.kills or (3 if args.quick else 100)
    ring = args.writer == "native" and not args.no_ring
    baseline_kills = 0 if not ring else args.baseline_kills if args.baseline_kills is not None else (
        2 if args.quick else 20)
    native = "1" if args.writer == "native" else "0"
    env = {**os.environ, "GOODTRACE_NATIVE_WRITER": native, "GOODTRACE_RING_FILE": "1" if ring else "0"}
    baseline_env = {**env, "GOODTRACE_RING_FILE": "0"}
    interval = args.flush_interval
    bound = SLACK_S if ring else interval + SLACK_S
    baseline_bound = interval + SLACK_S
    rng = random.Random(12)
    rows = []
    for rate, per_step in rates:
        row = measure(rate, per_step, interval, kills, env, bound, rng)
        if baseline_kills:
            base = measure(rate, per_step, interval, baseline_kills, baseline_env, baseline_bound, rng)
            row["baseline"] = base
            row["max_lost_vs_baseline"] = row["max_lost_s"] / max(base["max_lost_s"], 1e-9)
        rows.append(row)
        print(f"{rate:>7}/s {PER_STEP[per_step]:>13} per step: median {row['median_lost_s']:.3f} s, "
              f"max {row['max_lost_s']:.3f} s, {row['over_bound']}/{kills} over {bound:.2f} s, "
              f"missing {row['steps_missing']}, twice {row['steps_twice']}, appended but not written "
              f"{row['steps_appended_not_written']}, loop idle before the kill up to "
              f"{row['max_idle_before_kill_s']:.3f} s", file=sys.stderr, flush=True)
    what = f"{args.writer} writer" + (", ring in a file" if ring else ", ring in memory" if native == "1" else "")
    print(f"{what}; flush interval {interval} s; bound {bound:.2f} s; loss = kill time - newest record in the "
          f"segments after the reader's recovery; {kills} kills per row"
          + (f"; baseline: the ring in memory, {baseline_kills} kills per row" if baseline_kills else ""))
    print("| records/s (achieved) | per step | median lost | worst lost | worst / interval | kills over the bound "
          "| worst loop idle before the kill | worst lost beyond it | kills with an appended step lost "
          "| worst in the files at the kill | steps missing / twice | baseline median / worst, over its bound |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        baseline = r.get("baseline")
        base_text = (f"{baseline['median_lost_s']:.3f} s / {baseline['max_lost_s']:.3f} s, "
                     f"{baseline['over_bound']}/{baseline['kills']}" if baseline else "")
        print(f"| {r['rate']:,} ({r['achieved_rate']:,}) | {r['per_step']} | {r['median_lost_s']:.3f} s | "
              f"{r['max_lost_s']:.3f} s | {r['max_lost_s'] / interval:.2f}x | {r['over_bound']}/{r['kills']} | "
              f"{r['max_idle_before_kill_s']:.3f} s | {r['max_lost_beyond_idle_s']:.3f} s | "
              f"{r['kills_with_steps_lost']}/{r['kills']} | {r['max_on_disk_lost_s']:.3f} s | {r['steps_missing']} / {r['steps_twice']} | {base_text} |")
    if args.json:
        print(json.dumps({"writer": args.writer, "ring_file": ring, "flush_interval_s": interval, "bound_s": bound,
                          "baseline_bound_s": baseline_bound, "rows": rows}))


if __name__ == "__main__":
    main()
