"""The reader's per-file calls on many files run many at once (what a network filesystem
needs: each is a round trip), in order, and a few in the calling thread."""

from __future__ import annotations

import threading

from goodtrace.read.io_pool import IO_THREADS, io_map


def test_many_calls_run_at_once_and_come_back_in_order() -> None:
    waiting = threading.Barrier(IO_THREADS, timeout=30)  # breaks unless IO_THREADS calls wait together

    def call(x: int) -> tuple[int, str]:
        if x < IO_THREADS:
            waiting.wait()
        return x * x, threading.current_thread().name

    out = io_map(call, range(100))
    assert [value for value, _ in out] == [x * x for x in range(100)]
    assert {name.split("_")[0] for _, name in out} == {"goodtrace-io"}


def test_a_few_calls_run_in_the_calling_thread() -> None:
    here = threading.current_thread().name
    assert io_map(lambda x: (x, threading.current_thread().name), range(3)) == [(0, here), (1, here), (2, here)]
    assert io_map(lambda x: x, []) == []
