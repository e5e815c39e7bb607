"""A rank that crashes never enters a collective at finish(); a normal finish is bounded.

The integrations close their live aggregator collectively only at ``finish(completed=True)``
outside an exception handler. The unit tests use a transport that counts gathers and never
completes them (a peer that never joins); the process test runs two real gloo ranks through
``goodtrace.integrations.torch`` where rank 1 fails and calls ``finish(completed=False)`` from
its ``except`` block while rank 0 is held until rank 1 has exited: a collective in rank 1's
finish could only end at a timeout.
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

import goodtrace as gt
from goodtrace.integrations._common import Integration
from goodtrace.record.live.aggregator import LiveAggregator
from goodtrace.testing import capture
from helpers.ranks import free_port, rank_context


class _NeverJoined:
    def done(self) -> bool:
        return False

    def wait(self) -> list[list[float]]:
        raise AssertionError("a gather that never completes was waited on")


class _CountingTransport:
    rank = 0
    world_size = 2

    def __init__(self) -> None:
        self.gathers = 0

    def all_gather(self, vector: list[float]) -> _NeverJoined:
        self.gathers += 1
        return _NeverJoined()


class _Hooked(Integration):
    def __init__(self, recorder: Any, transport: _CountingTransport, log_every: int = 100) -> None:
        super().__init__(recorder)
        self.aggregator = LiveAggregator(recorder, transport, log_every=log_every, printer=lambda line: None)
        self._listen(recorder.finish_listeners, self._on_finish)


def _run_steps() -> None:
    for step in range(1, 4):  # no log step (log_every=100): no gather inside the loop
        with gt.step(step):
            gt.metric("loss", 1.0)


def test_finish_not_completed_from_an_except_block_is_local() -> None:
    transport = _CountingTransport()
    with pytest.raises(ValueError):
        with capture(finish_timeout_s=60):  # capture() calls finish(completed=False) in its except
            _Hooked(gt.recorder(), transport)
            _run_steps()
            raise ValueError("the loop failed")
    assert transport.gathers == 0


@pytest.mark.parametrize("completed", [False, True])
def test_finish_inside_an_exception_handler_is_local_whatever_completed_says(
    completed: bool, tmp_path: Path
) -> None:
    transport = _CountingTransport()
    gt.init(tmp_path / "run", finish_timeout_s=60)
    _Hooked(gt.recorder(), transport)
    _run_steps()
    try:
        raise RuntimeError("crash")
    except RuntimeError:
        gt.finish(completed=completed)
    assert transport.gathers == 0


class _JoinedLater:
    """A gather the peers complete ``delay_s`` after it was launched."""

    def __init__(self, delay_s: float) -> None:
        self.ready_at = time.monotonic() + delay_s
        self.seen_done = False

    def done(self) -> bool:
        self.seen_done = self.seen_done or time.monotonic() >= self.ready_at
        return self.seen_done

    def wait(self) -> list[list[float]]:
        raise AssertionError("a local ending never reads a gather's result")


class _LaterTransport(_CountingTransport):
    def __init__(self, delay_s: float | None) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.handles: list[Any] = []

    def all_gather(self, vector: list[float]) -> Any:  # type: ignore[override]
        self.gathers += 1
        handle = _NeverJoined() if self.delay_s is None else _JoinedLater(self.delay_s)
        self.handles.append(handle)
        return handle


@pytest.mark.parametrize("joined", [True, False], ids=["peers-join", "peers-never-join"])
def test_a_local_ending_lets_gathers_already_launched_finish_bounded(joined: bool, tmp_path: Path) -> None:
    # A gloo gather still in flight when the process exits aborts it (SIGABRT): a local ending
    # launches nothing new but lets the launched ones finish, for a bounded time.
    transport = _LaterTransport(0.3 if joined else None)
    gt.init(tmp_path / "run", finish_timeout_s=0.5)
    _Hooked(gt.recorder(), transport, log_every=2)
    _run_steps()  # a gather launched at step 2, in flight
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        started = time.monotonic()
        try:
            raise RuntimeError("crash")
        except RuntimeError:
            gt.finish(completed=False)
        took = time.monotonic() - started
    assert transport.gathers == 1
    in_flight_warning = any("still in flight" in str(w.message) for w in caught)
    if joined:
        assert transport.handles[0].seen_done and not in_flight_warning
    else:
        assert in_flight_warning
        assert took < 30  # bounded by finish_timeout_s (0.5 s), never the group's timeout


def test_finish_completed_gathers_and_is_bounded_by_finish_timeout() -> None:
    transport = _CountingTransport()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with capture(finish_timeout_s=0.2) as cap:
            _Hooked(gt.recorder(), transport)
            _run_steps()
            started = time.monotonic()
        took = time.monotonic() - started
    assert transport.gathers == 1  # the last log interval's gather, at a normal finish
    assert any("abandoned" in str(w.message) for w in caught)
    assert cap.recorder_ok
    # finish waited for the gather up to finish_timeout_s, then went on (the writer's own close
    # has the same bound): nowhere near the group's timeout
    assert took < 60


# ------------------------------------------------------------------------------ real processes


def _worker(rank: int, port: int, run_dir: str, out_dir: str, release: Any) -> None:
    import torch
    import torch.distributed as dist

    from goodtrace.integrations.torch import instrument

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    # every timeout far beyond the test's: a collective in rank 1's finish would block for good
    gt.init(run_dir, rank=rank, world_size=2, finish_timeout_s=600)
    instrument(log_every=2, memory=False, clock_sync_every=0, printer=lambda line: None, group_timeout_s=600)
    dist.barrier()
    result: dict[str, Any] = {}
    if rank == 1:
        try:
            for step in range(1, 6):
                with gt.step(step):
                    gt.metric("loss", float(step))
                    if step == 5:
                        raise RuntimeError("rank 1 fails in step 5")
        except RuntimeError:
            started = time.monotonic()
            result["finish"] = gt.finish(completed=False)
            result["finish_s"] = time.monotonic() - started
        Path(out_dir, "rank1.json").write_text(json.dumps(result))
        return  # no destroy_process_group: a crashing rank leaves without goodbyes
    for step in range(1, 5):
        with gt.step(step):
            gt.metric("loss", float(step))
    release.wait(300)  # rank 0 stays away from any collective until rank 1 has exited
    Path(out_dir, "rank0.json").write_text(json.dumps({"released": release.is_set()}))
    gt.finish(completed=False)  # its peer is gone: local too


@pytest.mark.processes
def test_a_crashing_rank_finishes_without_waiting_for_its_peers(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    run_dir, out_dir = tmp_path / "run", tmp_path / "out"
    out_dir.mkdir()
    ctx = rank_context()
    release = ctx.Event()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(rank, port, str(run_dir), str(out_dir), release)) for rank in (0, 1)]
    for proc in procs:
        proc.start()
    try:
        procs[1].join(timeout=180)
        crashed_exit = procs[1].exitcode
        release.set()
        procs[0].join(timeout=120)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
    assert crashed_exit == 0, "rank 1 did not exit on its own: its finish waited for rank 0"
    assert procs[0].exitcode == 0
    rank1 = json.loads((out_dir / "rank1.json").read_text())
    assert rank1["finish"] is True
    from goodtrace.read.sessions import read_run

    run = read_run(run_dir)
    finishes = {session.rank: record for session, record in run.records("finish")}
    assert finishes[1]["completed"] is False and finishes[0]["completed"] is False
