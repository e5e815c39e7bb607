"""The same JAX training loop timed two ways, side by side: a host timer (what most training
scripts print) and goodtrace.

    python examples/jax_naive_vs_goodtrace.py [--steps 25]

The naive loop measures each iteration with ``time.perf_counter()`` on the host and prints the
loss every ``--log-every`` steps (``float(loss)``, which waits for the device), like a typical
script. Because a jitted step returns before the device has run it, the host timer reports
step 0 as just its compilation, the following steps as the time to dispatch them (well under
a millisecond), and then charges the whole backlog to the next step that reads a value (a log
step, or the checkpoint, which copies the state to the host). goodtrace, on the same loop,
observes each step's loss one step later and reports each step's own time, with compile and
checkpoint time split out. Batches are prefetched to the device, as input pipelines do (on
the CPU backend, host-made batches compete with the "device" for the same cores; see
BENCHMARKS.md). The two loops are two runs (the naive one first): their sums roughly agree.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax
from jax_common import batches, explain, make_state, save_checkpoint, step_table, train_step

import goodtrace as gt
from goodtrace.integrations import jax as gt_jax


def device_batches(count: int = 32) -> Iterator[tuple[Any, Any]]:
    """Batches already on the device (a prefetching input pipeline), cycled."""
    host = batches()
    return itertools.cycle([tuple(jax.device_put(a) for a in next(host)) for _ in range(count)])


def naive_loop(steps: int, log_every: int, checkpoint_at: int, checkpoints: str) -> list[float]:
    """The loop as usually written: host timer per iteration, loss read on log steps."""
    jax.clear_caches()  # compile again, as a fresh process would
    state, data = make_state(), device_batches()
    times = []
    last = time.perf_counter()
    for step in range(steps):
        x, y = next(data)
        state, loss = train_step(state, x, y)
        if (step + 1) % log_every == 0:
            print(f"  [naive] step {step}: loss {float(loss):.4f}")
        if step == checkpoint_at:
            save_checkpoint(state, checkpoints, step)
        now = time.perf_counter()
        times.append(now - last)
        last = now
    jax.block_until_ready(state)
    return times


def goodtrace_loop(steps: int, log_every: int, checkpoint_at: int, checkpoints: str, run_dir: str) -> None:
    """The same loop with goodtrace: step context, lagged completion, a checkpoint span."""
    jax.clear_caches()
    gt.init(run_dir)
    gt_jax.instrument(log_every=log_every, printer=lambda line: print(f"  [goodtrace] {line}"))
    state, data = make_state(), device_batches()
    for step in range(steps):
        with gt.step(step) as s:
            x, y = next(data)
            state, loss = train_step(state, x, y)
            s.complete_on(loss)
            gt.metric("loss", loss)
        if step == checkpoint_at:
            with gt.span("checkpoint", category="checkpoint_save"):
                save_checkpoint(state, checkpoints, step)
    jax.block_until_ready(state)
    gt.finish(completed=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--checkpoint-at", type=int, default=12)
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="goodtrace-naive-vs-")
    checkpoints, run_dir = os.path.join(work, "checkpoints"), os.path.join(work, "run")

    print("naive loop:")
    naive = naive_loop(args.steps, args.log_every, args.checkpoint_at, checkpoints)
    print("goodtrace loop:")
    goodtrace_loop(args.steps, args.log_every, args.checkpoint_at, checkpoints, run_dir)
    ours = {step: (seconds, split) for step, seconds, split in step_table(run_dir)}

    print(f"\n{'step':>4}  {'host timer':>11}  {'goodtrace':>11}  goodtrace split")
    for step in range(args.steps):
        seconds, split = ours.get(step, (float("nan"), {}))
        note = []
        if (step + 1) % args.log_every == 0:
            note.append("naive reads the loss here")
        if step == args.checkpoint_at:
            note.append("checkpoint after this step")
        print(f"{step:4d}  {naive[step] * 1e3:8.1f} ms  {seconds * 1e3:8.1f} ms  "
              f"{explain(seconds, split).split('=', 1)[1].strip()}"
              + (f"   <- {'; '.join(note)}" if note else ""))
    print(f"{'sum':>4}  {sum(naive) * 1e3:8.1f} ms  {sum(s for s, _ in ours.values()) * 1e3:8.1f} ms"
          "  (two separate runs: the sums roughly agree, the steps do not)")
    print(f"\nrun directory: {run_dir}  (goodtrace report {run_dir})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
