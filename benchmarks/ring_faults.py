"""What the ring in a file costs the training thread: page faults and nanoseconds per span with
the native writer's ring in a file mapped MAP_SHARED (the default) against the ring in the
process's memory (``GOODTRACE_RING_FILE=0``, the baseline), measured in the same run, rounds
interleaved.

A process records spans flat out for ``--seconds`` (a step every 20 spans); a thread in it calls
``os.sync()`` every ``--sync-every`` seconds: writeback marks every written-back page of a
shared file mapping read-only again, so the next write to it faults (``page_mkwrite``). The
kernel's own writeback does this every few seconds; ``os.sync()`` does it at once, the worst
case. Figures: nanoseconds per span over the whole loop and minor page faults of the process
per 1,000 spans (``getrusage``), and their ratios ring file / memory.

It also times the reader's recovery of a ring (``goodtrace.read.ring``: decode and encode what
the writer had not written) at two sizes an order of magnitude apart (``--recover`` records and
ten times as many, capped by the default ring of ~500 k records): seconds per record, and the
ratio of the two (1.0: linear).

Usage: python benchmarks/ring_faults.py [--quick] [--json] [--seconds S] [--rounds N] [--sync-every S]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from typing import Any

CHILD = textwrap.dedent(
    """
    import json, os, resource, sys, threading, time
    import goodtrace as gt
    run_dir, seconds, sync_every = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    rec = gt.init(run_dir)
    stop = threading.Event()
    def syncer():
        while not stop.wait(sync_every):
            os.sync()
    if sync_every > 0:
        threading.Thread(target=syncer, daemon=True).start()
    span = gt.span
    clock = time.perf_counter_ns
    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = clock()
    end = start + int(seconds * 1e9)
    n = step = 0
    while clock() < end:
        with gt.step(step):
            for _ in range(19):
                with span("fwd"):
                    pass
        n += 20
        step += 1
    took = clock() - start
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
    stop.set()
    print(json.dumps({"ns_per_record": took / n, "faults_per_1k": faults * 1000 / n, "records": n,
                      "ring_file": rec.writer.ring_file is not None if hasattr(rec.writer, "ring_file") else None,
                      "ok": gt.finish()}))
    """
)


def run_once(ring: bool, seconds: float, sync_every: float) -> dict[str, Any]:
    env = {**os.environ, "GOODTRACE_RING_FILE": "1" if ring else "0"}
    with tempfile.TemporaryDirectory(dir=os.environ.get("GOODTRACE_BENCH_DIR")) as tmp:
        out = subprocess.run([sys.executable, "-c", CHILD, os.path.join(tmp, "run"), str(seconds), str(sync_every)],
                             capture_output=True, text=True, env=env, timeout=seconds * 10 + 120)
    if out.returncode != 0:
        raise SystemExit(out.stderr)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if result["ring_file"] is not ring:
        raise SystemExit(f"asked for the ring {'in a file' if ring else 'in memory'}, got {result}")
    return result


def recovery_seconds(records: int) -> float:
    """Seconds to decode a dead writer's ring holding ``records`` spans (none written yet)."""
    import shutil
    import time

    from goodtrace.read.ring import pending_lines, read_ring
    from goodtrace.record import fastpath
    from goodtrace.record.config import Config
    from goodtrace.record.io.native import NativeWriter
    from goodtrace.record.io.storage import LocalStorage
    from goodtrace.record.spans import span_key

    with tempfile.TemporaryDirectory(dir=os.environ.get("GOODTRACE_BENCH_DIR")) as tmp:
        writer = NativeWriter(fastpath.native, LocalStorage(tmp), Config(),
                              lambda segment, wall, mono: {"kind": "header", "segment": segment, "wall": wall,
                                                           "mono": mono}, "rank-00000/s")
        key = span_key("fwd", "compute")
        append = writer.buffer.append
        for i in range(records):  # never started: every record stays in the ring
            append((key, i, i + 1, i // 20, 1, None, None))
        copy = os.path.join(tmp, "copy.ring")
        shutil.copyfile(writer.ring_file or "", copy)
        started = time.perf_counter()
        lines, damaged = pending_lines(read_ring(copy))
        took = time.perf_counter() - started
        if len(lines) != records or damaged:
            raise SystemExit(f"recovered {len(lines)} of {records} records ({damaged})")
        return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 5 s each way (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per loop (default 20)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds, each way (default 3)")
    parser.add_argument("--sync-every", type=float, default=1.0, help="os.sync() period in the child (0: none)")
    parser.add_argument("--recover", type=int, default=None,
                        help="records in the smaller ring recovered (default 40,000; 10,000 with --quick)")
    args = parser.parse_args()
    seconds = args.seconds or (5.0 if args.quick else 20.0)
    rounds = args.rounds or (2 if args.quick else 3)
    results: dict[str, list[dict[str, Any]]] = {"file": [], "memory": []}
    for _ in range(rounds):
        for ring in (True, False):
            result = run_once(ring, seconds, args.sync_every)
            results["file" if ring else "memory"].append(result)
            print(f"ring in {'a file' if ring else 'memory'}: {result['ns_per_record']:.0f} ns/record, "
                  f"{result['faults_per_1k']:.2f} faults per 1k records", file=sys.stderr, flush=True)
    figures = {
        where: {
            "ns_per_record": statistics.median(r["ns_per_record"] for r in runs),
            "faults_per_1k_records": statistics.median(r["faults_per_1k"] for r in runs),
        }
        for where, runs in results.items()
    }
    ratios = {
        "ns_per_record_file_vs_memory": figures["file"]["ns_per_record"] / figures["memory"]["ns_per_record"],
        "faults_file_minus_memory_per_1k": (figures["file"]["faults_per_1k_records"]
                                            - figures["memory"]["faults_per_1k_records"]),
    }
    print(f"{rounds} rounds of {seconds:.0f} s each way, os.sync() every {args.sync_every} s (medians)")
    for where, figure in figures.items():
        print(f"  ring in {where:<6}  {figure['ns_per_record']:8.0f} ns/record  "
              f"{figure['faults_per_1k_records']:6.2f} faults per 1k records")
    print(f"  file / memory: {ratios['ns_per_record_file_vs_memory']:.2f}x time, "
          f"{ratios['faults_file_minus_memory_per_1k']:+.2f} faults per 1k records")
    small = args.recover or (10_000 if args.quick else 40_000)
    sizes = (small, min(10 * small, 480_000))
    took = [min(recovery_seconds(n) for _ in range(2)) for n in sizes]
    per_record = [t / n for t, n in zip(took, sizes, strict=True)]
    ratios["recovery_per_record_large_vs_small"] = per_record[1] / per_record[0]
    for n, t, p in zip(sizes, took, per_record, strict=True):
        print(f"  recovering a ring of {n:,} records: {t:.3f} s ({p * 1e6:.2f} us per record)")
    print(f"  per record, {sizes[1]:,} vs {sizes[0]:,}: {ratios['recovery_per_record_large_vs_small']:.2f}x")
    if args.json:
        print(json.dumps({"seconds": seconds, "rounds": rounds, "sync_every_s": args.sync_every, "figures": figures,
                          "recovery": {str(n): {"seconds": t, "us_per_record": p * 1e6}
                                       for n, t, p in zip(sizes, took, per_record, strict=True)},
                          "ratios": ratios}))


if __name__ == "__main__":
    main()
