"""What a sink should have written: the captured live lines, the analysis of the finished run
(``goodtrace export``), and the in-job summary from the attempt figures the job left."""

from __future__ import annotations

import json
import time
from pathlib import Path

from goodtrace.analysis import RunAnalysis, analyze
from goodtrace.read.load import load_run
from goodtrace.record.live.line import LiveLine
from goodtrace.sinks import line_scalars, summary_values
from goodtrace.sinks._base import summary_from
from goodtrace.sinks._held import FILE_NAME, AttemptFigures, same_job

JOB_GOODPUT = "goodtrace/goodput/job"


def expected_live(lines: list[LiveLine]) -> dict[int, dict[str, float]]:
    """Per log step, the scalars of its live line (the job's goodput is checked on its own)."""
    return {line.step: line_scalars(line) for line in lines}


def analysis_of(run_dir: Path) -> RunAnalysis:
    return analyze(load_run(run_dir), now_wall_ns=time.time_ns())


def expected_export_summary(run_dir: Path) -> tuple[dict[str, float], dict[str, str]]:
    """The report's summary, as ``goodtrace export`` writes it."""
    return summary_values(analysis_of(run_dir))


def expected_summary(run_dir: Path, last_line: LiveLine | None = None, rank: int = 0) -> tuple[dict[str, float], dict[str, str]]:
    """The summary a sink writes at ``finish()`` inside the job: from the figures each attempt
    left in ``rank-NNNNN/attempts.json`` and the last live line (without it, the job's figures
    alone, at the last line's time)."""
    raw = json.loads((run_dir / f"rank-{rank:05d}" / FILE_NAME).read_text())["attempts"]
    attempts = sorted((f for f in map(AttemptFigures.from_json, raw) if f is not None), key=lambda a: a.start_wall_ns)
    current = attempts[-1]
    _, numbers, texts = summary_from(same_job(attempts[:-1], current), current, last_line)
    return numbers, texts
