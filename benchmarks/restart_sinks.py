"""Benchmark: the training thread's cost per step with the sinks on, just after a restart of a
run with many earlier steps (issue 53, item 1).

A restarted attempt's sinks want the job's goodput so far. They used to get it by reading and
analysing the whole run directory (``load_run`` + ``analyze`` of every earlier step) on the sink
thread at the first live line, and again for the summary at ``finish()``: work that grows with
the run, competing with the training thread for the GIL and the cores. Now each attempt leaves
its own figures (``rank-NNNNN/attempts.json``, ``goodtrace.sinks._held``), read in O(attempts).

The run: an earlier attempt of ``--earlier`` steps (1,000,000; ``--quick``: 20,000) written with
``tests/helpers/builders.py``'s records, ending a few seconds ago. Then, in a fresh interpreter
as a launcher's restart would start it, an attempt with the TensorBoard, MLflow (SQLite) and
Prometheus sinks runs 100 steps (a busy loop of ``--work-ms`` each, holding the GIL like
Python-side training code, ``log_every=10``) and times each step on its training thread, and
``finish()``. The baseline, in the same run: the same attempt into a run directory without
earlier steps. ``--src`` picks the goodtrace to measure (a ``src`` folder, e.g. a worktree of
the commit before the change); the default is the one installed. Prints the mean and the worst
step time (medians over ``--rounds`` alternating rounds, 3), their ratio to the baseline,
and ``finish()``'s time; ``--json``: the last line is
one JSON object with every figure.

    python benchmarks/restart_sinks.py [--earlier 1000000] [--rounds 3] [--src PATH] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _timing import load_file

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
t_import = time.perf_counter()
import goodtrace as gt

run, work_s, steps, first = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
sinks = ["tensorboard:" + run + "-tb", "mlflow:sqlite:///" + run + "-mlflow.db", "prometheus:127.0.0.1:0"]
gt.init(run, sinks=sinks, rank=0, world_size=1, local_rank=0, finish_timeout_s=60)
times = []
for step in range(first, first + steps):
    t0 = time.perf_counter()
    with gt.step(step):
        end = t0 + work_s
        while time.perf_counter() < end:
            pass
    times.append(time.perf_counter() - t0)
t0 = time.perf_counter()
ok = gt.finish(completed=True)
finish_s = time.perf_counter() - t0
loaded = sorted(m for m in sys.modules if m.startswith(("goodtrace.read.load", "goodtrace.analysis")))
print(json.dumps({"times": times, "finish_s": finish_s, "ok": ok, "reader_loaded": bool(loaded),
                  "goodtrace": gt.__file__}))
"""


def earlier_run(run: Path, steps: int) -> float:
    """One attempt of ``steps`` 1 ms steps that ended 5 s ago; returns the seconds it took to write."""
    builders = load_file("builders", "tests/helpers/builders.py")
    started = time.perf_counter()
    step_s = 0.001
    start = (time.time_ns() - builders.WALL0) / 1e9 - steps * step_s - 10.0
    proc = builders.Proc(run, start=start)
    t = proc.loop(range(steps), start + 2.0, step_s=step_s)
    proc.finish(t, completed=False)
    proc.write(segment_lines=400_000)
    return time.perf_counter() - started


def attempt(run: Path, src: str | None, work_ms: float, steps: int, first: int) -> dict[str, Any]:
    env = dict(os.environ, GOODTRACE_SEGMENT_CACHE="0", MLFLOW_ENABLE_ASYNC_LOGGING="false")
    if src:
        env["PYTHONPATH"] = src
    out = subprocess.run([sys.executable, "-c", CHILD, str(run), str(work_ms / 1e3), str(steps), str(first)],
                         capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"the attempt failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    times = result["times"][1:]  # the first step of an attempt is start-up, not the loop
    return {"mean_step_ms": 1e3 * statistics.fmean(times), "max_step_ms": 1e3 * max(times),
            "finish_s": result["finish_s"], "finish_ok": result["ok"], "reader_loaded": result["reader_loaded"]}


def median_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    out = {key: statistics.median(r[key] for r in rounds) for key in ("mean_step_ms", "max_step_ms", "finish_s")}
    return out | {"finish_ok": all(r["finish_ok"] for r in rounds),
                  "reader_loaded": any(r["reader_loaded"] for r in rounds), "rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--earlier", type=int, default=1_000_000, help="steps of the earlier attempt")
    parser.add_argument("--steps", type=int, default=100, help="steps timed after the restart")
    parser.add_argument("--work-ms", type=float, default=5.0, help="busy work per step")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (medians)")
    parser.add_argument("--src", default=None, help="a goodtrace src folder to measure (default: installed)")
    parser.add_argument("--quick", action="store_true", help="20,000 earlier steps, 2 rounds")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the results")
    args = parser.parse_args()
    earlier_steps = 20_000 if args.quick else args.earlier
    work = Path(tempfile.mkdtemp(prefix="goodtrace-restart-sinks-"))
    try:
        fresh = work / "fresh"
        restarted = work / "restarted"
        write_s = earlier_run(restarted, earlier_steps)
        size = sum(p.stat().st_size for p in restarted.rglob("*.jsonl"))
        earlier_files = {p.name for p in restarted.rglob("*") if p.is_file()}
        rounds = 2 if args.quick else args.rounds
        bases, afters = [], []
        for _ in range(rounds):  # alternating, on a shared machine: medians of each
            shutil.rmtree(fresh, ignore_errors=True)
            bases.append(summarise(attempt(fresh, args.src, args.work_ms, args.steps, 0)))
            for extra in restarted.rglob("*"):  # back to the earlier attempt alone
                if extra.is_file() and extra.name not in earlier_files:
                    extra.unlink()
            afters.append(summarise(attempt(restarted, args.src, args.work_ms, args.steps, earlier_steps)))
        base, after = median_of(bases), median_of(afters)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results = {
        "src": args.src or "installed", "earlier_steps": earlier_steps, "earlier_mb": size / 2**20,
        "earlier_write_s": write_s, "steps": args.steps, "work_ms": args.work_ms,
        "rounds": rounds, "baseline": base, "restarted": after,
        "mean_step_ratio": after["mean_step_ms"] / base["mean_step_ms"],
        "max_step_ratio": after["max_step_ms"] / base["max_step_ms"],
    }
    print(f"goodtrace from {results['src']}; earlier attempt: {earlier_steps:,} steps ({size / 2**20:.0f} MiB)")
    for label, r in (("no earlier steps (baseline)", base), (f"{earlier_steps:,} earlier steps", after)):
        print(f"  {label:30s} mean step {r['mean_step_ms']:.3f} ms, worst {r['max_step_ms']:.2f} ms, "
              f"finish() {r['finish_s']:.2f} s (ok {r['finish_ok']}), reader loaded in the job: {r['reader_loaded']}")
    print(f"  ratio to the baseline: mean {results['mean_step_ratio']:.2f}x, worst {results['max_step_ratio']:.2f}x")
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
