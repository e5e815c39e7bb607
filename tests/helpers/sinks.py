"""A sink that keeps what it is given, and a small recorded loop that feeds sinks live lines."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import goodtrace as gt
from goodtrace.record.live.line import LiveLine
from goodtrace.record.live.sink_hub import SinkRun

STEPS = 25  # the stand-in aggregator logs every 10 steps: lines at 10, 20 and 25 (the last log interval)


class CaptureSink:
    """Records every call with the thread it ran on."""

    name = "capture"

    def __init__(self, ranks: str = "zero") -> None:
        self.ranks = ranks
        self.run: SinkRun | None = None
        self.lines: list[LiveLine] = []
        self.threads: set[str] = set()
        self.closed: bool | None = None

    def open(self, run: SinkRun) -> None:
        self.run = run
        self.threads.add(threading.current_thread().name)

    def write(self, line: LiveLine) -> None:
        self.lines.append(line)
        self.threads.add(threading.current_thread().name)

    def close(self, finished: bool) -> None:
        self.closed = finished
        self.threads.add(threading.current_thread().name)


def train(run_dir: Path, sinks: list[Any], steps: int = STEPS, **init_options: Any) -> None:
    """A host-synchronous loop: a loss metric every step, a checkpoint after step 12."""
    gt.init(run_dir, sinks=sinks, **init_options)
    for step in range(1, steps + 1):
        with gt.step(step):
            time.sleep(0.002)
            gt.metric("loss", 1.0 / step, "mean")
        if step == 12:
            with gt.span("checkpoint"):
                time.sleep(0.01)
    gt.finish()
