"""A small loop that logs through torchtitan's own structured logger (its real API, on CPU),
run as one process per rank, so that the files are torchtitan's own."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

STEPS = 12  # the straggler rule needs 8 sampled steps or more
SLOW_RANK = 1  # its fwd_bwd takes longer: the straggler

LOOP = """
import os, sys, time
rank, out, start = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
from torchtitan.observability import structured_logger as sl
sl.init_structured_logger(source="training", output_dir=out, rank=rank)
while time.time() < start:  # every rank starts together, as in one job
    time.sleep(0.001)
sl.log_trace_instant("training_start")
with sl.log_trace_span("model_parallelism_init"):
    time.sleep(0.01)
for step in range(1, STEPS + 1):
    sl.set_step(step)
    with sl.log_trace_span("step"):
        if step == 3:
            with sl.log_trace_span("gc_collect"):
                sl.add_step_tag("gc")
                time.sleep(0.003)
        with sl.log_trace_span("fetching_batch"):
            time.sleep(0.002)
        sl.log_trace_scalar({"local_valid_tokens": 128 + rank})
        with sl.log_trace_span("fwd_bwd"):
            time.sleep(0.010 + (0.010 if rank == SLOW_RANK else 0))
        with sl.log_trace_span("optim"):
            time.sleep(0.002)
        if step == 4:
            with sl.log_trace_span("checkpoint_save"):
                sl.add_step_tag("checkpoint_save")
                time.sleep(0.03)
with sl.log_trace_span("torch_distributed_teardown"):
    pass
"""


def write_logs(out: Path, ranks: int = 2, extra_env: dict[str, str] | None = None) -> None:
    """torchtitan's structured logs of a ``ranks``-rank loop under ``out/structured_logs``."""
    code = f"STEPS, SLOW_RANK = {STEPS}, {SLOW_RANK}\n" + LOOP
    start = time.time() + 8.0  # after every process has imported torch
    env = dict(os.environ, **(extra_env or {}))
    procs = [subprocess.Popen([sys.executable, "-c", code, str(rank), str(out), str(start)],
                              env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)))
             for rank in range(ranks)]
    for proc in procs:
        assert proc.wait(timeout=120) == 0


TRAINER = """
import sys, time
import torch
from torchtitan.observability import structured_logger as sl

out = sys.argv[1]
sl.init_structured_logger(source="training", output_dir=out, rank=0)


class Trainer:  # the shape of torchtitan's Trainer.train_step: spans, scalars, model_parts
    def __init__(self):
        torch.manual_seed(0)
        self.model_parts = [torch.nn.Linear(8, 1)]
        self.optimizer = torch.optim.SGD(self.model_parts[0].parameters(), lr=0.1)
        self.losses = []

    @sl.log_trace_span("fwd_bwd")
    def forward_backward_step(self, x, y):
        loss = torch.nn.functional.mse_loss(self.model_parts[0](x), y)
        loss.backward()
        return loss

    def train_step(self, step):
        with sl.log_trace_span("fetching_batch"):
            x, y = torch.randn(16, 8), torch.randn(16, 1)
        sl.log_trace_scalar({"local_valid_tokens": 16})
        loss = self.forward_backward_step(x, y).detach()
        with sl.log_trace_span("optim"):
            self.optimizer.step()
            self.optimizer.zero_grad()
        with sl.log_trace_span("collect_dist_metrics"):
            global_avg_loss = float(loss.item())
        self.losses.append(global_avg_loss)


trainer = Trainer()
sl.log_trace_instant("training_start")
for step in range(1, STEPS + 1):
    sl.set_step(step)
    with sl.log_trace_span("step"):
        if step == 2:
            with sl.log_trace_span("gc_collect"):
                sl.add_step_tag("gc")
        trainer.train_step(step)
        if step == 4:
            with sl.log_trace_span("checkpoint_save"):
                sl.add_step_tag("checkpoint_save")
                time.sleep(0.02)
with sl.log_trace_span("torch_distributed_teardown"):
    pass
print(" ".join(repr(v) for v in trainer.losses))
"""


def run_trainer(out: Path, run_dir: Path) -> list[float]:
    """torchtitan's logger with its JSONL handler and goodtrace's; returns the logged losses."""
    handlers = ("torchtitan.observability.structured_logger.jsonl_handler.register_jsonl_handler,"
                "goodtrace.integrations.torchtitan.register_handler")
    env = dict(os.environ, TITAN_STRUCT_LOGGER_HANDLERS=handlers, GOODTRACE_RUN_DIR=str(run_dir))
    done = subprocess.run([sys.executable, "-c", f"STEPS = {STEPS}\n" + TRAINER, str(out)], env=env,
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    return [float(v) for v in done.stdout.split()]
