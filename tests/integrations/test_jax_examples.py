"""The JAX examples run end to end (a few steps each) and say what they should."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

pytest.importorskip("jax")
pytest.importorskip("optax")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(*args: str) -> str:
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def test_jax_train_example_reports_compile_checkpoint_and_eval(tmp_path: Path) -> None:
    from goodtrace import schema
    from goodtrace.read.sessions import read_run

    stdout = _run(str(EXAMPLES / "jax_train.py"), "--steps", "7", "--checkpoint-every", "3",
                  "--eval-every", "5", "--log-every", "2", "--run-dir", str(tmp_path / "run"))
    assert "step    0:" in stdout and "compile" in stdout
    assert "\nVerdict: " in stdout  # the report's main loss, under its goodput line
    run = read_run(tmp_path / "run")
    (session,) = run.sessions
    categories = {r["cat"] for r in session.of_kind(schema.SPAN)}
    assert {schema.COMPILE, schema.CHECKPOINT_SAVE, schema.EVAL, schema.DATA} <= categories
    assert sorted(r["step"] for r in session.of_kind(schema.SYNC)) == list(range(7))
    assert session.finish is not None and session.finish["completed"] is True


def test_naive_vs_goodtrace_example_prints_both_columns() -> None:
    stdout = _run(str(EXAMPLES / "jax_naive_vs_goodtrace.py"), "--steps", "6", "--log-every", "3",
                  "--checkpoint-at", "3")
    table = stdout[stdout.index("host timer"):]
    rows = [line.split() for line in table.splitlines()[1:7]]
    assert [int(row[0]) for row in rows] == list(range(6))
    assert "compile" in rows[0]
