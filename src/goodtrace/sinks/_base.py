"""What the metric sinks share: the live line, step rows and the summary as named scalars.

Every sink writes the same names (``goodtrace/...``); this module only *names* numbers that
the live aggregator (per log step), the attempts' own figures (the job's goodput so far and the
summary inside the job: ``_held``, which never reads the run) and, in ``goodtrace export``, the
analysis (per step row, the report's summary) computed — it derives none. :class:`ScalarSink` turns the recording layer's sink protocol (open / write /
close) into three calls a backend implements: ``scalars(step, values)``, ``summary(values,
texts)`` and ``shutdown()``; ``goodtrace export`` drives the same three from a recorded run.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from goodtrace.record.live.line import LiveLine
from goodtrace.record.live.scalars import PREFIX, line_scalars
from goodtrace.record.live.sink_hub import ENDINGS, RANK_CHOICES, RANK_ZERO, SinkError, SinkRun
from goodtrace.sinks._held import AttemptFigures, counted_productive, held
from goodtrace.sinks._held import job_goodput as _held_job_goodput

__all__ = ["PREFIX", "ScalarSink", "line_scalars", "replay", "row_scalars", "summary_values"]

if TYPE_CHECKING:
    from goodtrace.analysis import RunAnalysis
    from goodtrace.analysis.steps import StepRow

def row_scalars(row: StepRow) -> dict[str, float]:
    """The scalars of one step execution of the analysis's step table."""
    out = {
        f"{PREFIX}/step_time_s": row.step_time_s,
        f"{PREFIX}/train_s": row.productive_s,
    }
    for category, seconds in row.overhead_s.items():
        out[f"{PREFIX}/overhead/{category}_s"] = seconds
    if row.device_s is not None:
        out[f"{PREFIX}/device_s"] = row.device_s
    for name, value in row.metrics.items():
        out[f"{PREFIX}/metric/{name}"] = value
    return out


MAX_ROLLBACK_TEXTS = 20  # a loop numbered per epoch rewinds every epoch: the count says how many


def summary_values(analysis: RunAnalysis) -> tuple[dict[str, float], dict[str, str]]:
    """(numbers, texts) of the run's summary: goodput, every bucket, the attempts, the rollbacks."""
    p = analysis.partition
    numbers: dict[str, float] = {
        f"{PREFIX}/summary/goodput": p.goodput,
        f"{PREFIX}/summary/total_s": p.total_ns / 1e9,
        f"{PREFIX}/summary/attempts": float(len(analysis.attempts)),
        f"{PREFIX}/summary/steps": float(len(analysis.steps)),
    }
    for bucket, ns in p.buckets_ns.items():
        numbers[f"{PREFIX}/summary/{bucket}_s"] = ns / 1e9
        numbers[f"{PREFIX}/summary/{bucket}_fraction"] = p.fraction(bucket)
    if analysis.ideal_step_s is not None:
        numbers[f"{PREFIX}/summary/ideal_step_s"] = analysis.ideal_step_s
    if analysis.program.mfu is not None:
        numbers[f"{PREFIX}/summary/mfu"] = analysis.program.mfu
    texts = {
        f"{PREFIX}/summary/attempt_{a.index}": (
            f"{a.ending.text}, steps {a.first_step}-{a.last_step}, {a.duration_ns / 1e9:.1f} s, {a.ranks} ranks"
        )
        for a in analysis.attempts
    }
    if analysis.rewinds:  # rollbacks inside an attempt (absent otherwise: other runs keep their scalars)
        numbers[f"{PREFIX}/summary/rollbacks"] = float(len(analysis.rewinds))
        for i, r in enumerate(analysis.rewinds[:MAX_ROLLBACK_TEXTS]):
            texts[f"{PREFIX}/summary/rollback_{i}"] = f"attempt {r.attempt}: {r.text()}"
    return numbers, texts


def event_texts(analysis: RunAnalysis) -> list[tuple[int, str, str]]:
    """(step, name, text) of each of the run's events (``gt.event``: crashes, the model, ...),
    in time order; an event outside any step is put at step 0."""
    out = []
    for event in analysis.events:
        attrs = ", ".join(f"{k}={v}" for k, v in (event.attrs or {}).items())
        where = f"rank {event.rank}, attempt {event.attempt}, {event.time_s:.3f} s after the job start"
        out.append((event.step if event.step is not None else 0, f"{PREFIX}/event/{event.name}",
                    f"{where}{': ' + attrs if attrs else ''}"))
    return out


def export_id(analysis: RunAnalysis) -> str:
    """What names one export target's copy of a run: its directory and job (``goodtrace
    export`` replaces that copy instead of adding a second one)."""
    import hashlib

    from goodtrace.record.io.storage import is_url

    where = analysis.path if is_url(analysis.path) else os.path.abspath(analysis.path)  # a URL as typed
    key = f"{where}#job{analysis.job}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def job_goodput(run: SinkRun, line: LiveLine) -> float | None:
    """The whole job's goodput so far at ``line``, from the figures each attempt of this rank
    left (``_held``), never from the run directory's records: no reader, no analysis in the job."""
    return held(run).job_goodput(line)


def held_summary(run: SinkRun, line: LiveLine | None) -> tuple[int, dict[str, float], dict[str, str]]:
    """(step, numbers, texts) of the summary a sink writes at ``finish()`` inside the job (see
    :func:`summary_from`), from this rank's attempt figures."""
    earlier, current = held(run).job_figures()
    return summary_from(earlier, current, line)


def summary_from(earlier: Sequence[AttemptFigures], current: AttemptFigures,
                 line: LiveLine | None) -> tuple[int, dict[str, float], dict[str, str]]:
    """The in-job summary: the job's goodput, time and productive time so far from the
    attempts' own figures (``earlier``: this job's attempts before ``current``), and this
    attempt's figures from its last live line. ``goodtrace export`` writes the report's
    (:func:`summary_values`)."""
    numbers: dict[str, float] = {f"{PREFIX}/summary/attempts": float(len(earlier) + 1)}
    texts: dict[str, str] = {}
    now = line.wall_ns if line is not None and line.wall_ns is not None else (current.end_wall_ns or time.time_ns())
    goodput = _held_job_goodput(earlier, current, now) if earlier or line is None else line.goodput
    if goodput is not None:
        numbers[f"{PREFIX}/summary/goodput"] = goodput
    start = min([a.start_wall_ns for a in (*earlier, current)])
    numbers[f"{PREFIX}/summary/total_s"] = max(0.0, (now - start) / 1e9)
    numbers[f"{PREFIX}/summary/productive_s"] = counted_productive(
        [(a.first_step, a.last_step, a.productive_s) for a in (*earlier, current)])
    if line is not None:
        for name, value in (("goodput", line.goodput), ("elapsed_s", line.elapsed_s),
                            ("productive_s", line.productive_s)):
            if value is not None:
                numbers[f"{PREFIX}/summary/attempt/{name}"] = float(value)
        for category, seconds in line.overhead_total_s.items():
            numbers[f"{PREFIX}/summary/attempt/{category}_s"] = float(seconds)
    for i, a in enumerate((*earlier, current)):
        steps = f"steps {a.first_step}-{a.last_step}" if a.first_step is not None else "no step reported"
        ended = ("this attempt" if a is current else "completed" if a.completed
                 else "ended early" if a.completed is False else "ending unknown")
        seconds = ((a.end_wall_ns or now) - a.start_wall_ns) / 1e9
        texts[f"{PREFIX}/summary/attempt_{i}"] = f"{ended}, {steps}, {seconds:.1f} s, {a.productive_s:.1f} s productive"
    return (line.step if line is not None else 0), numbers, texts


class ScalarSink:
    """Base of the built-in sinks: the recording layer's protocol on top of three methods.

    Subclasses implement :meth:`start`, :meth:`scalars`, :meth:`summary` and :meth:`shutdown`
    (all run on the sink's thread, or in ``goodtrace export``).
    """

    name = "sink"
    # Set by ``replay`` (goodtrace export) before ``start``: the backend replaces what an earlier
    # export of the same run wrote (a TensorBoard file, an MLflow run, a W&B offline run).
    export_id: str | None = None
    last_line: LiveLine | None = None  # the latest live line written (inside the job)

    def __init__(self, *, all_ranks: bool = False, ranks: str | None = None, summary: bool = True) -> None:
        chosen = ranks if ranks is not None else ("all" if all_ranks else RANK_ZERO)
        if chosen not in RANK_CHOICES:
            raise SinkError(f"{self.name}: ranks must be one of {RANK_CHOICES}, got {chosen!r}")
        self.ranks = chosen
        self.write_summary = summary
        self.run: SinkRun | None = None

    # ------------------------------------------------------------ the recording layer's protocol
    def open(self, run: SinkRun) -> None:
        self.run = run
        if run.session:  # inside the job (goodtrace export has no session): this attempt's figures
            held(run)
        self.start(run)

    def write(self, line: LiveLine) -> None:
        self.scalars(line.step, line_scalars(self.with_job_goodput(line)))

    def with_job_goodput(self, line: LiveLine) -> LiveLine:
        if self.run is None or line.job_goodput is not None:
            return line
        figures = held(self.run)
        figures.update(line)
        self.last_line = line
        return dataclasses.replace(line, job_goodput=figures.job_goodput(line))

    def close(self, finished: bool) -> None:
        """The summary (rank 0 only), from the figures the job holds, then the backend."""
        try:
            self.end_attempt(finished)
            if finished and self.write_summary and self.run is not None and self.run.rank == 0:
                step, numbers, texts = held_summary(self.run, self.last_line)
                self.summary(step, numbers, texts)
        finally:
            self.shutdown()

    def end_attempt(self, finished: bool) -> None:
        """Leave this attempt's figures for the next attempt (rank directory, ``_held``)."""
        if self.run is not None and self.run.session:
            held(self.run).finished(ENDINGS.get(self.run.session) if finished else False)

    # ------------------------------------------------------------ what a backend implements
    def start(self, run: SinkRun) -> None:
        """Open the backend (on the sink's thread; ``goodtrace export`` calls it too)."""

    def scalars(self, step: int, values: Mapping[str, float], wall_time_s: float | None = None) -> None:
        """``wall_time_s``: when the values were true (the step's end; None: now)."""
        raise NotImplementedError

    def event(self, step: int, name: str, text: str) -> None:
        """One event of the run (``goodtrace export``); backends without text values skip it."""

    def summary(self, step: int, numbers: Mapping[str, float], texts: Mapping[str, str]) -> None:
        raise NotImplementedError

    def shutdown(self) -> None:
        """Flush and close the backend."""


def rank_suffix(run: SinkRun) -> str:
    """``""`` on rank 0, ``"-rank3"`` elsewhere (sinks that run on every rank keep them apart)."""
    return "" if run.rank == 0 else f"-rank{run.rank}"


def replay(analysis: RunAnalysis, sink: ScalarSink) -> int:
    """Write a recorded run into ``sink`` (``goodtrace export``): one point per step execution
    of the analysis's step table, dated at the step's end, the run's events, then the summary.
    Returns the number of step rows written."""
    run = SinkRun(run_dir=analysis.path, session="", rank=0, world_size=max(a.world for a in analysis.attempts),
                  local_rank=0, host="", restart=None)
    sink.run = run
    sink.export_id = export_id(analysis)
    sink.start(run)
    try:
        for row in analysis.steps:
            sink.scalars(row.step, row_scalars(row) | {f"{PREFIX}/attempt": float(row.attempt)},
                         wall_time_s=row.end_ns / 1e9 if row.end_ns else None)
        for step, name, text in event_texts(analysis):
            sink.event(step, name, text)
        numbers, texts = summary_values(analysis)
        sink.summary(analysis.steps[-1].step if analysis.steps else 0, numbers, texts)
    finally:
        sink.shutdown()
    return len(analysis.steps)
