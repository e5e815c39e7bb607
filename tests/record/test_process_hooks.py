"""What ``gt.init`` changes process-wide can each be kept off (docs/recording.md, "What goodtrace changes
in the process")."""

from __future__ import annotations

import gc
import signal
import sys
import threading
from pathlib import Path

import pytest

import goodtrace as gt


def test_init_installs_its_hooks_by_default_and_finish_takes_them_back(tmp_path: Path) -> None:
    runners = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as in a job without a handler of its own
    try:
        before = (sys.excepthook, threading.excepthook, list(gc.callbacks))
        rec = gt.init(tmp_path / "run")
        try:
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
            assert sys.excepthook is not before[0] and threading.excepthook is not before[1]
            assert len(gc.callbacks) == len(before[2]) + 1
        finally:
            gt.finish()
        assert (sys.excepthook, threading.excepthook, gc.callbacks) == before
        assert rec.config.sigterm_handler and rec.config.exception_hooks
    finally:
        signal.signal(signal.SIGTERM, runners)


def test_each_process_wide_hook_can_be_kept_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = (signal.getsignal(signal.SIGTERM), sys.excepthook, threading.excepthook, list(gc.callbacks))
    monkeypatch.setenv("GOODTRACE_EXCEPTION_HOOKS", "0")
    gt.init(tmp_path / "run", sigterm_handler=False, record_gc=False)
    try:
        with gt.step(0):
            pass
        assert (signal.getsignal(signal.SIGTERM), sys.excepthook, threading.excepthook, gc.callbacks) == (
            before[0], before[1], before[2], before[3])
    finally:
        assert gt.finish()
    with pytest.raises(gt.ConfigError, match="sigterm_handler must be a bool"):
        gt.init(tmp_path / "run2", sigterm_handler="no")
