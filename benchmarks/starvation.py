"""Can a busy training loop starve the writer? A process runs steps of 200 us of busy Python
work plus one system call (a 1-byte write to a pipe: the GIL convoy), a step and 15 spans per
step, for ``--seconds`` (60; 10 with ``--quick``), then finishes. The promise: nothing dropped,
the buffer bounded (it holds about one chunk at most), heartbeats on time.

Reported: records produced and written, records dropped (the heartbeats' count), the most
records the buffer held (sampled every 50 ms), and the longest gap between two heartbeats on
disk, as a ratio to the flush interval. ``--writer python`` runs the Python writer threads
(GOODTRACE_NATIVE_WRITER=0), the baseline of the same run.

Usage: python benchmarks/starvation.py [--quick] [--json] [--seconds S] [--writer native|python]
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from typing import Any

CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    import goodtrace as gt
    run_dir, seconds, flush = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    rec = gt.init(run_dir, flush_interval_s=flush)
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    clock = time.perf_counter_ns
    span = gt.span
    end = clock() + int(seconds * 1e9)
    next_sample = 0
    produced = peak = step = 0
    while clock() < end:
        with gt.step(step):
            for _ in range(15):
                with span("fwd"):
                    pass
            busy = clock() + 200_000
            while clock() < busy:
                pass
        produced += 16
        step += 1
        try:
            os.write(write_end, b"x")
        except BlockingIOError:
            os.read(read_end, 1 << 16)
        now = clock()
        if now >= next_sample:
            next_sample = now + 50_000_000
            peak = max(peak, len(rec.buffer))
    ok = gt.finish()
    print(json.dumps({"produced": produced, "peak_buffer": peak, "finish_ok": ok,
                      "dropped": rec.dropped_records}))
    """
)


def read_back(run_dir: str) -> tuple[int, list[int], int]:
    """(records other than headers and heartbeats, heartbeat monos, the largest dropped count)."""
    records, beats, dropped = 0, [], 0
    for path in sorted(glob.glob(f"{run_dir}/rank-*/*.jsonl")):
        with open(path, "rb") as handle:
            for line in handle:
                kind = line[9:18]
                if kind == b"heartbeat":
                    record = json.loads(line)
                    beats.append(record["mono"])
                    dropped = max(dropped, record["dropped"])
                elif not kind.startswith((b'header"', b'finish"')):
                    records += 1
    return records, sorted(beats), dropped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 s instead of 60 s")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--flush-interval", type=float, default=0.2)
    parser.add_argument("--writer", choices=("native", "python"), default="native")
    args = parser.parse_args()
    seconds = args.seconds or (10.0 if args.quick else 60.0)
    env = {**os.environ, "GOODTRACE_NATIVE_WRITER": "1" if args.writer == "native" else "0"}
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "run")
        out = subprocess.run([sys.executable, "-c", CHILD, run_dir, str(seconds), str(args.flush_interval)],
                             capture_output=True, text=True, env=env, timeout=seconds * 3 + 120)
        if out.returncode != 0:
            raise SystemExit(out.stderr)
        child: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        written, beats, dropped_on_disk = read_back(run_dir)
    gap = max((b - a for a, b in itertools.pairwise(beats)), default=0) / 1e9
    result = {
        "writer": args.writer, "seconds": seconds, "flush_interval_s": args.flush_interval,
        "produced": child["produced"], "written": written, "dropped": child["dropped"],
        "dropped_in_heartbeats": dropped_on_disk, "peak_buffer_records": child["peak_buffer"],
        "finish_ok": child["finish_ok"], "longest_heartbeat_gap_s": round(gap, 3),
        "gap_over_interval": round(gap / args.flush_interval, 2),
    }
    print(f"{args.writer} writer, {seconds:.0f} s of 200 us busy steps + a system call, flush interval "
          f"{args.flush_interval} s: {result['produced']:,} records produced, {written:,} written, "
          f"{result['dropped']:,} dropped; buffer peak {result['peak_buffer_records']:,} records; longest heartbeat "
          f"gap {gap:.3f} s ({result['gap_over_interval']}x the interval); finish() -> {result['finish_ok']}")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
