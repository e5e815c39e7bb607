"""TensorBoard: event files written with ``tensorboardX`` (``pip install 'goodtrace[tensorboard]'``).

One scalar per name at the log step; the summary at the last step, attempts as text. Only
rank 0 writes by default; with ``all_ranks=True`` each other rank writes to ``DIR/rank-N``.
The event file is flushed on goodtrace's heartbeat cadence (``flush``), not every 10 s.
``goodtrace export`` writes one event file per run (its name ends in the run's export id)
and replaces it when exported again; points carry the step's wall time, events are text.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping
from typing import Any

from goodtrace.record.live.sink_hub import SinkError, SinkRun
from goodtrace.sinks._base import ScalarSink


class TensorBoardSink(ScalarSink):
    """Write goodtrace's numbers as TensorBoard scalars under ``log_dir``."""

    name = "tensorboard"

    def __init__(self, log_dir: str | os.PathLike[str], *, all_ranks: bool = False, summary: bool = True,
                 flush_secs: float = 10.0) -> None:
        super().__init__(all_ranks=all_ranks, summary=summary)
        if not str(log_dir).strip():
            raise SinkError("tensorboard: the log directory must not be empty")
        self.log_dir = os.fspath(log_dir)
        self.flush_secs = flush_secs
        self._writer: Any = None

    @classmethod
    def from_spec(cls, argument: str | None) -> TensorBoardSink:
        if not argument:
            raise SinkError("tensorboard needs a directory: 'tensorboard:DIR'")
        return cls(argument)

    def start(self, run: SinkRun) -> None:
        from tensorboardX import FileWriter

        target = self.log_dir if run.rank == 0 else os.path.join(self.log_dir, f"rank-{run.rank}")
        suffix = ""
        if self.export_id is not None:  # replace an earlier export of this run: its file only
            suffix = f".goodtrace-export-{self.export_id}"
            for old in glob.glob(os.path.join(glob.escape(target), f"events.out.tfevents.*{suffix}")):
                os.remove(old)
        self._writer = FileWriter(target, flush_secs=max(1, round(self.flush_secs)), filename_suffix=suffix)

    def scalars(self, step: int, values: Mapping[str, float], wall_time_s: float | None = None) -> None:
        """One event a step holding each name's scalar (the same values as ``add_scalar``'s, an
        event each: 4x the time, 0.7 ms a step of ``goodtrace export``)."""
        from tensorboardX.proto.summary_pb2 import Summary
        from tensorboardX.summary import scalar

        merged = Summary(value=[v for name, value in values.items() for v in scalar(name, value).value])
        self._writer.add_summary(merged, step, wall_time_s)

    def event(self, step: int, name: str, text: str) -> None:
        from tensorboardX.summary import text as text_summary

        self._writer.add_summary(text_summary(name, text), step)

    def flush(self) -> None:
        """Called on goodtrace's heartbeat cadence: the event file ends where the run's files do."""
        if self._writer is not None:
            self._writer.flush()

    def summary(self, step: int, numbers: Mapping[str, float], texts: Mapping[str, str]) -> None:
        self.scalars(step, numbers)
        for name, text in texts.items():
            self.event(step, name, text)

    def shutdown(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
