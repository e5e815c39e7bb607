"""Reading never writes into the run directory: a report of a run the reader cannot write is the
report of the same run where it can, and leaves the run's every file and folder as it was
(listing, sizes, modes, modification times: the test may run as root, whom a read-only mode
does not stop). The caches go to ``GOODTRACE_CACHE_DIR``, the rings killed processes left
included: read into the reader's cache, never removed or rewritten by a report; ``goodtrace
compact``, asked to write beside the run, writes their segments into it."""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from pathlib import Path
from typing import Any

import pytest

import goodtrace as gt
from goodtrace.read.environment import run_cache_dir
from goodtrace.record import fastpath
from helpers.cli import goodtrace
from helpers.many_ranks import write_many_ranks

pytestmark = pytest.mark.unit

Listing = dict[str, tuple[int, int, int]]


def _listing(root: Path) -> Listing:
    """Every entry under ``root`` (itself included): (mode, size, mtime_ns)."""
    out: Listing = {}
    for folder, dirs, files in os.walk(root):
        for name in [".", *dirs, *files]:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            out[os.path.relpath(path, root)] = (info.st_mode, info.st_size if name != "." else 0, info.st_mtime_ns)
    return out


def _set_modes(root: Path, writable: bool) -> None:
    for folder, _, files in os.walk(root):
        os.chmod(folder, 0o755 if writable else 0o555)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644 if writable else 0o444)


def _report(run: Path, *args: str) -> dict[str, Any]:
    done = goodtrace("report", str(run), "--json", *args)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    result.pop("path", None)
    return result


def _killed_run(tmp_path: Path) -> Path:
    """A run whose process left its ring with records it had not written: a live recorder's
    files copied while it had records in its ring (the copy's ring is locked by nobody, as a
    killed process's is), then finished."""
    live = tmp_path / "live"
    gt.init(str(live), flush_interval_s=60)
    try:
        for step in range(30):
            with gt.step(step), gt.span("fwd"):
                pass
        time.sleep(0.05)
        run = tmp_path / "run"
        shutil.copytree(live, run)
    finally:
        assert gt.finish()
    return run


def test_a_run_the_reader_cannot_write_reports_fully_and_is_left_as_it_was(tmp_path: Path) -> None:
    run = write_many_ranks(tmp_path / "run", ranks=2)
    writable = tmp_path / "writable"
    shutil.copytree(run, writable)
    expected = _report(writable)
    _set_modes(run, writable=False)
    try:
        before = _listing(run)
        assert _report(run) == expected  # cold: the segment cache is made in the reader's cache
        assert _report(run) == expected  # warm: read from it
        assert list(Path(run_cache_dir(str(run), "segments")).glob("*.json"))
        trace = goodtrace("trace", str(run), "-o", str(tmp_path / "trace.json"))
        assert trace.returncode == 0, trace.stderr
        assert _listing(run) == before
    finally:
        _set_modes(run, writable=True)


@pytest.mark.skipif(fastpath.native is None, reason="the native writer (its ring file) is not built here")
def test_a_killed_process_s_ring_is_read_from_the_reader_s_cache_and_left_in_place(tmp_path: Path) -> None:
    run = _killed_run(tmp_path)
    (ring,) = run.glob("rank-*/*.ring")
    assert [p.name for p in run.glob("rank-*/*.jsonl")] == [ring.name.replace(".ring", ".00000.jsonl")]
    _set_modes(run, writable=False)
    try:
        before = _listing(run)
        first = _report(run)
        assert first["step_stats"]["count"] == 30  # the ring's records too
        assert any("recovered from its ring" in warning for warning in first["warnings"])
        assert _report(run) == first  # again, from the copy in the cache (the ring unchanged)
        assert _listing(run) == before
        copies = sorted(p.name for p in Path(run_cache_dir(str(run), "rings")).glob("rank-*/*.jsonl"))
        assert copies == [ring.name.replace(".ring", ".00001.jsonl")]
    finally:
        _set_modes(run, writable=True)
    # compact, asked to write beside the run, turns the ring of a process proven gone (its lock
    # free, this host's) into the run's own segment and deletes it; the report is the same
    done = goodtrace("compact", str(run))
    assert done.returncode == 0, done.stderr
    assert not ring.exists() and (ring.parent / ring.name.replace(".ring", ".00001.jsonl")).is_file()
    compacted = _report(run)
    assert compacted["warnings"] == [w for w in first["warnings"] if "recovered from its ring" not in w]
    assert compacted["form"] == "parquet"
    assert {k: v for k, v in compacted.items() if k not in ("warnings", "form")} == \
        {k: v for k, v in first.items() if k not in ("warnings", "form")}


def test_the_cache_folder_is_one_per_run_and_follows_the_environment(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOODTRACE_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "run").mkdir()
    os.symlink(tmp_path / "run", tmp_path / "link")
    segments = run_cache_dir(str(tmp_path / "run"), "segments")
    assert segments.startswith(str(tmp_path / "cache" / "segments") + os.sep)
    assert run_cache_dir(str(tmp_path / "link"), "segments") == segments  # the run's real path is its key
    assert run_cache_dir(str(tmp_path / "other"), "segments") != segments
    assert run_cache_dir(str(tmp_path / "run"), "rings") == segments.replace(os.sep + "segments" + os.sep,
                                                                             os.sep + "rings" + os.sep)
    monkeypatch.delenv("GOODTRACE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert run_cache_dir(str(tmp_path / "run"), "segments").startswith(str(tmp_path / "xdg" / "goodtrace" / "runs"))
    assert stat.S_ISDIR(os.stat(tmp_path / "run").st_mode)  # nothing was made by asking
    assert not (tmp_path / "xdg").exists()
