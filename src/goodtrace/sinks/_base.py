"""What the metric sinks share: the live line, step rows and the summary as named scalars.

Every sink writes the same names (``goodtrace/...``); this module only *names* numbers that
the live aggregator (per log step) and the analysis (per step row, summary, the job's goodput
so far) computed — it derives none. :class:`ScalarSink` turns the recording layer's sink protocol (open / write /
close) into three calls a backend implements: ``scalars(step, values)``, ``summary(values,
texts)`` and ``shutdown()``; ``goodtrace export`` drives the same three from a recorded run.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from goodtrace.record.live.line import LiveLine
from goodtrace.record.live.scalars import PREFIX, line_scalars
from goodtrace.record.live.sink_hub import RANK_CHOICES, RANK_ZERO, SinkError, SinkRun

__all__ = ["PREFIX", "ScalarSink", "line_scalars", "replay", "row_scalars", "summary_values"]

if TYPE_CHECKING:
    from goodtrace.analysis import RunAnalysis
    from goodtrace.analysis.so_far import EarlierAttempts
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

    key = f"{os.path.abspath(analysis.path)}#job{analysis.job}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


# One analysis per finished run and process, shared by the sinks that close at finish().
_summaries: dict[str, RunAnalysis] = {}
_summaries_lock = threading.Lock()


def analyse_run(run_dir: str) -> RunAnalysis:
    """The analysis of the run (loaded with the reader): the one derivation of every number."""
    with _summaries_lock:
        cached = _summaries.get(run_dir)
        if cached is None:
            from goodtrace.analysis import analyze
            from goodtrace.read.load import load_run

            cached = analyze(load_run(run_dir), now_wall_ns=time.time_ns())
            _summaries.clear()  # keep one: a process records one run at a time
            _summaries[run_dir] = cached
        return cached


_NO_EARLIER = "none"  # the running attempt is the job's first: job goodput = attempt goodput
_earlier: dict[str, Any] = {}  # session -> EarlierAttempts | _NO_EARLIER | number of failed looks
_earlier_lock = threading.Lock()
_MAX_LOOKS = 3


def job_goodput(run: SinkRun, line: LiveLine) -> float | None:
    """The whole job's goodput so far at ``line``: the analysis of the attempts before this one
    (looked up once per process, only when the run directory holds earlier sessions of this
    rank) plus this attempt's productive time from the live line."""
    if line.productive_s is None or line.wall_ns is None:
        return None
    with _earlier_lock:
        found = _earlier.get(run.session, 0)
        if isinstance(found, int) and found < _MAX_LOOKS:
            try:
                found = _look_up_earlier(run) or found + 1
            except ImportError:  # no reader installed: no job figure
                found = _MAX_LOOKS
            except Exception:  # files half written: look again at the next line
                found += 1
            _earlier[run.session] = found
    if found == _NO_EARLIER:
        return line.goodput
    if isinstance(found, int):
        return None
    earlier: EarlierAttempts = found
    return earlier.job_goodput(line.first_step, line.step, line.productive_s, line.wall_ns)


def _look_up_earlier(run: SinkRun) -> EarlierAttempts | str | None:
    from goodtrace.read.segments import NotARunError, list_segments

    own_dir = f"rank-{run.rank:05d}"
    try:
        segments = list_segments(run.run_dir)
    except NotARunError:  # nothing written yet, so nothing before this attempt either
        return _NO_EARLIER
    others = [path for rank_dir, path in segments
              if rank_dir == own_dir and not os.path.basename(path).startswith(run.session)]
    if not others:
        return _NO_EARLIER
    from goodtrace.analysis import analyze
    from goodtrace.analysis.so_far import earlier_attempts
    from goodtrace.read.load import load_run

    loaded = load_run(run.run_dir)
    return earlier_attempts(loaded, analyze(loaded, now_wall_ns=time.time_ns()), run.session)


class ScalarSink:
    """Base of the built-in sinks: the recording layer's protocol on top of three methods.

    Subclasses implement :meth:`start`, :meth:`scalars`, :meth:`summary` and :meth:`shutdown`
    (all run on the sink's thread, or in ``goodtrace export``).
    """

    name = "sink"
    # Set by ``replay`` (goodtrace export) before ``start``: the backend replaces what an earlier
    # export of the same run wrote (a TensorBoard file, an MLflow run, a W&B offline run).
    export_id: str | None = None

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
        self.start(run)

    def write(self, line: LiveLine) -> None:
        self.scalars(line.step, line_scalars(self.with_job_goodput(line)))

    def with_job_goodput(self, line: LiveLine) -> LiveLine:
        if self.run is None or line.job_goodput is not None:
            return line
        return dataclasses.replace(line, job_goodput=job_goodput(self.run, line))

    def close(self, finished: bool) -> None:
        """The summary (rank 0 only: it is the job's, from rank 0's timeline), then the backend."""
        try:
            if finished and self.write_summary and self.run is not None and self.run.rank == 0:
                analysis = analyse_run(self.run.run_dir)
                numbers, texts = summary_values(analysis)
                last = analysis.steps[-1].step if analysis.steps else 0
                self.summary(last, numbers, texts)
        finally:
            self.shutdown()

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
