"""Train a small MLP with optax and a jitted step, instrumented with goodtrace; then the report.

    python examples/jax_train.py [--steps 60] [--run-dir runs/jax_train]

A checkpoint every ``--checkpoint-every`` steps (plain NumPy save), an eval every
``--eval-every`` steps. goodtrace records: each step's interval between sync points (the loss
observed one step later, when it is free), the compile spans JAX reports in step 0, the
checkpoint and eval spans (which wait for the pending step *before* they start, so they
measure only themselves), and the loss. At the end: the per-step table and the report.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax
from jax_common import (
    batches,
    evaluate,
    explain,
    make_state,
    print_report,
    save_checkpoint,
    step_table,
    train_step,
)

import goodtrace as gt
from goodtrace.integrations import jax as gt_jax


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=30)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--run-dir", default=None, help="default: a fresh temporary directory")
    args = parser.parse_args(argv)
    run_dir = args.run_dir or tempfile.mkdtemp(prefix="goodtrace-jax-")
    checkpoints = os.path.join(tempfile.mkdtemp(prefix="ckpt-"), "checkpoints")

    gt.init(run_dir)
    gt_jax.instrument(log_every=args.log_every)  # compile listeners before the first jitted call

    with gt.span("init"):
        state = make_state()
        data = batches()
        eval_data = batches(seed=2)
    for step in range(args.steps):
        with gt.step(step) as s:
            with gt.span("data"):
                x, y = next(data)
            state, loss = train_step(state, x, y)  # returns before the device ran it
            s.complete_on(loss)  # observed when step+1 ends: no added synchronisation
            gt.metric("loss", loss, reduce="mean")
        if step and step % args.checkpoint_every == 0:
            with gt.span("checkpoint", category="checkpoint_save"):
                save_checkpoint(state, checkpoints, step)
        if step and step % args.eval_every == 0:
            with gt.span("eval", category="eval"):
                eval_loss, accuracy = evaluate(state, eval_data)
            gt.metric("eval_loss", eval_loss, reduce="mean", step=step)
            gt.metric("eval_accuracy", accuracy, reduce="mean", step=step)
    jax.block_until_ready(state)
    gt.finish(completed=True)
    shutil.rmtree(os.path.dirname(checkpoints), ignore_errors=True)

    print(f"\nrun directory: {run_dir}\n\nper-step time (goodtrace, rank 0):")
    rows = step_table(run_dir)
    for step, seconds, split in rows:
        if step < 3 or split or step == rows[-1][0]:
            print(f"  step {step:4d}: {explain(seconds, split)}")
    print()
    print_report(run_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
