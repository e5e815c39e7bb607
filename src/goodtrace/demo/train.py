"""One rank of the demo job: ``python -m goodtrace.demo.train RUN_DIR [options]``.

Started by :mod:`goodtrace.demo.launcher` with torchrun-style variables (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``TORCHELASTIC_RESTART_COUNT``). Trains the
demo GPT with DistributedDataParallel over gloo, resuming from the newest checkpoint in
``RUN_DIR/checkpoints``; saves every ``--checkpoint-every`` steps, evaluates every
``--eval-every`` steps, and with ``--crash-at N`` the last rank dies right after step N.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, Sampler

import goodtrace as gt
from goodtrace.demo.model import GPT, GPTConfig
from goodtrace.integrations.torch import instrument, measure_flops

CORPUS = Path(__file__).with_name("corpus.txt")
CRASH_EXIT_CODE = 17


class CharCorpus:
    """The corpus as character ids, split into training and validation text."""

    def __init__(self, text: str, validation_fraction: float = 0.1) -> None:
        self.alphabet = sorted(set(text))
        index = {c: i for i, c in enumerate(self.alphabet)}
        ids = torch.tensor([index[c] for c in text], dtype=torch.long)
        cut = int(len(ids) * (1 - validation_fraction))
        self.train, self.validation = ids[:cut], ids[cut:]


class TextBlocks(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Item ``i``: a block of ``block + 1`` characters at a pseudo-random, reproducible offset."""

    def __init__(self, ids: torch.Tensor, block: int) -> None:
        if len(ids) <= block + 1:
            raise ValueError(f"text of {len(ids)} characters is too short for blocks of {block}")
        self.ids, self.block = ids, block
        self.span = len(ids) - block - 1

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = (index * 2654435761) % self.span
        chunk = self.ids[start: start + self.block + 1]
        return chunk[:-1], chunk[1:]


class StepBatches(Sampler[list[int]]):
    """The batches of steps ``first..last`` for one rank: resuming at a step gives the same data."""

    def __init__(self, first: int, last: int, rank: int, world: int, batch: int) -> None:
        self.first, self.last, self.rank, self.world, self.batch = first, last, rank, world, batch

    def __len__(self) -> int:
        return max(0, self.last - self.first + 1)

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.first, self.last + 1):
            base = (step * self.world + self.rank) * self.batch
            yield list(range(base, base + self.batch))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m goodtrace.demo.train")
    parser.add_argument("run_dir")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--crash-at", type=int, default=None)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--eval-every", type=int, default=15)
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--workers", type=int, default=1)
    return parser.parse_args(argv)


def _latest_checkpoint(directory: Path) -> Path | None:
    found = sorted(directory.glob("step-*.pt"))
    return found[-1] if found else None


def _evaluate(model: torch.nn.Module, data: TextBlocks, batch: int, batches: int = 4) -> float:
    model.eval()
    total = torch.zeros(())
    with torch.no_grad():
        for b in range(batches):
            x, y = zip(*(data[b * batch + j] for j in range(batch)), strict=True)
            _, loss = model(torch.stack(x), torch.stack(y))
            total += loss
    model.train()
    average = total / batches
    dist.all_reduce(average)
    return float(average) / dist.get_world_size()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    run_dir = Path(args.run_dir)
    checkpoints = run_dir / "checkpoints"
    gt.init(run_dir, rank=rank, world_size=world)

    with gt.span("init"):
        dist.init_process_group(
            "gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
            rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60),
        )
        corpus = CharCorpus(CORPUS.read_text(encoding="utf-8"))
        config = GPTConfig(vocab_size=len(corpus.alphabet))
        model = GPT(config)
        train_blocks = TextBlocks(corpus.train, config.block_size)
        validation_blocks = TextBlocks(corpus.validation, config.block_size)
        sample_x, sample_y = (torch.stack(t) for t in zip(*(train_blocks[i] for i in range(args.batch)), strict=True))
        flops = measure_flops(model, sample_x, sample_y)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    start = 0
    latest = _latest_checkpoint(checkpoints)
    if latest is not None:
        with gt.span("checkpoint_restore", category="checkpoint_restore", attrs={"path": latest.name}):
            state: dict[str, Any] = torch.load(latest, map_location="cpu", weights_only=True)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start = int(state["step"])
        if rank == 0:
            print(f"attempt {attempt}: restored {latest.name}, resuming after step {start}", flush=True)
    ddp = DistributedDataParallel(model)
    instrument(log_every=args.log_every, tokens_per_step=args.batch * config.block_size, flops_per_step=flops)
    if rank == 0 and attempt == 0:
        print(f"model: {model.parameter_count():,} parameters, {flops / 1e9:.2f} GFLOP per step per rank, "
              f"{world} ranks", flush=True)
    loader = DataLoader(
        train_blocks, batch_sampler=StepBatches(start + 1, args.steps, rank, world, args.batch),
        num_workers=args.workers,
        multiprocessing_context="fork" if args.workers and sys.platform.startswith("linux") else None,
    )
    batches = iter(loader)
    for step in range(start + 1, args.steps + 1):
        with gt.step(step) as s:
            with gt.span("data"):
                x, y = next(batches)
            with gt.span("forward"):
                _, loss = ddp(x, y)
            with gt.span("backward"):
                loss.backward()
            with gt.span("optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            s.complete_on(loss)
            gt.metric("loss", loss.detach(), "mean")
        if args.crash_at == step and rank == world - 1:
            print(f"rank {rank}: injected crash after step {step}", file=sys.stderr, flush=True)
            os._exit(CRASH_EXIT_CODE)  # like a node failure: no clean-up, no finish record
        if step % args.checkpoint_every == 0:
            with gt.span("checkpoint", category="checkpoint_save", attrs={"step": step}):
                if rank == 0:
                    checkpoints.mkdir(parents=True, exist_ok=True)
                    target = checkpoints / f"step-{step:06d}.pt"
                    temporary = target.with_suffix(".tmp")
                    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                               temporary)
                    os.replace(temporary, target)
                dist.barrier()
        if step % args.eval_every == 0:
            with gt.span("eval", category="eval"):
                validation_loss = _evaluate(model, validation_blocks, args.batch)
            gt.metric("validation_loss", validation_loss, "mean", step=step)
            if rank == 0:
                print(f"eval after step {step}: validation loss {validation_loss:.4f}", flush=True)
    gt.finish(completed=True)
    del ddp  # DDP's reducer gone and every rank here before the group goes (a gloo rank that
    dist.barrier()  # tears it down while others still talk to it can abort at exit)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
