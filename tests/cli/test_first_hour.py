"""What a newcomer meets in the first hour, run as they would: the plain PyTorch example, fast
steps printed in units that fit, ``trace`` without ``-o``, sizes in fitting units, ``--steps``
outside the run an error like ``--ranks``, the help texts, a reused directory's header."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import goodtrace as gt
from helpers.cli import Ran
from helpers.cli import goodtrace as run_goodtrace

pytestmark = pytest.mark.processes

EXAMPLES = Path(__file__).parent.parent.parent / "examples"


def goodtrace(*args: str, cwd: Path | None = None) -> Ran:
    return run_goodtrace(*args, cwd=cwd, env={"COLUMNS": "200"})


def _fast_run(run_dir: Path, steps: int = 30) -> None:
    gt.init(run_dir)
    for step in range(1, steps + 1):
        with gt.step(step):
            pass
    gt.finish()


def test_the_plain_pytorch_example_runs_and_reports(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, str(EXAMPLES / "plain_pytorch.py"), "--steps", "12", "--log-every", "4",
                           "--checkpoint-every", "6", "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "Goodput" in done.stdout and "checkpoint save" in done.stdout and "1-12" in done.stdout


def test_steps_under_a_millisecond_print_in_units_that_fit(tmp_path: Path) -> None:
    _fast_run(tmp_path / "run")
    done = goodtrace("report", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("Step time")]
    assert "0.000 s" not in line and re.search(r"median [0-9.]+ (us|ms)", line), line


def test_trace_writes_a_default_file_and_names_its_size_in_fitting_units(tmp_path: Path) -> None:
    _fast_run(tmp_path / "myrun")
    done = goodtrace("trace", str(tmp_path / "myrun"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "myrun.trace.json.gz").stat().st_size > 0
    assert re.search(r"[0-9.]+ (B|KiB)$", done.stdout.strip()) and "0.0 MB" not in done.stdout


def test_steps_outside_the_run_are_an_error_like_ranks(tmp_path: Path) -> None:
    _fast_run(tmp_path / "run")
    steps = goodtrace("trace", str(tmp_path / "run"), "-o", str(tmp_path / "t.json"), "--steps", "500:600")
    ranks = goodtrace("trace", str(tmp_path / "run"), "-o", str(tmp_path / "t.json"), "--ranks", "7")
    assert steps.returncode == ranks.returncode == 2
    assert "the run has no step in '500:600' (its steps run from 1 to 30)" in steps.stderr
    assert "Traceback" not in steps.stderr + ranks.stderr


def test_help_texts_name_what_the_commands_read() -> None:
    report, trace = goodtrace("report", "--help"), goodtrace("trace", "--help")
    for done in (report, trace):
        assert "path or fsspec URL" in " ".join(done.stdout.split())
    help_text = " ".join(report.stdout.split())
    assert re.search(r"--devices-per-rank N accelerators each rank drives", help_text)


def test_a_reused_directory_s_header_says_which_job_its_attempts_are_of(tmp_path: Path) -> None:
    _fast_run(tmp_path / "run", steps=5)
    _fast_run(tmp_path / "run", steps=5)  # a second job in the same directory, from step 1 again
    done = goodtrace("report", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert "1 attempt(s) in job 1 of 2" in done.stdout.splitlines()[0]


def _traced_steps(path: Path) -> set[int]:
    import json

    events = json.loads(path.read_text())["traceEvents"]
    return {e["args"]["step"] for e in events if e.get("cat") == "step"}


def test_a_trace_past_the_limit_is_written_as_the_steps_around_the_slowest_and_says_so(tmp_path: Path) -> None:
    """A week-long run makes a trace of many GB that the Perfetto UI cannot open: past
    --limit-mb (estimated from the records before any is read), the trace is a slice that fits,
    and the command says which and how to get every step."""
    gt.init(tmp_path / "run")
    for step in range(1, 301):
        with gt.step(step):
            if step == 150:
                import time

                time.sleep(0.05)  # the slowest step: the slice is around it
    gt.finish()
    sliced = goodtrace("trace", str(tmp_path / "run"), "-o", str(tmp_path / "s.json"), "--limit-mb", "0.02")
    assert sliced.returncode == 0, sliced.stderr
    match = re.search(r"past --limit-mb 0.02 .*writing steps (\d+):(\d+), the ([\d,]+) steps around the slowest one",
                      " ".join(sliced.stderr.split()))
    assert match, sliced.stderr
    first, last, width = int(match[1]), int(match[2]), int(match[3].replace(",", ""))
    assert first <= 150 <= last and last - first + 1 == width < 300 and "--limit-mb 0" in sliced.stderr
    assert _traced_steps(tmp_path / "s.json") == set(range(first, last + 1))
    whole = goodtrace("trace", str(tmp_path / "run"), "-o", str(tmp_path / "w.json"), "--limit-mb", "0")
    assert whole.returncode == 0 and "note:" not in whole.stderr
    assert _traced_steps(tmp_path / "w.json") == set(range(1, 301))
    chosen = goodtrace("trace", str(tmp_path / "run"), "-o", str(tmp_path / "c.json"), "--limit-mb", "0.02",
                       "--steps", "10:20")
    assert chosen.returncode == 0 and "note:" not in chosen.stderr
    assert _traced_steps(tmp_path / "c.json") == set(range(10, 21))
    bad = goodtrace("trace", str(tmp_path / "run"), "-o", str(tmp_path / "b.json"), "--limit-mb", "-1")
    assert bad.returncode == 2 and "--limit-mb must be 0 or more" in bad.stderr and "Traceback" not in bad.stderr
