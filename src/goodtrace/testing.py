"""Test helpers: a fake clock, a simulated asynchronous device, and record capture.

``SimulatedDevice`` behaves like a GPU/TPU stream: ``launch(seconds)`` returns at once with a
``DeviceValue``; a worker thread runs the kernels in order, each taking its known duration, and
records when it finished (the ground truth). Reading a value (``float(v)``, or goodtrace's
``__goodtrace_wait__``) blocks until its kernel is done, exactly like ``loss.item()`` does.
"""

from __future__ import annotations

import contextlib
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
        self.done_ns: int | None = None  # ground truth: when the kernel finished
        self.waits = 0  # how many times goodtrace waited on it
        self.first_wait_ns: int | None = None

    def _complete(self) -> None:
        self.done_ns = time.perf_counter_ns()
        self._done.set()

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

    def block(self) -> DeviceValue:
        self._done.wait()
        return self


class SimulatedDevice:
    """A single in-order stream of kernels with known durations, run on a worker thread."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[float, DeviceValue] | None] = queue.Queue()
        self.launched: list[DeviceValue] = []
        self.busy_until_ns = 0
        self._thread = threading.Thread(target=self._run, name="simulated-device", daemon=True)
        self._thread.start()

    def launch(self, seconds: float, name: str = "kernel", result: float = 0.0) -> DeviceValue:
        """Queue a kernel that takes ``seconds`` of device time; returns immediately."""
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
            deadline = time.perf_counter_ns() + round(seconds * 1e9)
            # Sleep most of it, spin the rest: kernel durations accurate to ~0.1 ms.
            remaining = deadline - time.perf_counter_ns()
            if remaining > 2_000_000:
                time.sleep((remaining - 1_500_000) / 1e9)
            while time.perf_counter_ns() < deadline:
                pass
            value._complete()

    def synchronize(self) -> None:
        if self.launched:
            self.launched[-1].block()

    def close(self) -> None:
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
