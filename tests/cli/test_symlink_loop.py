"""A run path that is a symlink loop is named as one, by the CLI and by the recorder, never
reported as "does not exist"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.cli import goodtrace

pytestmark = pytest.mark.processes


@pytest.fixture
def loop(tmp_path: Path) -> Path:
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    return tmp_path / "a"


@pytest.mark.parametrize("command", [["report"], ["compact"], ["export", "--to", "tensorboard", "tb"]])
def test_the_cli_names_the_loop(loop: Path, command: list[str]) -> None:
    result = goodtrace(command[0], str(loop), *command[1:], cwd=loop.parent)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "is a symlink loop" in result.stderr, result.stderr
    assert f"{loop} -> {loop.parent / 'b'} -> {loop}" in result.stderr
    assert "does not exist" not in result.stderr


def test_the_recorder_names_the_loop_and_finish_says_nothing_was_written(loop: Path) -> None:
    code = (
        "import json, sys, warnings\n"
        "import goodtrace as gt\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    gt.init(sys.argv[1], flush_interval_s=0.05)\n"
        "    with gt.step(0):\n"
        "        pass\n"
        "    ok = gt.finish()\n"
        "print(json.dumps({'ok': ok, 'warnings': [str(w.message) for w in caught]}))\n"
    )
    for writer in ("1", "0"):  # native, then the Python writer
        out = subprocess.run([sys.executable, "-c", code, str(loop)], capture_output=True, text=True, timeout=120,
                             check=True, env={**os.environ, "GOODTRACE_NATIVE_WRITER": writer}).stdout
        result = json.loads(out.splitlines()[-1])
        assert result["ok"] is False
        assert any(f"a symlink loop: {loop} -> {loop.parent / 'b'} -> {loop}" in w for w in result["warnings"])
