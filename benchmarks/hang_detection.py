"""How soon after its learned bound a hang is on disk and rank 0's line names it, on a 4-rank
gloo job (CPU) where one rank blocks forever at step 20 (issue 20's target: "detected within 2
median step times plus one flush interval").

Each rank runs ~50 ms steps (a busy loop, then an all-reduce), with ``gt.detect_hangs(floor_s=
0.1)`` so that the learned bound (10x the median step) is the bound, the default check interval
(0.1 s) and flush interval (1 s). The hung rank's last progress is its entry into step 20; its
bound elapses ``bound_s`` later. Measured from that moment, on the one monotonic clock the
processes of this host share:

- ``recorded``: when the hung rank's watchdog recorded its ``hang`` event (its ``silent_s`` less
  its ``bound_s``), and the same for the ranks waiting for it (after their own bounds);
- ``on_disk``: when this script, reading the rank's files every 5 ms, first saw the event;
- ``line``: when rank 0 printed ``goodtrace: hang: rank 2 ... stuck in ...`` (its standard error,
  read by a thread of this script).

Usage: python benchmarks/hang_detection.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _timing import free_port

WORLD, HUNG, HANG_AT, STEP_S, STEPS = 4, 2, 20, 0.05, 40


def _worker(rank: int, port: int, run_dir: str) -> None:
    import torch
    import torch.distributed as dist

    import goodtrace as gt

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    gt.init(run_dir, rank=rank, world_size=WORLD)
    gt.detect_hangs(floor_s=0.1)
    total = torch.ones(4)
    for step in range(STEPS):
        with gt.step(step):
            with gt.span("forward"):
                deadline = time.perf_counter() + STEP_S
                while time.perf_counter() < deadline:
                    pass
                if rank == HUNG and step == HANG_AT:
                    threading.Event().wait()  # blocks forever
            dist.all_reduce(total)
    gt.finish()
    dist.destroy_process_group()




def _hang_events(rank_dir: Path) -> list[dict[str, Any]]:
    found = []
    for segment in rank_dir.glob("*.jsonl"):
        for line in segment.read_bytes().splitlines():
            if b'"name":"hang"' in line:
                try:
                    found.append(json.loads(line))
                except ValueError:
                    pass  # a torn line being written
    return found


def trial() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as run_dir:
        port = free_port()
        env = os.environ | {"PYTHONUNBUFFERED": "1"}
        procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(r), str(port), run_dir],
                                  stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
                 for r in range(WORLD)]
        line_at: list[int] = []

        def read_rank0() -> None:
            assert procs[0].stderr is not None
            for text in procs[0].stderr:
                if text.startswith("goodtrace: hang:") and not line_at:
                    line_at.append(time.perf_counter_ns())

        reader = threading.Thread(target=read_rank0, daemon=True)
        reader.start()
        seen_at: dict[int, int] = {}
        deadline = time.monotonic() + 180
        try:
            while (len(seen_at) < WORLD or not line_at) and time.monotonic() < deadline:
                for r in range(WORLD):
                    if r not in seen_at and _hang_events(Path(run_dir) / f"rank-{r:05d}"):
                        seen_at[r] = time.perf_counter_ns()
                time.sleep(0.005)
            events = {r: _hang_events(Path(run_dir) / f"rank-{r:05d}") for r in range(WORLD)}
        finally:
            for p in procs:
                p.kill()
                p.wait(timeout=30)
        attrs = {r: e[0]["attrs"] for r, e in events.items() if e}
        hung = attrs.get(HUNG)
        if hung is None or not line_at:
            return {"complete": False}
        bound_at = hung["since"] + round(hung["bound_s"] * 1e9)  # the hung rank's bound elapsed
        return {
            "complete": True,
            "median_step_s": hung["median_step_s"], "bound_s": hung["bound_s"],
            "recorded_s": hung["silent_s"] - hung["bound_s"],
            "on_disk_s": (seen_at[HUNG] - bound_at) / 1e9,
            "line_s": (line_at[0] - bound_at) / 1e9,
            "others_recorded_s": [a["silent_s"] - a["bound_s"] for r, a in sorted(attrs.items()) if r != HUNG],
            "all_on_disk_s": (max(seen_at.values()) - bound_at) / 1e9,
        }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    trials = [trial() for _ in range(2 if args.quick else 5)]
    done = [t for t in trials if t["complete"]]
    result: dict[str, Any] = {"trials": len(trials), "complete": len(done), "flush_interval_s": 1.0,
                              "check_interval_s": 0.1}
    for key in ("median_step_s", "bound_s", "recorded_s", "on_disk_s", "all_on_disk_s", "line_s"):
        values = [t[key] for t in done]
        result[f"{key}_median"] = statistics.median(values) if values else float("nan")
        result[f"{key}_max"] = max(values) if values else float("nan")
    result["target_s"] = 2 * result["median_step_s_median"] + result["flush_interval_s"]
    for key, value in result.items():
        print(f"{key:28s} {value:.4g}" if isinstance(value, float) else f"{key:28s} {value}")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
