"""The live line's network traffic per rank per log step, at N = 2, 4, 8 real gloo processes on
loopback, measured by the kernel (TCP_INFO of each process's sockets: tests/helpers/tcp_bytes.py).

Two exchanges run in the same benchmark, each in its own N processes:

  all-gather (baseline)  what the torch integration did before issue 53: every log step, an
                         asynchronous ``all_gather`` of each rank's live vector (the same size as
                         today's) on a gloo group of its own, and a second gloo group for the
                         clock rounds (two meshes of sockets)
  rooted (this version)  ``instrument()`` itself: the vectors gathered to rank 0, a small
                         broadcast back, a summary only to ranks with sinks (none here), one group

``--before SRC`` also runs the baseline as the old code itself (``instrument()`` imported from
another checkout's ``src``, e.g. ``git worktree add /tmp/before HEAD~N``).

Per N: bytes sent and received per log step by the median rank other than 0, by rank 0, and the
sockets ``instrument()`` opened. A line is fitted per figure and extrapolated to 10,000 ranks (a
figure that does not grow is held at its mean; rank 0's sends grow as log2 N, a broadcast tree,
which the line overstates); ratios are the baseline's over this version's, in the same run.

Usage: python benchmarks/live_traffic.py [--quick] [--json] [--ranks 2,4,8] [--before SRC]
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
from pathlib import Path
from typing import Any

from _timing import free_port

HELPERS = str(Path(__file__).resolve().parent.parent / "tests")

CHILD = textwrap.dedent(
    """
    import datetime, json, sys, time
    rank, world, port, mode, steps, log_every, run_dir, helpers = (int(sys.argv[1]), int(sys.argv[2]),
        int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), sys.argv[7], sys.argv[8])
    sys.path.insert(0, helpers)
    from helpers.tcp_bytes import tcp_bytes
    import torch
    import torch.distributed as dist
    import goodtrace as gt
    from goodtrace.integrations.torch import instrument
    from goodtrace.record.live import vector as live_vector
    from goodtrace.record.live.names import NAME_FLOATS
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    gt.init(run_dir, rank=rank, world_size=world)
    before = tcp_bytes()
    size = live_vector.HEADER + live_vector.ENTRY * 64 + NAME_FLOATS
    if mode == "allgather":  # the exchange before issue 53, on two groups as it had
        group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=120))
        dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=120))  # the clock rounds' own
        works = []
        def exchange():
            local = torch.zeros(size, dtype=torch.float64)
            outputs = [torch.empty_like(local) for _ in range(world)]
            works.append(dist.all_gather(outputs, local, group=group, async_op=True))
    else:  # "instrument": this checkout's (or --before's) torch integration itself
        instrument(log_every=log_every, memory=False, clock_sync_every=0, printer=lambda text: None)
        exchange = None
    opened = tcp_bytes().sockets - before.sockets
    dist.barrier()
    warm = 2 * log_every
    for step in range(1, warm + steps + 1):
        with gt.step(step):
            time.sleep(0.01)
            gt.metric("loss", 1.0, "mean")
        if exchange is not None and step % log_every == 0:
            exchange()
        if step == warm:
            start = tcp_bytes()
    end = tcp_bytes()
    if exchange is not None:
        for work in works:
            work.wait()
    gt.finish()
    intervals = steps / log_every
    print(json.dumps({"rank": rank, "opened": opened, "sent": (end.sent - start.sent) / intervals,
                      "received": (end.received - start.received) / intervals, "vector_floats": size}))
    dist.barrier()
    dist.destroy_process_group()
    """
)


def run(world: int, mode: str, steps: int, log_every: int, src: str | None) -> dict[str, Any]:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
        if src is not None:
            env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
        children = [
            subprocess.Popen([sys.executable, "-c", CHILD, str(rank), str(world), str(port), mode, str(steps),
                              str(log_every), os.path.join(tmp, "run"), HELPERS],
                             stdout=subprocess.PIPE, text=True, env=env)
            for rank in range(world)
        ]
        results = []
        for child in children:
            out, _ = child.communicate(timeout=600)
            if child.returncode != 0:
                raise RuntimeError(f"a rank failed (exit {child.returncode})")
            results.append(json.loads(out.strip().splitlines()[-1]))
    results.sort(key=lambda r: r["rank"])
    others = results[1:]
    return {
        "ranks": world, "vector_floats": results[0]["vector_floats"],
        "other_sent": statistics.median(r["sent"] for r in others),
        "other_received": statistics.median(r["received"] for r in others),
        "other_max_sent": max(r["sent"] for r in others),
        "rank0_sent": results[0]["sent"], "rank0_received": results[0]["received"],
        "sockets_opened": max(r["opened"] for r in results),
    }


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    mx, my = statistics.mean(xs), statistics.mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - b * mx, b


KEYS = ("other_sent", "other_received", "rank0_sent", "rank0_received", "sockets_opened")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 2, 4, fewer steps")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    parser.add_argument("--ranks", default=None, help="comma-separated N (default 2,4,8)")
    parser.add_argument("--before", default=None, help="also measure instrument() from this src directory")
    args = parser.parse_args()
    ranks = [int(x) for x in (args.ranks or ("2,4" if args.quick else "2,4,8")).split(",")]
    steps, log_every = (20, 2) if args.quick else (60, 2)
    variants: dict[str, tuple[str, str | None]] = {"allgather": ("allgather", None), "rooted": ("instrument", None)}
    if args.before:
        variants["before_code"] = ("instrument", str(Path(args.before).resolve()))
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for world in ranks:
        for name, (mode, src) in variants.items():
            rows[name].append(run(world, mode, steps, log_every, src))
            r = rows[name][-1]
            print(f"N={world} {name:>11}: other rank sends {r['other_sent'] / 1e3:8.1f} kB, receives "
                  f"{r['other_received'] / 1e3:8.1f} kB per log step; rank 0 sends {r['rank0_sent'] / 1e3:8.1f} kB, "
                  f"receives {r['rank0_received'] / 1e3:8.1f} kB; {r['sockets_opened']} sockets opened",
                  file=sys.stderr, flush=True)
    extrapolated: dict[str, dict[str, float]] = {}
    for name, found in rows.items():
        extrapolated[name] = {}
        for key in KEYS:
            ys = [float(r[key]) for r in found]
            a, b = _fit([float(r["ranks"]) for r in found], ys)
            # a figure that does not grow with N (within noise) is held at its mean
            extrapolated[name][key] = a + b * 10_000 if b > 0.05 * statistics.mean(ys) else statistics.mean(ys)
    ratios = {key: (extrapolated["allgather"][key] / extrapolated["rooted"][key]
                    if extrapolated["rooted"][key] else None) for key in KEYS}
    for name, figures in extrapolated.items():
        print(f"10,000 ranks {name:>11}: other rank sends {figures['other_sent'] / 1e6:.3f} MB, receives "
              f"{figures['other_received'] / 1e6:.3f} MB per log step; rank 0 receives "
              f"{figures['rank0_received'] / 1e6:.1f} MB; {figures['sockets_opened']:.0f} sockets", file=sys.stderr)
    print("ratios all-gather / rooted at 10,000 ranks: " + ", ".join(
        f"{k} {v:.1f}x" for k, v in ratios.items() if v is not None), file=sys.stderr)
    result = {"ranks": ranks, "log_every": log_every, "rows": rows, "at_10000": extrapolated,
              "ratio_at_10000": ratios}
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
