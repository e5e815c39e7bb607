"""Host-bound and input-bound loops in a real process, with the device's idle time known.

``python host_bound.py '{"shape": ..., "run_dir": ..., "out": ..., "rank": 0, "world": 1}'``
records one loop of ``SHAPES`` with the real recorder and writes to ``out`` (JSON) the ground
truth the report's host-overhead rule (docs/semantics.md 3.4) is checked against:

- ``spans``: every overhead span the loop opened, ``[category, t0, t1, step]`` on the host's
  ``perf_counter_ns`` (goodtrace's clock);
- ``busy``: when the device was busy, ``[start, end]`` intervals on the same clock: on the
  simulated device each kernel's true start and end; under JAX on the CPU, each step from when
  its input was ready (the previous step's result, or its dispatch if later) to when its result
  became ready, as a watcher thread that waits on each result in turn saw it (each step depends on
  the previous one, so they run one after another);
- ``slack_ns``: how late this machine woke a sleeping thread while the loop ran, and
  ``poll_ns``: goodtrace's readiness-poll interval, which together bound how late any sync point
  (and so the rule's bound) is dated.

A span's true cost is its overlap with the device's idle time (the complement of ``busy``).
"""

from __future__ import annotations

import json
import os
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import goodtrace as gt
from goodtrace import schema
from goodtrace.testing import SimulatedDevice
from helpers.loops import Slack, _sleep

MS = 1e-3
POLL_S = 0.002


class Truth:
    def __init__(self) -> None:
        self.spans: list[list[Any]] = []
        self.busy: list[list[int]] = []
        self.extra: dict[str, Any] = {}

    @contextmanager
    def span(self, name: str, step: int) -> Iterator[None]:
        with gt.span(name):
            t0 = time.perf_counter_ns()
            yield
            self.spans.append([schema.category_for_name(name), t0, time.perf_counter_ns(), step])


# --------------------------------------------------------------------------- simulated device


def simulated(kernel_s: Callable[[int], float], steps: int, before: Callable[[Truth, int], None],
              after: Callable[[Truth, int], None]) -> Callable[[Truth], None]:
    def loop(truth: Truth) -> None:
        device = SimulatedDevice()
        try:
            for k in range(steps):
                with gt.step(k) as s:
                    before(truth, k)
                    with gt.span("forward"):  # the host's dispatch: half a millisecond, as a framework's
                        _sleep(0.0005)
                        value = device.launch(kernel_s(k), f"step{k}")
                    s.complete_on(value)
                    after(truth, k)
            device.synchronize()
        finally:
            truth.busy = [[v["start_ns"], v["done_ns"]] for v in device.log() if v["done_ns"] is not None]
            device.close()
    return loop


def _host(name: str, seconds: float, every: Callable[[int], bool] = lambda k: True) -> Callable[[Truth, int], None]:
    def work(truth: Truth, k: int) -> None:
        if every(k):
            with truth.span(name, k):
                _sleep(seconds)
    return work


def _nothing(truth: Truth, k: int) -> None:
    pass


def _rank_data_s() -> float:
    """The input-bound loop's data loading: 50 ms on rank 0, 30 ms on rank 1, ..."""
    return (50 - 20 * int(os.environ.get("HOST_BOUND_RANK", "0"))) * MS


SIMULATED: dict[str, Callable[[Truth], None]] = {
    # 20 ms device steps, each preceded by its data loading (longer): the device waits
    "input_bound": simulated(lambda k: 0.020, 15, lambda t, k: _host("data", _rank_data_s())(t, k), _nothing),
    # 60 ms device steps; the host runs ahead: a 15 ms compile before step 6's dispatch and a
    # 10 ms log after each dispatch, both while queued device work runs
    "host_ahead": simulated(lambda k: 0.060, 12, _host("compile", 0.015, lambda k: k == 6), _host("log", 0.010)),
    # 40 ms device steps, a 5 ms batch at each step's start, a 3 ms log after each dispatch
    "device_bound": simulated(lambda k: 0.040, 12, _host("data", 0.005), _host("log", 0.003)),
}


# --------------------------------------------------------------------------- JAX on the CPU


class Watcher:
    """Waits on each step's result in turn and records when it became ready."""

    def __init__(self) -> None:
        self.ready_ns: list[int] = []
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def watch(self, value: Any) -> None:
        self._queue.put(value)

    def _run(self) -> None:
        while (value := self._queue.get()) is not None:
            value.block_until_ready()
            self.ready_ns.append(time.perf_counter_ns())

    def close(self) -> list[int]:
        self._queue.put(None)
        self._thread.join(timeout=60)
        return self.ready_ns


class JaxLoop:
    """A loop of jitted steps of about ``target_s`` on the device, calibrated (and compiled)
    before ``gt.init``, so that the run's start-up holds the process's own start only."""

    def __init__(self, steps: int, target_s: float, before: Callable[[Truth, int], None],
                 after: Callable[[Truth, int], None]) -> None:
        self.steps, self.target_s, self.before, self.after = steps, target_s, before, after

    def prepare(self, truth: Truth) -> None:
        import functools

        import jax
        import jax.numpy as jnp

        @functools.partial(jax.jit, static_argnums=(2,))
        def chain(y: Any, w: Any, depth: int) -> Any:
            return jax.lax.fori_loop(0, depth, lambda _, v: jnp.tanh(v @ w), y)

        n = 384
        self.x = jax.random.normal(jax.random.PRNGKey(0), (n, n)) * 0.1
        self.w = jax.random.normal(jax.random.PRNGKey(1), (n, n)) / n**0.5
        self.chain = chain
        chain(self.x, self.w, 20).block_until_ready()
        self.depth = max(2, round(self.target_s / (self._device_s(20) / 20)))
        truth.extra["device_s_before"] = self._device_s(self.depth)
        truth.extra["depth"] = self.depth

    def _device_s(self, depth: int) -> float:
        self.chain(self.x, self.w, depth).block_until_ready()  # compiled
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            self.chain(self.x, self.w, depth).block_until_ready()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def __call__(self, truth: Truth) -> None:
        watcher = Watcher()
        dispatched: list[int] = []
        y = self.x
        try:
            for k in range(self.steps):
                with gt.step(k) as s:
                    self.before(truth, k)
                    y = self.chain(y, self.w, self.depth)
                    loss = y[0, 0]
                    dispatched.append(time.perf_counter_ns())
                    watcher.watch(loss)
                    s.complete_on(loss)
                    self.after(truth, k)
            y.block_until_ready()
        finally:
            ready = watcher.close()
        truth.extra["device_s_after"] = self._device_s(self.depth)
        # each step ran from when its input was ready (or it was dispatched) to when it became ready
        previous = 0
        for d, r in zip(dispatched, ready, strict=True):
            truth.busy.append([max(d, previous), r])
            previous = r


def _compile_new_shape(truth: Truth, k: int) -> None:
    """Step 6 meets a new shape: a real XLA compilation of another function, on the host."""
    if k != 6:
        return
    import jax
    import jax.numpy as jnp

    with truth.span("compile", k):
        jax.jit(lambda a: jnp.sin(a) @ a.T).lower(jnp.ones((97, 89))).compile()


JAX: dict[str, Callable[[Truth], None]] = {
    # ~30 ms device steps behind 150 ms of input pipeline each
    "jax_input_bound": JaxLoop(60, 0.030, _host("data", 0.150), _nothing),
    # ~100 ms device steps; the host runs ahead (lag 2: two steps queued) and compiles a new
    # shape before step 6's dispatch
    "jax_recompile": JaxLoop(12, 0.100, _compile_new_shape, _nothing),
    # ~80 ms device steps, a 5 ms batch at each step's start and a 15 ms log after each dispatch
    "jax_device_bound": JaxLoop(14, 0.080, _host("data", 0.005), _host("log", 0.015)),
}
OPTIONS: dict[str, dict[str, Any]] = {"jax_recompile": {"lag": 2}}

SHAPES = {**SIMULATED, **JAX}


def main() -> None:
    config = json.loads(sys.argv[1])
    os.environ["HOST_BOUND_RANK"] = str(config.get("rank", 0))
    truth = Truth()
    shape = SHAPES[config["shape"]]
    if isinstance(shape, JaxLoop):
        shape.prepare(truth)
    slack = Slack()
    gt.init(config["run_dir"], rank=config.get("rank", 0), world_size=config.get("world", 1),
            poll_interval_s=POLL_S, flush_interval_s=0.2, **OPTIONS.get(config["shape"], {}))
    try:
        shape(truth)
        gt.finish(completed=True)
    finally:
        out = {"spans": truth.spans, "busy": truth.busy, "slack_ns": slack.stop(),
               "poll_ns": round(POLL_S * 1e9), **truth.extra}
        tmp = config["out"] + ".tmp"
        with open(tmp, "w") as handle:
            json.dump(out, handle)
        os.replace(tmp, config["out"])


if __name__ == "__main__":
    main()
