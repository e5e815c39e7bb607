"""Shared by the JAX examples and benchmark: a small MLP classifier trained with optax, a jitted
train step, a plain checkpoint, an eval, and a per-step table read back from a run directory.

The data is synthetic (a fixed random teacher network labels Gaussian inputs), generated on
the host each step like a real input pipeline would hand over a batch.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

INPUT, HIDDEN, CLASSES = 256, 1024, 10


class TrainState(NamedTuple):
    params: dict[str, Any]
    opt_state: Any


def init_params(key: Any, hidden: int = HIDDEN) -> dict[str, Any]:
    k1, k2, k3 = jax.random.split(key, 3)
    def dense(k: Any, fan_in: int, fan_out: int) -> dict[str, Any]:
        return {"w": jax.random.normal(k, (fan_in, fan_out)) / np.sqrt(fan_in), "b": jnp.zeros(fan_out)}
    return {"l1": dense(k1, INPUT, hidden), "l2": dense(k2, hidden, hidden), "out": dense(k3, hidden, CLASSES)}


def forward(params: dict[str, Any], x: Any) -> Any:
    h = jax.nn.gelu(x @ params["l1"]["w"] + params["l1"]["b"])
    h = jax.nn.gelu(h @ params["l2"]["w"] + params["l2"]["b"])
    return h @ params["out"]["w"] + params["out"]["b"]


def loss_fn(params: dict[str, Any], x: Any, y: Any) -> Any:
    logits = forward(params, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


OPTIMIZER = optax.adamw(1e-3)


@jax.jit
def train_step(state: TrainState, x: Any, y: Any) -> tuple[TrainState, Any]:
    loss, grads = jax.value_and_grad(loss_fn)(state.params, x, y)
    updates, opt_state = OPTIMIZER.update(grads, state.opt_state, state.params)
    return TrainState(optax.apply_updates(state.params, updates), opt_state), loss


@jax.jit
def eval_step(params: dict[str, Any], x: Any, y: Any) -> tuple[Any, Any]:
    logits = forward(params, x)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return loss, (logits.argmax(-1) == y).mean()


def make_state(seed: int = 0, hidden: int = HIDDEN) -> TrainState:
    params = init_params(jax.random.PRNGKey(seed), hidden)
    return TrainState(params, OPTIMIZER.init(params))


def batches(batch_size: int = 512, seed: int = 1) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Host batches labelled by a fixed random teacher (so the loss really goes down)."""
    rng = np.random.default_rng(seed)
    teacher = rng.standard_normal((INPUT, CLASSES)).astype(np.float32)
    while True:
        x = rng.standard_normal((batch_size, INPUT)).astype(np.float32)
        yield x, (x @ teacher).argmax(-1).astype(np.int32)


def save_checkpoint(state: TrainState, directory: str, step: int) -> str:
    """A plain checkpoint: every leaf copied to the host and written with NumPy."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"step_{step:06d}.npz")
    leaves = jax.tree_util.tree_leaves(state)
    np.savez(path, *[np.asarray(leaf) for leaf in leaves])
    return path


def evaluate(state: TrainState, data: Iterator[tuple[np.ndarray, np.ndarray]], batches_n: int = 4) -> tuple[float, float]:
    losses, accuracies = [], []
    for _ in range(batches_n):
        x, y = next(data)
        loss, accuracy = eval_step(state.params, x, y)
        losses.append(float(loss))
        accuracies.append(float(accuracy))
    return statistics.fmean(losses), statistics.fmean(accuracies)


# ----------------------------------------------------------------------------- reading back


def step_table(run_dir: str) -> list[tuple[int, float, dict[str, float]]]:
    """(step, step time s, overhead s per category) of rank 0's last attempt: goodtrace's own
    step table (``goodtrace report --json`` shows the same rows): step k's interval is
    (T_{k-1}, T_k] between sync points, its overhead split out."""
    from goodtrace.analysis import analyze
    from goodtrace.read.load import load_run

    rows = analyze(load_run(run_dir)).steps
    last = max((r.attempt for r in rows), default=0)
    return [(r.step, r.step_time_s, dict(r.overhead_s)) for r in rows if r.attempt == last]


def explain(seconds: float, split: dict[str, float]) -> str:
    train = seconds - sum(split.values())
    parts = [f"{train * 1e3:.1f} train"] + [f"{v * 1e3:.1f} {k}" for k, v in sorted(split.items()) if v >= 5e-5]
    return f"{seconds * 1e3:8.1f} ms = " + " + ".join(parts)


def print_report(run_dir: str) -> None:
    """The full console report (``goodtrace report RUN``)."""
    from goodtrace.analysis import analyze
    from goodtrace.read.load import load_run
    from goodtrace.renderers.console import render_console

    render_console(analyze(load_run(run_dir)))
