"""Test helpers: a fake clock, a simulated asynchronous device, and record capture.

``SimulatedDevice`` behaves like a GPU/TPU stream: ``launch(seconds)`` returns at once with a
``DeviceValue``; a worker thread runs the kernels in order, each taking its known duration, and
records when it started and finished (the ground truth, ``log()``). Reading a value
(``float(v)``, or goodtrace's ``__goodtrace_wait__``) blocks until its kernel is done, exactly
like ``loss.item()`` does; ``__goodtrace_ready__`` tests it without waiting, like
``jax.Array.is_ready()``; ``__goodtrace_barrier__`` waits for every kernel launched so far on
its device, like ``torch.cuda.synchronize()``. ``launch(math.inf)`` queues a kernel that never
ends (a hung device).
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from goodtrace.read.sessions import Run, read_run


class FakeClock:
    """A monotonic clock in ns that only moves when told to (``advance``)."""

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self.now_ns = start_ns
        self._lock = threading.Lock()

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, seconds: float) -> int:
        with self._lock:
            self.now_ns += round(seconds * 1e9)
            return self.now_ns


class DeviceValue:
    """The result of a simulated kernel; reading it waits for the kernel."""

    def __init__(self, device: SimulatedDevice, name: str, result: float) -> None:
        self._device = device
        self.name = name
        self._result = result
        self._done = threading.Event()
        self.start_ns: int | None = None  # ground truth: when the kernel started
        self.done_ns: int | None = None  # ground truth: when the kernel finished...
        self.visible_ns: int | None = None  # ...and when that became visible to readers (after)
        self.waits = 0  # how many times goodtrace waited on it
        self.first_wait_ns: int | None = None

    def _complete(self) -> None:
        # A reader may see the value complete from `done_ns` on, and does see it after
        # `visible_ns`: a correct sync point t has done_ns <= t, a correct "not ready at" time
        # is before visible_ns.
        self.done_ns = time.perf_counter_ns()
        self._done.set()
        self.visible_ns = time.perf_counter_ns()

    def __goodtrace_ready__(self) -> bool:
        return self._done.is_set()

    def __goodtrace_wait__(self) -> None:
        self.waits += 1
        if self.first_wait_ns is None:
            self.first_wait_ns = time.perf_counter_ns()
        self._done.wait()

    def __goodtrace_float__(self) -> float:
        self._done.wait()
        return self._result

    def __float__(self) -> float:  # what a user's .item() does: block, then read
        self._done.wait()
        return self._result

    def __goodtrace_barrier__(self) -> None:
        self._device.synchronize()

    def block(self) -> DeviceValue:
        self._done.wait()
        return self

    def log(self) -> dict[str, Any]:
        return {"name": self.name, "start_ns": self.start_ns, "done_ns": self.done_ns,
                "visible_ns": self.visible_ns}


class SimulatedDevice:
    """A single in-order stream of kernels with known durations, run on a worker thread."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[float, DeviceValue] | None] = queue.Queue()
        self.launched: list[DeviceValue] = []
        self.synchronizes = 0  # calls of synchronize() (goodtrace's barrier included)
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="simulated-device", daemon=True)
        self._thread.start()

    def launch(self, seconds: float, name: str = "kernel", result: float = 0.0) -> DeviceValue:
        """Queue a kernel that takes ``seconds`` of device time (``math.inf``: never ends);
        returns immediately."""
        value = DeviceValue(self, name, result)
        self.launched.append(value)
        self._queue.put((seconds, value))
        return value

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            seconds, value = item
            value.start_ns = time.perf_counter_ns()
            if math.isinf(seconds):
                self._closing.wait()  # a hung kernel: nothing after it runs either
                return
            deadline = value.start_ns + round(seconds * 1e9)
            # Sleep most of it, spin the rest: kernel durations accurate to ~0.1 ms.
            remaining = deadline - time.perf_counter_ns()
            if remaining > 2_000_000:
                time.sleep((remaining - 1_500_000) / 1e9)
            while time.perf_counter_ns() < deadline:
                pass
            value._complete()

    def synchronize(self) -> None:
        """Wait for every kernel launched so far (in order: the last one ends last)."""
        self.synchronizes += 1
        if self.launched:
            self.launched[-1].block()

    def log(self) -> list[dict[str, Any]]:
        """The ground truth: name, start_ns, done_ns, visible_ns of every kernel launched."""
        return [value.log() for value in self.launched]

    def close(self) -> None:
        self._closing.set()
        self._queue.put(None)
        self._thread.join(timeout=10)


@contextlib.contextmanager
def capture(run_dir: str | os.PathLike[str] | None = None, **init_options: Any) -> Iterator[CaptureResult]:
    """Record inside the block, then read it back: ``with capture() as cap: ...; cap.run``."""
    import goodtrace

    with contextlib.ExitStack() as stack:
        if run_dir is None:
            run_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="goodtrace-"))
        result = CaptureResult(os.fspath(run_dir))
        goodtrace.init(run_dir, **init_options)
        completed = True
        try:
            yield result
        except BaseException:
            completed = False
            raise
        finally:
            result.recorder_ok = goodtrace.finish(completed=completed) if goodtrace.is_enabled() else True
            result.run = read_run(run_dir)


class CaptureResult:
    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.run: Run | None = None
        self.recorder_ok = False

    def records(self, kind: str | None = None) -> list[dict[str, Any]]:
        if self.run is None:
            raise RuntimeError("records are available after the capture block ends")
        return [record for _, record in self.run.records(kind)]
