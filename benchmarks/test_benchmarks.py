"""Every benchmark under ``benchmarks/`` runs: ``--quick --json`` exits 0 and its last line is
one JSON object. Nothing about its figures is asserted (timing has no place in a test); a
benchmark's own checks (two forms of a report that must agree) still stop it. Benchmarks read
the library's internals, so a change of them broke three of them unnoticed (over_time,
week_estimate, and completion_dating had no ``--quick``) before this ran them.

Not part of the README's test command (about 8 minutes on 2 cores): there ``ruff`` and ``mypy``
check ``benchmarks/`` instead, which catches a benchmark calling what the library no longer has.
Run them with ``python -m pytest benchmarks`` (README, "Running parts of the suite")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith(("_", "test_")))


def test_there_are_benchmarks() -> None:
    assert len(SCRIPTS) >= 30, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_quick_and_json(script: str) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    done = subprocess.run([sys.executable, script, "--quick", "--json"], cwd=BENCHMARKS, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    lines = done.stdout.strip().splitlines()
    assert lines, f"{script} printed nothing"
    figures = json.loads(lines[-1])
    assert isinstance(figures, dict) and figures, lines[-1][:500]
