"""Sink overhead on the demo model: the training thread's step time with each metric sink on
against the same recorded loop with no sink, interleaved in one run.

Every block records the same way (spans, ``complete_on(loss)``, a loss metric, the torch
integration with a live line every ``--log-every`` steps); the only difference is the sinks
given to ``gt.init``: none (the baseline), TensorBoard, W&B (offline), MLflow (sqlite) or
Prometheus (an exporter on 127.0.0.1). Blocks are ``--block`` steps;
opening and closing a sink (and its summary at ``finish()``) happen outside the timed steps,
and each backend is imported once before the rounds (a job pays that once, on the sink's
thread). Each round runs, per sink, a baseline block and a sink block side by side, the order
flipping every round, so drift in machine load hits both alike. Reported per sink: the median
step time, the overhead as the median over rounds of the paired difference to its baseline
block (with its range over rounds: the noise), and the direct cost on the training thread of
handing one live line to the sinks (a queue put). ``gt.init`` waits for the sinks to open
(their library's run, file or server: up to 30 s), since a backend setting itself up on its
thread while the loop runs competes with it for the GIL; reported: ``gt.init``'s time with the
sink against without, and any steps that still ran while a sink was opening (their count and
median step time against the baseline; the paired figures count only steps after).

    python benchmarks/sink_overhead.py [--rounds 6] [--block 80] [--log-every 10] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

import goodtrace as gt
from _timing import text_batches
from goodtrace.demo.model import GPT, GPTConfig
from goodtrace.demo.train import CORPUS, CharCorpus, TextBlocks
from goodtrace.integrations.torch import instrument

SINKS = ("tensorboard", "wandb", "mlflow", "prometheus")
BACKENDS = {"tensorboard": "tensorboardX", "wandb": "wandb", "mlflow": "mlflow", "prometheus": "prometheus_client"}




def make_sink(kind: str, where: Path) -> Any:
    if kind == "tensorboard":
        from goodtrace.sinks.tensorboard import TensorBoardSink

        return TensorBoardSink(where / "tb")
    if kind == "wandb":
        from goodtrace.sinks.wandb import WandbSink

        return WandbSink("goodtrace-bench", mode="offline", dir=where)
    if kind == "mlflow":
        from goodtrace.sinks.mlflow import MlflowSink

        return MlflowSink(f"sqlite:///{where / 'mlflow.db'}")
    from goodtrace.sinks.prometheus import PrometheusSink

    return PrometheusSink(0)


def block(model: GPT, optimizer: torch.optim.Optimizer, data: Iterator[tuple[torch.Tensor, torch.Tensor]],
          steps: int, run_dir: Path, sinks: list[Any], log_every: int) -> tuple[list[float], list[float], float]:
    """(step times while a sink was still opening, step times after, seconds ``gt.init`` took):
    ``steps`` steps are timed after every sink opened, however many it took to get there."""
    t_init = time.perf_counter()
    gt.init(run_dir, sinks=sinks)  # waits (up to 30 s) for the sinks to open
    init_s = time.perf_counter() - t_init
    instrument(log_every=log_every, memory=False, clock_sync_every=0, printer=lambda _: None)
    hub = getattr(gt.recorder(), "sink_hub", None)
    opening: list[float] = []
    steady: list[float] = []
    step = 0
    while len(steady) < steps:
        step += 1
        ready = hub is None or all(w.opened or w.dropped for w in hub.workers)
        t0 = time.perf_counter()
        with gt.step(step) as s:
            with gt.span("data"):
                x, y = next(data)
            _, loss = model(x, y)
            assert loss is not None
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            s.complete_on(loss)
            gt.metric("loss", loss.detach(), "mean")
        (steady if ready else opening).append(time.perf_counter() - t0)
    gt.finish()
    return opening, steady, init_s


def direct_cost(sinks: list[Any], run_dir: Path, lines: int) -> float:
    """Seconds the training thread spends handing one live line to the sinks (a queue put each)."""
    gt.init(run_dir, sinks=sinks)
    integration = instrument(log_every=1, memory=False, clock_sync_every=0, printer=lambda _: None)
    aggregator = integration.aggregator
    for step in range(1, 4):
        with gt.step(step):
            gt.metric("loss", 1.0, "mean")
    line = aggregator.lines[-1] if aggregator is not None and aggregator.lines else None
    hub = gt.recorder().sink_hub  # type: ignore[union-attr]
    cost = float("nan")
    if line is not None and hub is not None:
        t0 = time.perf_counter_ns()
        for _ in range(lines):
            hub.on_line(line)
        cost = (time.perf_counter_ns() - t0) / 1e9 / lines
    gt.finish()
    return cost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--block", type=int, default=80, help="steps per block")
    parser.add_argument("--log-every", type=int, default=10, help="a live line every N steps (the demo's 10)")
    parser.add_argument("--sinks", default=",".join(SINKS), help="which sinks to measure (comma-separated)")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 20 steps (about a minute)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the results")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.block = 2, 20
    kinds = [k.strip() for k in args.sinks.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in SINKS]
    if unknown:
        parser.error(f"unknown sink(s) {', '.join(unknown)}; choose from {', '.join(SINKS)}")
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    warnings.simplefilter("ignore")  # libraries' deprecation chatter is not what is measured
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    corpus = CharCorpus(CORPUS.read_text(encoding="utf-8"))
    model = GPT(GPTConfig(vocab_size=len(corpus.alphabet)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    data = text_batches(TextBlocks(corpus.train, model.config.block_size), 8)
    medians: dict[str, list[float]] = {kind: [] for kind in kinds}
    baselines: dict[str, list[float]] = {kind: [] for kind in kinds}
    opening: dict[str, list[float]] = {kind: [] for kind in kinds}
    open_s: dict[str, list[float]] = {kind: [] for kind in kinds}
    init_none: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        block(model, optimizer, data, 10, root / "warmup", [], args.log_every)  # allocations
        for kind in kinds:  # import each backend once, as a job does at start-up, outside the timing
            importlib.import_module(BACKENDS[kind])
        for round_index in range(args.rounds):
            for kind in kinds:  # each sink's block beside a baseline block, the order flipping per round
                where = root / f"r{round_index}-{kind}"
                pair = [("none", []), (kind, [make_sink(kind, where)])]
                for label, sinks in pair if round_index % 2 == 0 else pair[::-1]:
                    before, times, opened = block(model, optimizer, data, args.block, where / f"run-{label}", sinks,
                                                  args.log_every)
                    if label == "none":
                        baselines[kind].append(statistics.median(times))
                        init_none.append(opened)
                    else:
                        medians[kind].append(statistics.median(times))
                        opening[kind].extend(before)
                        open_s[kind].append(opened)
        costs = {kind: direct_cost([make_sink(kind, root / f"direct-{kind}")], root / f"direct-{kind}-run", 200)
                 for kind in kinds}
    baseline = statistics.median([t for kind in kinds for t in baselines[kind]])
    results: dict[str, Any] = {"baseline_step_s": baseline, "rounds": args.rounds, "block": args.block,
                               "log_every": args.log_every, "sinks": {}}
    print(f"baseline (no sink): median step {baseline * 1e3:.2f} ms over {args.rounds} rounds x {len(kinds)} blocks "
          f"of {args.block} steps, a live line every {args.log_every} steps")
    init_base = statistics.median(init_none)
    results["init_s"] = init_base
    print(f"gt.init without a sink: {init_base * 1e3:.1f} ms")
    print(f"{'sink':<12} {'step':>9} {'paired overhead (range over rounds)':>37} {'hand-off/line':>14} "
          f"{'gt.init':>9} {'steps while opening':>22}")
    for kind in kinds:
        diffs = [(w - b) / b for w, b in zip(medians[kind], baselines[kind], strict=True)]
        median_step = statistics.median(medians[kind])
        during = statistics.median(opening[kind]) if opening[kind] else None
        results["sinks"][kind] = {
            "step_s": median_step, "ratio": median_step / baseline, "paired_overhead": statistics.median(diffs),
            "paired_min": min(diffs), "paired_max": max(diffs), "handoff_s": costs[kind],
            "init_s": statistics.median(open_s[kind]), "opening_steps": len(opening[kind]),
            "opening_step_s": during, "opening_ratio": None if during is None else during / baseline,
        }
        opening_text = "none" if during is None else f"{len(opening[kind])}, {during / baseline:.2f}x"
        print(f"{kind:<12} {median_step * 1e3:6.2f} ms {100 * statistics.median(diffs):+8.2f}% "
              f"({100 * min(diffs):+.1f}% .. {100 * max(diffs):+.1f}%){'':>6} {costs[kind] * 1e6:9.2f} us "
              f"{statistics.median(open_s[kind]):7.2f} s {opening_text:>22}")
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
