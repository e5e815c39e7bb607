"""The training thread's stall per clock sync under JAX, at N = 2, 4, 8 real ``jax.distributed``
CPU processes on this machine, before and after the rounds moved to a background thread.

Every process runs, several syncs in a row, each after a barrier of the key-value store:

  blocking (before)    ``measure_clock_offset()``: what ``instrument()`` called on the training
                       thread every ``clock_sync_every`` steps before issue 53: two barriers and
                       16 ping-pongs per process through the coordinator's key-value store, the
                       reference serving the processes one after another; its duration is the stall
  background (after)   ``instrument()``'s own rounds: the step-end hook only asks for a round
                       (``BackgroundClockSync.request()``, the stall); a thread pings the
                       reference, which serves every process at once; the round's duration is
                       reported but blocks nothing

The stall per sync is the worst process's median. A line is fitted to the blocking stall against
N - 1 and extrapolated to 256 hosts (one process per host); the background stall does not depend
on N. Both are measured in the same run: the ratio is against its own baseline.

Usage: python benchmarks/jax_clock_sync.py [--quick] [--json] [--processes 2,4,8] [--syncs 5]
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

from _timing import free_port

CHILD = textwrap.dedent(
    """
    import json, sys, time
    process_id, world, port, syncs, run_dir = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
        int(sys.argv[4]), sys.argv[5])
    import jax
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=world,
                               process_id=process_id, initialization_timeout=120)
    import goodtrace as gt
    from goodtrace.integrations import jax as gj
    client = gj._client()
    gt.init(run_dir)
    integration = gj.instrument(live=False, clock_sync_every=0)
    background = integration._clock_sync
    assert background is not None and background.wait(120)  # the start-up round
    clock = time.perf_counter_ns
    blocking, requested, rounds = [], [], []
    for i in range(syncs):
        client.wait_at_barrier(f"bench/a{i}", 120_000)
        t0 = clock()
        gj.measure_clock_offset(record=False)
        blocking.append(clock() - t0)
        client.wait_at_barrier(f"bench/b{i}", 120_000)
        t0 = clock()
        background.request()
        t1 = clock()
        assert background.wait(120)
        requested.append(t1 - t0)
        rounds.append(clock() - t0)
    gt.finish()
    print(json.dumps({"blocking": blocking, "request": requested, "round": rounds}))
    jax.distributed.shutdown()
    """
)


def run(world: int, syncs: int) -> dict[str, Any]:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "OMP_NUM_THREADS": "1"}
        env.pop("XLA_FLAGS", None)
        children = [subprocess.Popen([sys.executable, "-c", CHILD, str(rank), str(world), str(port), str(syncs),
                                      os.path.join(tmp, "run")], stdout=subprocess.PIPE, text=True, env=env)
                    for rank in range(world)]
        results = []
        for child in children:
            out, _ = child.communicate(timeout=900)
            if child.returncode != 0:
                raise RuntimeError(f"a process failed (exit {child.returncode})")
            results.append(json.loads(out.strip().splitlines()[-1]))

    def worst_median(key: str) -> float:
        return float(max(statistics.median(r[key]) for r in results)) / 1e6  # ms

    return {"processes": world, "syncs": syncs, "blocking_stall_ms": worst_median("blocking"),
            "background_stall_ms": worst_median("request"), "background_round_ms": worst_median("round")}


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    mx, my = statistics.mean(xs), statistics.mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - b * mx, b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 2, 3 syncs")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    parser.add_argument("--processes", default=None, help="comma-separated N (default 2,4,8)")
    parser.add_argument("--syncs", type=int, default=None)
    args = parser.parse_args()
    worlds = [int(x) for x in (args.processes or ("2" if args.quick else "2,4,8")).split(",")]
    syncs = args.syncs or (3 if args.quick else 5)
    rows = []
    for world in worlds:
        rows.append(run(world, syncs))
        r = rows[-1]
        print(f"N={world}: blocking {r['blocking_stall_ms']:.2f} ms stalled, background "
              f"{r['background_stall_ms'] * 1e3:.1f} us stalled ({r['background_round_ms']:.2f} ms round)",
              file=sys.stderr, flush=True)
    a, b = _fit([r["processes"] - 1.0 for r in rows], [r["blocking_stall_ms"] for r in rows]) if len(rows) > 1 \
        else (0.0, rows[0]["blocking_stall_ms"] / max(1, rows[0]["processes"] - 1))
    stall = max(r["background_stall_ms"] for r in rows)
    at_256 = {"blocking_stall_ms": a + b * 255, "background_stall_ms": stall}
    ratio = at_256["blocking_stall_ms"] / stall if stall else None
    print(f"256 hosts: blocking {at_256['blocking_stall_ms']:.0f} ms per sync, background {stall * 1e3:.1f} us"
          + (f" ({ratio:.0f}x less)" if ratio else ""), file=sys.stderr)
    result = {"rows": rows, "at_256": at_256, "ratio_at_256": ratio}
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
