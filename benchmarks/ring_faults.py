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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 5 s each way (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per loop (default 20)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds, each way (default 3)")
    parser.add_argument("--sync-every", type=float, default=1.0, help="os.sync() period in the child (0: none)")
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
    if args.json:
        print(json.dumps({"seconds": seconds, "rounds": rounds, "sync_every_s": args.sync_every, "figures": figures,
                          "ratios": ratios}))


if __name__ == "__main__":
    main()
