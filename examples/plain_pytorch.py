"""A plain PyTorch training loop recorded with goodtrace, then goodtrace's report.

    pip install 'goodtrace[torch,report]'
    python examples/plain_pytorch.py [--steps 200] [--run-dir runs/plain_pytorch]

What each line does: ``gt.init`` starts recording into the run directory; ``instrument()``
hooks PyTorch (CUDA step times when on a GPU, memory, a live line every ``--log-every``
steps); each step is a ``gt.step`` whose end is the moment its loss is ready
(``complete_on``: observed a step later, never waited for); ``fwd_bwd`` and ``optimizer``
are spans inside it, the batch fetch before it is ``data``; every ``--checkpoint-every``
steps a checkpoint is saved inside a ``checkpoint`` span (an overhead: pending steps settle
first, so it is not charged with their device time); ``gt.finish`` closes the run. Runs on a
CPU in a few seconds; on a GPU pass ``--device cuda``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import torch

import goodtrace as gt
from goodtrace.integrations.torch import instrument


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--run-dir", default="runs/plain_pytorch")
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.utils.data.TensorDataset(torch.randn(4096, 64), torch.randn(4096, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=64, shuffle=True, drop_last=True)

    gt.init(args.run_dir)
    instrument(log_every=args.log_every, tokens_per_step=64)
    batches = iter(loader)
    checkpoints = tempfile.mkdtemp(prefix="plain_pytorch_ckpt_")
    for step in range(1, args.steps + 1):
        with gt.span("data"):  # the batch fetch, between steps
            try:
                x, y = next(batches)
            except StopIteration:
                batches = iter(loader)
                x, y = next(batches)
            x, y = x.to(args.device, non_blocking=True), y.to(args.device, non_blocking=True)
        with gt.step(step) as s:
            with gt.span("fwd_bwd"):
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
            with gt.span("optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            s.complete_on(loss.detach())  # the step is done when its loss is
            gt.metric("loss", loss.detach(), reduce="mean")
        if step % args.checkpoint_every == 0:
            with gt.span("checkpoint", category="checkpoint_save"):
                torch.save(model.state_dict(), os.path.join(checkpoints, f"step-{step}.pt"))
    gt.finish(completed=True)
    subprocess.run([sys.executable, "-m", "goodtrace", "report", args.run_dir], check=False)


if __name__ == "__main__":
    main()
