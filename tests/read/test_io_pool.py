"""The reader's per-file calls on many files of a network filesystem run many at once (each
is a round trip there), in order; on a local filesystem, and a few anywhere, in the calling
thread (there threads only contend for the interpreter)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from goodtrace.read import io_pool
from goodtrace.read.io_pool import IO_THREADS, io_map, on_network_filesystem
from helpers.storage_servers import EmulatedNFS


def test_many_calls_on_a_network_share_run_at_once_and_come_back_in_order(nfs: EmulatedNFS) -> None:
    waiting = threading.Barrier(IO_THREADS, timeout=30)  # breaks unless IO_THREADS calls wait together

    def call(x: int) -> tuple[int, str]:
        if x < IO_THREADS:
            waiting.wait()
        return x * x, threading.current_thread().name

    out = io_map(call, range(100), nfs.mountpoint)
    assert [value for value, _ in out] == [x * x for x in range(100)]
    assert {name.split("_")[0] for _, name in out} == {"goodtrace-io"}


def test_calls_on_a_local_filesystem_run_in_the_calling_thread(tmp_path: Path) -> None:
    here = threading.current_thread().name
    assert io_map(lambda x: (x, threading.current_thread().name), range(100), str(tmp_path)) == [
        (x, here) for x in range(100)]


def test_a_few_calls_run_in_the_calling_thread(nfs: EmulatedNFS) -> None:
    here = threading.current_thread().name
    assert io_map(lambda x: (x, threading.current_thread().name), range(3), nfs.mountpoint) == [
        (0, here), (1, here), (2, here)]
    assert io_map(lambda x: x, [], nfs.mountpoint) == []


def test_without_a_mount_table_many_calls_still_run_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # as on macOS: the filesystem's type is unknown, so the calls go on threads (a network
    # share's round trips would otherwise be waited for one by one)
    monkeypatch.setattr(io_pool, "MOUNT_TABLE", str(tmp_path / "no-mount-table"))
    assert not on_network_filesystem(str(tmp_path)) and on_network_filesystem(str(tmp_path), unknown=True)
    waiting = threading.Barrier(IO_THREADS, timeout=30)

    def call(x: int) -> tuple[int, str]:
        if x < IO_THREADS:
            waiting.wait()
        return x + 1, threading.current_thread().name

    out = io_map(call, range(50), str(tmp_path))
    assert [value for value, _ in out] == [x + 1 for x in range(50)]
    assert {name.split("_")[0] for _, name in out} == {"goodtrace-io"}
