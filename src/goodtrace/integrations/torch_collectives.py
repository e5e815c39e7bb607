"""The collectives goodtrace runs with PyTorch, on one gloo group of its own beside the job's:
the live line's gather to rank 0, its broadcast back and the summaries rank 0 sends the ranks
with sinks (``async_op``, never on a CUDA stream; record/live/rooted.py), and the clock rounds
(one leader per host pings rank 0 point to point, on a background thread; the others get their
leader's result). Point-to-point messages carry tags of their own, which never meet the
collectives' (gloo builds a collective's slots with a prefix of its own)."""

from __future__ import annotations

import functools
import inspect
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from goodtrace.record.clocksync import OffsetSample, host_leaders, measure_offset, ping_reference, serve_pings
from goodtrace.record.live.transport import GatherHandle
from goodtrace.record.threads import Thread

__all__ = ["GlooTransport", "sync_clocks"]


class _GlooWork:
    def __init__(self, work: Any, outputs: list[torch.Tensor], keep: Any = None) -> None:
        self._work = work
        self._outputs = outputs
        self._keep = keep  # a tensor being sent: alive until the work completes

    def done(self) -> bool:
        return bool(self._work.is_completed())

    def wait(self) -> list[list[float]]:
        self._work.wait()
        return [t.tolist() for t in self._outputs]


class _P2PWaiter:
    """Gloo's point-to-point works never say they are complete until waited on
    (``is_completed()`` stays False): a daemon thread waits on each, in order, and marks it done."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[Any, threading.Event, list[BaseException]]] = queue.Queue()
        self._thread: threading.Thread | None = None

    def submit(self, work: Any) -> tuple[threading.Event, list[BaseException]]:
        done, failed = threading.Event(), list[BaseException]()
        if self._thread is None:
            self._thread = Thread(target=self._loop, name="goodtrace-live-p2p", daemon=True)
            self._thread.start()
        self._queue.put((work, done, failed))
        return done, failed

    def _loop(self) -> None:
        while True:
            work, done, failed = self._queue.get()
            try:
                work.wait()
            except BaseException as exc:  # handed to the training thread's wait()
                failed.append(exc)
            finally:
                done.set()


class _P2PWork:
    def __init__(self, waiter: _P2PWaiter, work: Any, outputs: list[torch.Tensor], keep: torch.Tensor) -> None:
        self._done, self._failed = waiter.submit(work)
        self._outputs = outputs
        self._keep = keep

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> list[list[float]]:
        self._done.wait()
        if self._failed:
            raise self._failed[0]
        return [t.tolist() for t in self._outputs]


class GlooTransport:
    """The live line's rooted exchange (record/live/transport.py ``RootedTransport``) on a gloo
    group, every operation ``async_op=True`` (never a CUDA stream): each rank's vector gathered
    to rank 0 only, a small broadcast back, and a summary point to point to the ranks with sinks."""

    SUMMARY_TAG = 7303

    def __init__(self, group: Any) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self._root = dist.get_global_rank(group, 0)
        self._waiter = _P2PWaiter()

    def gather(self, vector: list[float]) -> GatherHandle:
        local = torch.tensor(vector, dtype=torch.float64)
        outputs = [torch.empty_like(local) for _ in range(self.world_size)] if self.rank == 0 else []
        work = self._dist.gather(local, outputs if self.rank == 0 else None, dst=self._root, group=self.group,
                                 async_op=True)
        return _GlooWork(work, outputs, local)

    def broadcast(self, vector: list[float] | None, size: int) -> GatherHandle:
        tensor = torch.tensor(vector, dtype=torch.float64) if vector is not None else torch.zeros(size, dtype=torch.float64)
        work = self._dist.broadcast(tensor, src=self._root, group=self.group, async_op=True)
        return _GlooWork(work, [tensor] if vector is None else [], tensor)

    def send_summary(self, rank: int, vector: list[float]) -> GatherHandle:
        tensor = torch.tensor(vector, dtype=torch.float64)
        work = self._dist.isend(tensor, self._dist.get_global_rank(self.group, rank), group=self.group,
                                tag=self.SUMMARY_TAG)
        return _P2PWork(self._waiter, work, [], tensor)

    def recv_summary(self, size: int) -> GatherHandle:
        tensor = torch.zeros(size, dtype=torch.float64)
        work = self._dist.irecv(tensor, self._root, group=self.group, tag=self.SUMMARY_TAG)
        return _P2PWork(self._waiter, work, [tensor], tensor)


@functools.lru_cache(maxsize=1)
def _p2p_takes_group_ranks() -> bool:
    """``dist.send``/``dist.recv`` take ``group_dst``/``group_src`` (torch 2.6 and newer)."""
    import torch.distributed as dist

    try:
        return "group_dst" in inspect.signature(dist.send).parameters
    except (TypeError, ValueError):
        return False


def sync_clocks(group: Any, clock: Callable[[], int], rounds: int = 16) -> OffsetSample:
    """Measure this rank's clock offset to rank 0 of ``group`` (a CPU/gloo group), after a
    barrier. Collective: every rank of the group calls it."""
    import torch.distributed as dist

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    buffer2 = torch.zeros(2, dtype=torch.int64)
    buffer1 = torch.zeros(1, dtype=torch.int64)
    by_group_rank = _p2p_takes_group_ranks()

    def send(peer: int, values: Sequence[int]) -> None:
        tensor = torch.tensor(list(values), dtype=torch.int64)
        if by_group_rank:
            dist.send(tensor, group=group, group_dst=peer)
        else:  # torch < 2.6: peers by global rank
            dist.send(tensor, dist.get_global_rank(group, peer), group=group)

    def recv(peer: int) -> Sequence[int]:
        target = buffer1 if rank == 0 else buffer2  # pings carry t0, answers (t1, t2)
        if by_group_rank:
            dist.recv(target, group=group, group_src=peer)
        else:
            dist.recv(target, dist.get_global_rank(group, peer), group=group)
        return [int(x) for x in target.tolist()]

    dist.barrier(group=group)
    return measure_offset(rank=rank, world_size=world, clock=clock, send=send, recv=recv, rounds=rounds)


class _ClockRounds:
    """One clock round of this rank, point to point on a gloo group used for nothing else.

    Only host leaders measure: the reference (group rank 0) answers their pings as they arrive
    (:func:`serve_pings`), each other leader pings it (:func:`ping_reference`), and every leader
    then sends its result to the other ranks of its host, which record it as their own (same
    monotonic clock). Tags keep pings and results apart."""

    PING_TAG = 7301
    RESULT_TAG = 7302

    def __init__(self, group: Any, clock: Callable[[], int], rounds: int, keys: Sequence[str]) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.group = group
        self.clock = clock
        self.rounds = rounds
        self.rank = dist.get_rank(group)
        leaders = host_leaders(keys)
        self.leader = leaders[self.rank]
        self.leaders = sorted(set(leaders))
        self.followers = [r for r, leader in enumerate(leaders) if leader == self.rank and r != self.rank]
        if leaders[0] != 0:  # pragma: no cover - host_leaders gives rank 0 itself
            raise ValueError("rank 0 must lead its host")

    def _send(self, peer: int, values: Sequence[int], tag: int) -> None:
        tensor = torch.tensor(list(values), dtype=torch.int64)
        if _p2p_takes_group_ranks():
            self._dist.send(tensor, group=self.group, group_dst=peer, tag=tag)
        else:  # torch < 2.6: peers by global rank
            self._dist.send(tensor, self._dist.get_global_rank(self.group, peer), group=self.group, tag=tag)

    def _recv(self, peer: int, size: int, tag: int) -> list[int]:
        buffer = torch.zeros(size, dtype=torch.int64)
        if _p2p_takes_group_ranks():
            self._dist.recv(buffer, group=self.group, group_src=peer, tag=tag)
        else:
            self._dist.recv(buffer, self._dist.get_global_rank(self.group, peer), group=self.group, tag=tag)
        return [int(x) for x in buffer.tolist()]

    def _recv_any(self) -> tuple[int, Sequence[int]]:
        buffer = torch.zeros(1, dtype=torch.int64)
        sender = self._dist.recv(buffer, group=self.group, tag=self.PING_TAG)
        return self._dist.get_group_rank(self.group, sender), [int(buffer.item())]

    def measure(self) -> OffsetSample:
        if self.rank == 0:
            serve_pings((len(self.leaders) - 1) * self.rounds, clock=self.clock, recv_any=self._recv_any,
                        send=lambda peer, values: self._send(peer, values, self.PING_TAG))
            sample = OffsetSample(0, 0)
        elif self.leader == self.rank:
            sample = ping_reference(
                reference_rank=0, clock=self.clock, rounds=self.rounds,
                send=lambda peer, values: self._send(peer, values, self.PING_TAG),
                recv=lambda peer: self._recv(peer, 2, self.PING_TAG),
            )
        else:
            offset, rtt = self._recv(self.leader, 2, self.RESULT_TAG)
            sample = OffsetSample(offset, rtt)
        for follower in self.followers:
            self._send(follower, (sample.offset_ns, sample.rtt_ns), self.RESULT_TAG)
        return sample
