"""Overhead of goodtrace on the JAX example's jitted training loop, against the same loop
without goodtrace, interleaved in one run.

The loop is ``examples/jax_common.py``'s MLP + optax step (jitted; CPU backend here). A jitted
step returns before the device has run it, so per-step host times mean nothing: each block of
``--block`` steps is timed as a whole, ending with ``block_until_ready`` on the state, and
divided by its steps. Without goodtrace the loop reads its loss every ``--log-every`` steps
(``float(loss)``), as a script that logs does; with goodtrace it has a step context, a
``data`` span, ``complete_on(loss)``, a loss metric (read with the lag),
``integrations.jax.instrument()`` (compile listeners, live line every ``--log-every`` steps,
printed nowhere) and the writer thread. Blocks alternate, the order flipping every round.
Reported: median per-step time of each, the overhead from the per-round paired ratios, and
the direct cost of goodtrace's calls per step on an already-computed JAX scalar (no model),
which is far less noisy on a shared machine.

A third loop, without goodtrace, waits for the previous step's loss every step by hand (the
synchronisation pattern of lag 1), to tell goodtrace's cost from the cost of that pattern.
Two input pipelines are measured, because on the CPU backend the "device" is the same two
cores the host uses: ``host`` batches are made with NumPy each step (the example as written),
``device`` batches were put on the device beforehand. With host batches any loop that waits
for its previous step every step (goodtrace's lag 1, or by hand) loses throughput against one
that waits every 10 steps, whoever does the waiting; with device batches it does not.

    python benchmarks/jax_overhead.py [--rounds 8] [--block 40] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

import goodtrace as gt
from _timing import instrumented_call_us, load_file
from goodtrace.integrations import jax as gt_jax

_example = load_file("jax_common", "examples/jax_common.py")  # the examples' model and step
batches, make_state, train_step = _example.batches, _example.make_state, _example.train_step
TrainState = Any  # examples/jax_common.py's, loaded from its file: not a type mypy sees

Data = Iterator[Any]


def plain_block(state: TrainState, data: Data, steps: int, log_every: int,
                wait_every_step: bool = False) -> tuple[TrainState, float]:
    """Without goodtrace. ``wait_every_step``: wait for the previous step's loss after
    dispatching each step, by hand: goodtrace's synchronisation pattern, without goodtrace."""
    t0 = time.perf_counter()
    previous = None
    for step in range(steps):
        x, y = next(data)
        state, loss = train_step(state, x, y)
        if wait_every_step:
            if previous is not None:
                previous.block_until_ready()
            previous = loss
        elif (step + 1) % log_every == 0:
            float(loss)  # the loop reads its loss to log it
    jax.block_until_ready(state)  # type: ignore[no-untyped-call]
    return state, (time.perf_counter() - t0) / steps


def traced_block(state: TrainState, data: Data, steps: int, log_every: int, run_dir: Path,
                 first: int, lag: int, complete_every: int) -> tuple[TrainState, float]:
    gt.init(run_dir, lag=lag)
    gt_jax.instrument(log_every=log_every, printer=lambda line: None)
    t0 = time.perf_counter()
    for step in range(first, first + steps):
        with gt.step(step) as s:
            with gt.span("data"):
                x, y = next(data)
            state, loss = train_step(state, x, y)
            if (step + 1) % complete_every == 0:  # 1: every step; N: sparse completion
                s.complete_on(loss)
                gt.metric("loss", loss, "mean")
    jax.block_until_ready(state)  # type: ignore[no-untyped-call]
    elapsed = time.perf_counter() - t0
    gt.finish()
    return state, elapsed / steps


def call_cost_us(run_dir: Path, steps: int) -> float:
    """goodtrace's calls of one instrumented step on a ready JAX scalar: microseconds per step
    (includes the JAX adapter's readiness probe, wait and the metric's device-to-host read)."""
    return instrumented_call_us(run_dir, steps, lambda: gt_jax.instrument(log_every=10, printer=lambda line: None),
                                jnp.zeros(()).block_until_ready(), ("data",))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--block", type=int, default=40)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--lag", type=int, default=1, help="goodtrace's completion lag (steps)")
    parser.add_argument("--complete-every", type=int, default=1,
                        help="complete_on(loss) and the loss metric every N steps (sparse completion)")
    parser.add_argument("--quick", action="store_true", help="4 rounds of 20 steps (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.block = 4, 20
    state = make_state(hidden=args.hidden)
    host = batches()
    device = itertools.cycle([tuple(jax.device_put(a) for a in next(host)) for _ in range(16)])
    state, _ = plain_block(state, host, 5, args.log_every)  # compile and warm up
    figures: dict[str, Any] = {
        "benchmark": "jax_overhead", "jax": jax.__version__, "backend": jax.default_backend(),
        "rounds": args.rounds, "block": args.block, "hidden": args.hidden, "lag": args.lag,
        "complete_every": args.complete_every,
    }
    print(f"jax {jax.__version__} ({jax.default_backend()}), MLP 256-{args.hidden}-{args.hidden}-10 + adamw, "
          f"batch 512, {args.rounds} rounds x {args.block} steps each way per pipeline, lag {args.lag}, "
          f"complete_on every {args.complete_every} step(s)")
    with tempfile.TemporaryDirectory(prefix="goodtrace-bench-") as tmp:
        for pipeline, data in (("host", host), ("device", device)):
            plain: list[float] = []
            traced: list[float] = []
            by_hand: list[float] = []
            ratios: list[float] = []
            for round_index in range(args.rounds):
                order = ("plain", "traced") if round_index % 2 == 0 else ("traced", "plain")
                block: dict[str, float] = {}
                for which in order:
                    if which == "plain":
                        state, block[which] = plain_block(state, data, args.block, args.log_every)
                    else:
                        state, block[which] = traced_block(
                            state, data, args.block, args.log_every, Path(tmp) / f"{pipeline}-{round_index}",
                            first=round_index * args.block, lag=args.lag, complete_every=args.complete_every,
                        )
                state, waiting = plain_block(state, data, args.block, args.log_every, wait_every_step=True)
                by_hand.append(waiting)
                plain.append(block["plain"])
                traced.append(block["traced"])
                ratios.append(block["traced"] / block["plain"])
            plain_median, traced_median = statistics.median(plain), statistics.median(traced)
            overhead = 100 * (statistics.median(ratios) - 1)
            by_hand_median = statistics.median(by_hand)
            print(f"[{pipeline} batches] median step without goodtrace {plain_median * 1e3:7.2f} ms, with "
                  f"{traced_median * 1e3:7.2f} ms; paired overhead {overhead:+.2f}% "
                  f"(rounds {100 * (min(ratios) - 1):+.1f}% .. {100 * (max(ratios) - 1):+.1f}%); "
                  f"no goodtrace but waiting every step by hand {by_hand_median * 1e3:7.2f} ms")
            figures[f"{pipeline}_wait_by_hand_median_ms"] = by_hand_median * 1e3
            figures[f"{pipeline}_plain_median_ms"] = plain_median * 1e3
            figures[f"{pipeline}_traced_median_ms"] = traced_median * 1e3
            figures[f"{pipeline}_overhead_paired_pct"] = overhead
            figures[f"{pipeline}_overhead_round_min_pct"] = 100 * (min(ratios) - 1)
            figures[f"{pipeline}_overhead_round_max_pct"] = 100 * (max(ratios) - 1)
        cost = call_cost_us(Path(tmp) / "calls", 2_000 if args.quick else 10_000)
    step_ms = figures["device_plain_median_ms"]
    print(f"goodtrace calls per step, no model: {cost:8.2f} us = {100 * cost / 1e3 / step_ms:.3f}% "
          "of the median step (device batches)")
    figures["calls_us_per_step"] = cost
    figures["calls_pct_of_step"] = 100 * cost / 1e3 / step_ms
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
