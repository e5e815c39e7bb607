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
- :data:`OWN_PEAK` — the source of ``own_peak_kib()`` for child processes that report their own
  peak RSS (its high-water mark, ``VmHWM``: not ``ru_maxrss``, see :func:`run_measured`);
- :func:`run_measured` — a command's wall time and peak RSS, started from a small interpreter;
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
import subprocess
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


# Linux counts in a process's ru_maxrss the peak of the process it was started from: a child
# made by vfork (as subprocess makes it) or fork shares or copies its parent's memory until it
# execs, and exec keeps that memory's high-water mark as the new program's (measured: a command
# that peaks at 11 MiB reports 811 MiB when started from a process that once held 800 MiB, even
# after it freed them). A benchmark's process grows (the runs it writes, the figures it keeps),
# so a child's own figure is its memory's high-water mark, or the ru_maxrss of a child started
# from a fresh small interpreter.
OWN_PEAK = r"""
def own_peak_kib():
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):  # not Linux: the usage, which no parent inflates there
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
"""

# a small fresh interpreter that starts the command, waits for it and writes its time and its
# peak (``ru_maxrss``, KiB: this interpreter's own peak, about 10 MiB, is all it can add)
_LAUNCH = r"""
import os, sys, time
began = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
seconds = time.perf_counter() - began
with open(sys.argv[1], "w") as handle:
    handle.write(f"{seconds} {usage.ru_maxrss}")
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_measured(cmd: Sequence[str], *, env: Mapping[str, str] | None = None, stdout: Any = None,
                 stderr: Any = None) -> tuple[float, float, int]:
    """(wall seconds, peak RSS in MiB, exit code) of ``cmd`` in a fresh process, timed from its
    start to its end (not the launcher's), its peak its own (see :data:`OWN_PEAK`)."""
    with tempfile.NamedTemporaryFile("r", suffix=".peak") as figures:
        code = subprocess.call([sys.executable, "-c", _LAUNCH, figures.name, *cmd], stdout=stdout,
                               stderr=stderr, env=None if env is None else dict(env))
        text = figures.read().split()
    if len(text) != 2:
        raise SystemExit(f"{' '.join(cmd)} could not be started ({code})")
    return float(text[0]), int(text[1]) / 1024, code


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
