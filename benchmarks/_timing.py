"""What several benchmarks time the same way: one place for each loop and helper.

- :func:`live_loop_ns` — the live aggregator's loop (a data span, a compute span,
  ``complete_on`` of a host value) with one part's recorder hooks attached or detached;
- :func:`interleaved_medians` — variants run in alternating rounds on a shared machine, medians;
- :func:`instrumented_call_us` — goodtrace's calls of one instrumented step on a ready value;
- :func:`timeit_ns` — nanoseconds per iteration of a loop body, the cyclic GC paused;
- :func:`text_batches` — the demo model's batches from its text blocks (PyTorch);
- :func:`free_port` — a free TCP port on this host, for a process group's rendezvous;
- :data:`CALL_TIMER` — the source of ``timed(module, name, key)`` for child processes that
  add up the time spent in a library function (``python -c`` code strings);
- :func:`load_file` — a module of the repository outside the package (tests/helpers,
  examples) loaded from its file, without adding its folder to ``sys.path``;
- :func:`compile_package` — goodtrace's modules compiled to bytecode, as ``pip install`` does,
  before fresh processes are timed.

A benchmark imports this module as ``_timing``: its own folder is on ``sys.path`` when it runs
as ``python benchmarks/NAME.py``.
"""

from __future__ import annotations

import compileall
import gc
import importlib.util
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import goodtrace as gt

ROOT = Path(__file__).resolve().parent.parent


def live_loop_ns(n: int, detach: Callable[[Any], Iterable[tuple[str, Callable[..., None]]]] | None) -> float:
    """Nanoseconds per step of ``n`` steps with a live aggregator (a line every 10 steps, one
    process), after removing the recorder hooks ``detach(aggregator)`` names (None: none)."""
    from goodtrace.record.live.aggregator import LiveAggregator, LocalTransport

    with tempfile.TemporaryDirectory() as run_dir:
        recorder = gt.init(run_dir, record_gc=False)
        aggregator = LiveAggregator(recorder, LocalTransport(), log_every=10, printer=lambda line: None)
        if detach is not None:
            for attr, hook in detach(aggregator):
                getattr(recorder, attr).remove(hook)
        step, span = gt.step, gt.span
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter_ns()
            for k in range(n):
                with step(k) as s:
                    with span("data"):
                        pass
                    with span("forward"):
                        pass
                    s.complete_on(1.0)
            return (time.perf_counter_ns() - start) / n
        finally:
            gc.enable()
            aggregator.close()
            gt.finish()


def timeit_ns(body: Callable[[int], None], n: int) -> float:
    """Nanoseconds per iteration of ``body(n)``, with the cyclic GC paused (as timeit does): a
    loop that allocates a tuple per span would otherwise time the collections it triggers."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        body(n)
        return (time.perf_counter_ns() - start) / n
    finally:
        gc.enable()


def text_batches(data: Any, batch: int) -> Iterator[tuple[Any, Any]]:
    """Endless ``(inputs, targets)`` batches of ``batch`` consecutive items of the demo's
    ``TextBlocks``, stacked into tensors."""
    import torch

    index = 0
    while True:
        xs, ys = zip(*(data[index + j] for j in range(batch)), strict=True)
        index += batch
        yield torch.stack(xs), torch.stack(ys)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def interleaved_medians(rounds: int, variants: Mapping[str, Callable[[], float]]) -> dict[str, float]:
    """Each variant's median over ``rounds`` rounds, the variants alternating within a round
    (so a change in the machine's load falls on all of them alike)."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, run in variants.items():
            times[name].append(run())
    return {name: statistics.median(values) for name, values in times.items()}


def instrumented_call_us(run_dir: Path, steps: int, instrument: Callable[[], Any], value: Any,
                         spans: Sequence[str]) -> float:
    """goodtrace's calls of one instrumented step, in microseconds per step: ``instrument()``
    after ``gt.init``, then per step the ``spans`` (empty), ``complete_on(value)`` and a
    ``loss`` metric of ``value`` (a ready framework value: the adapter's probe and read count)."""
    gt.init(run_dir)
    instrument()
    t0 = time.perf_counter()
    for step in range(steps):
        with gt.step(step) as s:
            for name in spans:
                with gt.span(name):
                    pass
            s.complete_on(value)
            gt.metric("loss", value, "mean")
    elapsed = time.perf_counter() - t0
    gt.finish()
    return elapsed / steps * 1e6


# For child processes (``python -c``): wrap ``module.name`` so the seconds spent in it add up
# in ``spent[key]``; the child defines ``spent`` before calling ``timed``.
CALL_TIMER = r"""
def timed(module, name, key):
    inner = getattr(module, name)
    def call(*args, **kwargs):
        began = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[key] += time.perf_counter() - began
    setattr(module, name, call)
"""


def load_file(name: str, relative: str) -> ModuleType:
    """The module in file ``relative`` (to the repository root) as ``name``, loaded once."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {relative}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before it runs: its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


def compile_package() -> None:
    """Compile goodtrace's modules to bytecode (``__pycache__``), as ``pip install`` does: a
    fresh process timed here then reads them, rather than compiling every module's source
    again where nothing wrote them (``PYTHONDONTWRITEBYTECODE``, set on some machines, with
    the editable install of a checkout: about 0.25 s a process)."""
    compileall.compile_dir(str(Path(gt.__file__).parent), quiet=1)
