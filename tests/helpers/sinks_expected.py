"""What a sink should have written: the captured live lines and the analysis of the finished run."""

from __future__ import annotations

import time
from pathlib import Path

from goodtrace.analysis import RunAnalysis, analyze
from goodtrace.read.load import load_run
from goodtrace.record.live.line import LiveLine
from goodtrace.sinks import line_scalars, summary_values

JOB_GOODPUT = "goodtrace/goodput/job"


def expected_live(lines: list[LiveLine]) -> dict[int, dict[str, float]]:
    """Per log step, the scalars of its live line (the job's goodput is checked on its own)."""
    return {line.step: line_scalars(line) for line in lines}


def analysis_of(run_dir: Path) -> RunAnalysis:
    return analyze(load_run(run_dir), now_wall_ns=time.time_ns())


def expected_summary(run_dir: Path) -> tuple[dict[str, float], dict[str, str]]:
    return summary_values(analysis_of(run_dir))
