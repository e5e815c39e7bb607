"""Sinks never read or analyse the run inside the job: after a restart, the job's goodput so far
and the summary at ``finish()`` come from the figures each attempt left (``sinks/_held.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from goodtrace.analysis import analyze
from goodtrace.read.load import load_run
from goodtrace.sinks._held import AttemptFigures, counted_productive, job_goodput, same_job

CHILD = r"""
import json, sys, time
import goodtrace as gt
from goodtrace.sinks.prometheus import PrometheusSink

run, tb, first, last, completed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
prometheus = PrometheusSink(0, linger_s=0)
gt.init(run, sinks=[prometheus, "tensorboard:" + tb], rank=0, world_size=1, local_rank=0)
job = []
for step in range(first, last):
    with gt.step(step):
        time.sleep(0.003)
    samples = prometheus._collector.samples.get("goodtrace_goodput_ratio", {})
    job.append(samples.get((("scope", "job"),)))
gt.finish(completed=completed)
summary = prometheus._collector.samples.get("goodtrace_summary_goodput_ratio", {}).get(())
loaded = sorted(m for m in sys.modules if m.startswith(("goodtrace.read", "goodtrace.analysis")))
print(json.dumps({"modules": loaded, "job": [j for j in job if j is not None], "summary": summary}))
"""


def _attempt(run: Path, first: int, last: int, completed: bool) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(run), str(run.parent / "tb"), str(first), str(last),
                          "1" if completed else "0"], capture_output=True, text=True, timeout=300, check=True)
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.processes
def test_a_restarted_jobs_sinks_never_load_the_reader_or_the_analysis(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = _attempt(run, 0, 60, completed=False)  # stops early: the launcher restarts it
    time.sleep(0.3)  # the restart's gap: disruption, in the job's time but no attempt's
    second = _attempt(run, 40, 100, completed=True)  # resumes from the checkpoint after step 39
    for attempt in (first, second):
        assert attempt["modules"] == []  # no goodtrace.read.*, no goodtrace.analysis.* in the job
    assert second["job"] and second["summary"] is not None
    assert (run / "rank-00000" / "attempts.json").is_file()
    figures = json.loads((run / "rank-00000" / "attempts.json").read_text())["attempts"]
    assert [(a["first_step"], a["last_step"], a["completed"]) for a in figures] == [(0, 59, False), (40, 99, True)]
    # what the job held agrees with the report's analysis of the run, read here, after the job
    report = analyze(load_run(str(run)), now_wall_ns=time.time_ns()).partition.goodput
    assert abs(float(second["summary"]) - report) < 0.05, (second["summary"], report)  # type: ignore[arg-type]


def test_redone_steps_of_earlier_attempts_no_longer_count() -> None:
    # attempt 0: steps 0-59, 6 s productive; attempt 1 re-did 40-59 and went on to 99
    assert counted_productive([(0, 59, 6.0), (40, 99, 6.0)]) == pytest.approx(4.0 + 6.0)
    # overlapping later attempts are counted once: 0-99 with 30-49 and 40-59 re-done (30 steps)
    assert counted_productive([(0, 99, 10.0), (30, 49, 0.0), (40, 59, 0.0)]) == pytest.approx(7.0)
    assert counted_productive([(None, None, 0.0), (5, 9, 1.0)]) == pytest.approx(1.0)


def test_job_goodput_and_jobs_told_apart() -> None:
    s = 1_000_000_000
    a0 = AttemptFigures("a0", start_wall_ns=0, productive_s=6.0, first_step=0, last_step=59, end_wall_ns=8 * s,
                        completed=False)
    a1 = AttemptFigures("a1", start_wall_ns=10 * s, productive_s=6.0, first_step=40, last_step=99)
    assert job_goodput([a0], a1, 20 * s) == pytest.approx(10.0 / 20.0)
    assert job_goodput([], a1, 20 * s) == pytest.approx(6.0 / 10.0)
    done = AttemptFigures("d", start_wall_ns=0, productive_s=6.0, first_step=0, last_step=99, completed=True)
    assert same_job([done], a1) == []  # it completed and the next starts at or before its last step
    assert same_job([a0], a1) == [a0]
    assert same_job([AttemptFigures("r", 0, restart=3)], AttemptFigures("n", 1, restart=0)) == []
