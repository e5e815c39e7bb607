"""The training thread's blocked time per clock sync, at N = 2 ... 64 processes (gloo on
loopback), before and after clock alignment moved to a background thread with one rank per host.

For each N, every process runs ``rounds`` ping-pongs per sync, several syncs in a row:

  collective (before)  ``sync_clocks()``: rank 0 answers (N - 1) x rounds pings one rank after
                       another, synchronously, on the training thread of every rank; the time
                       each rank spends in the call is what its loop is blocked
  background (after)   the torch integration's clock rounds: the step-end hook only asks for a
                       round (``BackgroundClockSync.request()``, the blocked time); the round runs
                       on a daemon thread, hosts in parallel, one leader per host (``--per-host``
                       ranks share an emulated host); its duration is reported but blocks nothing

Blocked time per sync is the worst rank's median over the syncs. The collective's grows with N
(a line is fitted and extrapolated to 1,024 and 10,000 ranks); the background request does not
depend on N. The same run measures both, so the ratio is against its own baseline.

Usage: python benchmarks/clock_sync.py [--quick] [--json] [--ranks 2,4,8] [--per-host 8] [--syncs 5]
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
    import json, socket, sys, time
    rank, world, port, per_host, syncs, rounds, run_dir = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
        int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7])
    socket.gethostname = lambda: f"host{rank // per_host}"  # emulated hosts: ranks of one host share its clock
    import torch
    import torch.distributed as dist
    import goodtrace as gt
    from goodtrace.integrations.torch import instrument, sync_clocks
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rec = gt.init(run_dir, rank=rank, world_size=world)
    integration = instrument(live=False, memory=False, clock_sync_every=0, clock_sync_rounds=rounds)
    background = integration._clock_sync
    assert background is not None and background.wait(120)  # the start-up round
    clock = time.perf_counter_ns
    collective, requested, round_s = [], [], []
    cpu_before = len(background.round_cpu_ns)
    for _ in range(syncs):
        dist.barrier(group=integration.group)
        t0 = clock()
        sync_clocks(integration.group, clock, rounds)
        collective.append(clock() - t0)
        dist.barrier(group=integration.group)
        t0 = clock()
        background.request()
        t1 = clock()
        assert background.wait(120)
        requested.append(t1 - t0)
        round_s.append(clock() - t0)
    gt.finish()
    print(json.dumps({"rank": rank, "collective": collective, "request": requested, "round": round_s,
                      "round_cpu": background.round_cpu_ns[cpu_before:]}))
    dist.destroy_process_group()
    """
)




def run(world: int, per_host: int, syncs: int, rounds: int) -> dict[str, Any]:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
        children = [
            subprocess.Popen([sys.executable, "-c", CHILD, str(rank), str(world), str(port), str(per_host),
                              str(syncs), str(rounds), os.path.join(tmp, "run")],
                             stdout=subprocess.PIPE, text=True, env=env)
            for rank in range(world)
        ]
        results = []
        for child in children:
            out, _ = child.communicate(timeout=900)
            if child.returncode != 0:
                raise RuntimeError(f"a rank failed (exit {child.returncode})")
            results.append(json.loads(out.strip().splitlines()[-1]))

    def worst_median(key: str) -> float:
        return float(max(statistics.median(r[key]) for r in results)) / 1e6  # ms

    hosts = (world + per_host - 1) // per_host
    return {
        "ranks": world, "hosts": hosts, "rounds": rounds, "syncs": syncs,
        "collective_blocked_ms": worst_median("collective"),
        "background_blocked_ms": worst_median("request"),
        "background_round_ms": worst_median("round"),
        "background_round_cpu_ms": worst_median("round_cpu"),
    }


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line y = a + b x."""
    mx, my = statistics.mean(xs), statistics.mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - b * mx, b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 2, 4 (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    parser.add_argument("--ranks", default=None, help="comma-separated N (default 2,4,8,16,32,64)")
    parser.add_argument("--per-host", type=int, default=1, help="ranks per emulated host (default 1: every "
                        "rank its own host, the most leaders)")
    parser.add_argument("--syncs", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=16)
    args = parser.parse_args()
    ranks = [int(x) for x in (args.ranks or ("2,4" if args.quick else "2,4,8,16,32,64")).split(",")]
    syncs = args.syncs or (3 if args.quick else 5)
    rows = []
    for world in ranks:
        rows.append(run(world, args.per_host, syncs, args.rounds))
        r = rows[-1]
        print(f"N={world:>3} hosts={r['hosts']:>3}: collective {r['collective_blocked_ms']:.2f} ms blocked, "
              f"background {r['background_blocked_ms'] * 1e3:.1f} us blocked ({r['background_round_ms']:.2f} ms "
              "round)", file=sys.stderr, flush=True)
    extrapolated: dict[str, Any] = {}
    if len(rows) >= 2:
        a, b = _fit([r["ranks"] - 1.0 for r in rows], [r["collective_blocked_ms"] for r in rows])
        c, d = _fit([r["hosts"] - 1.0 for r in rows], [r["background_round_ms"] for r in rows])
        blocked = max(r["background_blocked_ms"] for r in rows)
        for n in (1024, 10_000):
            hosts = (n + args.per_host - 1) // args.per_host
            extrapolated[str(n)] = {
                "collective_blocked_ms": a + b * (n - 1),
                "background_blocked_ms": blocked,
                "background_round_ms": c + d * (hosts - 1),
                "hosts": hosts,
            }
        extrapolated["fit"] = {"collective_ms_per_peer": b, "background_round_ms_per_host": d}
    print(f"{args.rounds} ping-pongs per sync, {syncs} syncs per N, {args.per_host} rank(s) per emulated host; "
          "blocked = the worst rank's median time on its training thread per sync")
    print("| N | hosts | collective: blocked ms | background: blocked ms | ratio | background round ms "
          "(its thread's CPU ms) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ratio = r["collective_blocked_ms"] / r["background_blocked_ms"] if r["background_blocked_ms"] else float("inf")
        print(f"| {r['ranks']} | {r['hosts']} | {r['collective_blocked_ms']:.2f} | {r['background_blocked_ms']:.4f} | "
              f"{ratio:,.0f}x | {r['background_round_ms']:.2f} ({r['background_round_cpu_ms']:.2f}) |")
    for label in ("1024", "10000"):
        if label in extrapolated:
            e = extrapolated[label]
            print(f"| {label} (extrapolated) | {e['hosts']} | {e['collective_blocked_ms']:.0f} | "
                  f"{e['background_blocked_ms']:.4f} | | {e['background_round_ms']:.0f} |")
    if args.json:
        print(json.dumps({"rows": rows, "extrapolated": extrapolated, "per_host": args.per_host,
                          "rounds": args.rounds}))


if __name__ == "__main__":
    main()
