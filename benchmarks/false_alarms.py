"""False alarms over a clean run: 4 real gloo ranks (CPU) with hang detection on, a uniform
step, and checkpoints and evals about 10x the step every so often; how many hangs, stragglers
and slowdowns are named, in the report and on the live lines (issue 20: 0 over 10 minutes).

Each rank: steps of ~50 ms (a busy loop of 40 ms ``forward`` and 10 ms ``backward``: a device
of known speed; the 4 ranks share this machine's 2 cores with whatever else runs), an all-reduce
of the loss after the step (which also carries rank 0's "stop" when the time is up), a
checkpoint of 10-12 steps' time every 50 steps and an eval of 10x the step with an all-reduce
inside every 75. ``gt.detect_hangs(floor_s=0.1)``: the floor is below the learned bound (10x the
median step), so that only the learned bound and the phase rule keep checkpoints, evals and the
machine's pauses from alarming (the default 30 s floor would hide them). The live line every 10
steps (``instrument(log_every=10)``).

Counted: ``hang`` events in the files and ``hangs`` in the report; stragglers and slowdowns in
the report; on rank 0's live lines, the ranks named slower than they were; on every rank's
standard error, the watchdog's "made no progress" lines and rank 0's ``goodtrace: hang:``.

Usage: python benchmarks/false_alarms.py [--quick] [--json] [--seconds N]
(--quick: 45 s of training, under a minute in all; default: 600 s)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _timing import free_port

WORLD, FORWARD_S, BACKWARD_S = 4, 0.040, 0.010
CHECKPOINT_EVERY, EVAL_EVERY = 50, 75
LIVE_SLOWDOWN = re.compile(r"rank \d+ (computes|steps) \d+% slower since step \d+")


def _spin(seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


def _worker(rank: int, port: int, run_dir: str, seconds: float) -> None:
    import torch
    import torch.distributed as dist

    import goodtrace as gt
    from goodtrace.integrations.torch import instrument

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    gt.init(run_dir, rank=rank, world_size=WORLD)
    gt.detect_hangs(floor_s=0.1)
    lines = Path(run_dir) / "live-lines.txt"

    def printer(text: str) -> None:
        with lines.open("a") as out:
            out.write(text + "\n")

    instrument(log_every=10, memory=False, printer=printer)
    dist.barrier()
    start = time.monotonic()
    step = 0
    while True:
        with gt.step(step) as s:
            with gt.span("forward"):
                _spin(FORWARD_S)
            with gt.span("backward"):
                _spin(BACKWARD_S)
            loss = torch.tensor([1.0, 0.0])
            s.complete_on(loss)
        if rank == 0 and time.monotonic() - start > seconds:
            loss[1] = 1.0  # time is up: every rank stops after this step
        dist.all_reduce(loss)
        if loss[1] > 0:
            break
        if step % CHECKPOINT_EVERY == CHECKPOINT_EVERY - 1:
            with gt.span("checkpoint", category="checkpoint_save"):
                _spin((10 + step // CHECKPOINT_EVERY % 3) * (FORWARD_S + BACKWARD_S))
                torch.save({"step": step}, Path(run_dir) / f"ckpt-{rank}.pt")
        if step % EVAL_EVERY == EVAL_EVERY - 1:
            with gt.span("eval", category="eval"):
                _spin(10 * (FORWARD_S + BACKWARD_S))
                dist.all_reduce(torch.ones(1))
        step += 1
    gt.finish()
    dist.destroy_process_group()




def run(seconds: float) -> dict[str, Any]:
    from goodtrace.analysis import analyze
    from goodtrace.read.load import load_run

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        run_dir.mkdir()
        port = free_port()
        errs = [Path(tmp) / f"stderr-{r}.txt" for r in range(WORLD)]
        procs = []
        for r in range(WORLD):
            with errs[r].open("w") as err:
                procs.append(subprocess.Popen([sys.executable, __file__, "--worker", str(r), str(port), str(run_dir),
                                               str(seconds)], stdout=subprocess.DEVNULL, stderr=err))
        codes = [p.wait(timeout=seconds + 600) for p in procs]
        result = analyze(load_run(run_dir))
        lines = [x for x in (run_dir / "live-lines.txt").read_text().splitlines() if x.startswith("step ")]
        stderr = "".join(e.read_text() for e in errs)
        hang_events = sum(line.count(b'"name":"hang"') for f in run_dir.glob("rank-*/*.jsonl")
                          for line in [f.read_bytes()])
        steps = max((len(cut.exec_step) for cut in result.cuts.values()), default=0)  # per rank
        checkpoints = sum(1 for k in range(steps) if k % CHECKPOINT_EVERY == CHECKPOINT_EVERY - 1)
        evals = sum(1 for k in range(steps) if k % EVAL_EVERY == EVAL_EVERY - 1)
        return {
            "seconds": seconds, "ranks": WORLD, "exit_codes": codes, "steps": steps,
            "checkpoints": checkpoints, "evals": evals, "live_lines": len(lines),
            "hang_events": hang_events, "report_hangs": len(result.hangs),
            "report_stragglers": [(s.rank, s.reason) for s in result.stragglers],
            "report_slowdowns": [(s.rank, s.reason) for s in result.slowdowns],
            "live_slowdown_lines": sum(1 for x in lines if LIVE_SLOWDOWN.search(x)),
            "live_slowdown_examples": [f"{x.split(' | ')[0]}: {m.group(0)}" for x in lines
                                       if (m := LIVE_SLOWDOWN.search(x)) is not None][::50][:10],
            "stderr_no_progress": stderr.count("made no progress"),
            "stderr_hang_lines": stderr.count("goodtrace: hang:"),
            "goodput": result.partition.goodput,
        }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="45 s instead of 600 s (under a minute in all)")
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    seconds = args.seconds if args.seconds is not None else (45.0 if args.quick else 600.0)
    started = time.monotonic()
    result = run(seconds)
    result["wall_s"] = round(time.monotonic() - started, 1)
    result["load_average"] = os.getloadavg()[0]
    result["alarms"] = (result["hang_events"] + result["report_hangs"] + len(result["report_stragglers"])
                        + len(result["report_slowdowns"]) + result["live_slowdown_lines"]
                        + result["stderr_no_progress"] + result["stderr_hang_lines"])
    for key, value in result.items():
        print(f"{key:22s} {value}")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
