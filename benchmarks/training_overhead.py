"""Training overhead of goodtrace on the demo model: step time with recording fully enabled
against the same loop without goodtrace, interleaved in one run.

Enabled means: spans around data / forward / backward / optimizer, ``complete_on(loss)``, a
loss metric, the torch integration (memory every log step, live aggregation with a line every
``--log-every`` steps) and the writer thread flushing to a run directory. Blocks of
``--block`` steps alternate between the two loops (the order flips every round) so drift in
machine load hits both alike. Reported: the median step time of each, the overhead from the
per-round paired medians, and the direct cost of goodtrace's calls per step (the same call
sequence with no model), which is far less noisy on a shared machine.

    python benchmarks/training_overhead.py [--rounds 10] [--block 60] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch

import goodtrace as gt
from _timing import instrumented_call_us, text_batches
from goodtrace.demo.model import GPT, GPTConfig
from goodtrace.demo.train import CORPUS, CharCorpus, TextBlocks
from goodtrace.integrations.torch import instrument


def plain_block(model: GPT, optimizer: torch.optim.Optimizer, data: Iterator[tuple[torch.Tensor, torch.Tensor]],
                steps: int) -> list[float]:
    times: list[float] = []
    for _ in range(steps):
        t0 = time.perf_counter()
        x, y = next(data)
        _, loss = model(x, y)
        assert loss is not None
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if len(times) % 10 == 0:
            float(loss.detach())  # the loop reads its loss to log it, as the instrumented one does
        times.append(time.perf_counter() - t0)
    return times


def traced_block(model: GPT, optimizer: torch.optim.Optimizer, data: Iterator[tuple[torch.Tensor, torch.Tensor]],
                 steps: int, run_dir: Path, log_every: int, first: int) -> list[float]:
    gt.init(run_dir)
    instrument(log_every=log_every, tokens_per_step=512, flops_per_step=1e9, printer=lambda line: None)
    times = []
    for step in range(first, first + steps):
        t0 = time.perf_counter()
        with gt.step(step) as s:
            with gt.span("data"):
                x, y = next(data)
            with gt.span("forward"):
                _, loss = model(x, y)
                assert loss is not None
            with gt.span("backward"):
                loss.backward()
            with gt.span("optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            s.complete_on(loss)
            gt.metric("loss", loss.detach(), "mean")
        times.append(time.perf_counter() - t0)
    gt.finish()
    return times


def call_cost_us(run_dir: Path, steps: int = 20_000) -> float:
    """goodtrace's calls of one instrumented step (four spans, completion, a metric) on a ready
    tensor: microseconds per step."""
    return instrumented_call_us(
        run_dir, steps,
        lambda: instrument(log_every=10, tokens_per_step=512, flops_per_step=1e9, printer=lambda line: None),
        torch.zeros(()), ("data", "forward", "backward", "optimizer"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block", type=int, default=60)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="4 rounds of 30 steps (well under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.block = 4, 30
    torch.set_num_threads(1)
    torch.manual_seed(0)
    corpus = CharCorpus(CORPUS.read_text(encoding="utf-8"))
    model = GPT(GPTConfig(vocab_size=len(corpus.alphabet)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = text_batches(TextBlocks(corpus.train, model.config.block_size), 8)
    plain_block(model, optimizer, data, args.warmup)
    plain: list[float] = []
    traced: list[float] = []
    ratios: list[float] = []
    with tempfile.TemporaryDirectory(prefix="goodtrace-bench-") as tmp:
        for round_index in range(args.rounds):
            run_dir = Path(tmp) / f"round-{round_index}"
            order = ("plain", "traced") if round_index % 2 == 0 else ("traced", "plain")
            block: dict[str, list[float]] = {}
            for which in order:
                if which == "plain":
                    block[which] = plain_block(model, optimizer, data, args.block)
                else:
                    block[which] = traced_block(model, optimizer, data, args.block, run_dir, args.log_every,
                                                first=round_index * args.block + 1)
            plain += block["plain"]
            traced += block["traced"]
            ratios.append(statistics.median(block["traced"]) / statistics.median(block["plain"]))
        cost = call_cost_us(Path(tmp) / "calls")
    plain_median, traced_median = statistics.median(plain), statistics.median(traced)
    print(f"torch {torch.__version__}, {model.parameter_count():,} parameters, batch 8 x {model.config.block_size} "
          f"tokens, 1 thread, {args.rounds} rounds x {args.block} steps each way")
    print(f"median step time without goodtrace: {plain_median * 1e3:8.3f} ms")
    print(f"median step time with goodtrace:    {traced_median * 1e3:8.3f} ms")
    print(f"overhead, paired per-round medians: {100 * (statistics.median(ratios) - 1):+.2f}% "
          f"(rounds range {100 * (min(ratios) - 1):+.1f}% .. {100 * (max(ratios) - 1):+.1f}%)")
    print(f"goodtrace calls per step, no model: {cost:8.2f} us = {100 * cost / 1e6 / plain_median:.3f}% "
          "of the median step")
    if args.json:
        print(json.dumps({
            "benchmark": "training_overhead", "rounds": args.rounds, "block": args.block,
            "plain_median_ms": plain_median * 1e3, "traced_median_ms": traced_median * 1e3,
            "overhead_paired_pct": 100 * (statistics.median(ratios) - 1),
            "overhead_round_min_pct": 100 * (min(ratios) - 1), "overhead_round_max_pct": 100 * (max(ratios) - 1),
            "calls_us_per_step": cost, "calls_pct_of_step": 100 * cost / 1e6 / plain_median,
        }))


if __name__ == "__main__":
    main()
