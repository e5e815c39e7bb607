"""The real ``goodtrace`` entry points, started as a user starts them: the installed script and
``python -m goodtrace``. Every other CLI test calls ``goodtrace.cli.main`` in-process
(tests/helpers/cli.py); these show that what it answers there is what a fresh process prints:
the same console report and JSON, the same one-line error and exit status."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.cli import DEFAULT_ENV, goodtrace

pytestmark = pytest.mark.processes

RESTART = Path(__file__).parent.parent / "data" / "runs" / "restart_2ranks"


def _started(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=180, check=False,
                          env=dict(os.environ, **DEFAULT_ENV))


def test_python_m_goodtrace_prints_what_the_in_process_call_answers() -> None:
    for args, shows in ((["report", str(RESTART)], "Goodput 48.5%"), (["report", str(RESTART), "--json"], '"goodput"')):
        started = _started(sys.executable, "-m", "goodtrace", *args)
        here = goodtrace(*args)
        assert started.returncode == here.returncode == 0, started.stderr
        assert shows in started.stdout and started.stdout == here.stdout
        assert started.stderr == here.stderr


def test_the_installed_script_says_an_error_in_one_line_as_the_in_process_call(tmp_path: Path) -> None:
    script = shutil.which("goodtrace", path=os.path.dirname(sys.executable)) or shutil.which("goodtrace")
    assert script is not None, "the goodtrace script is not installed (pip install -e .)"
    started = _started(script, "report", str(tmp_path / "nothing"))
    here = goodtrace("report", str(tmp_path / "nothing"))
    assert started.returncode == here.returncode == 2
    assert started.stderr == here.stderr and started.stderr.startswith("goodtrace report: error: ")
    assert len(started.stderr.splitlines()) == 1 and started.stdout == here.stdout == ""
    version = _started(script, "--version")
    assert version.returncode == 0 and version.stdout.startswith("goodtrace ")
