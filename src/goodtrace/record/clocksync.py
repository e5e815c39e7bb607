"""Clock offsets between ranks, measured inside the job (framework-neutral).

:func:`measure_offset` runs an NTP-like ping-pong between this rank and the reference rank
through two callables, ``send(peer, values)`` and ``recv(peer) -> values`` (lists of ints), and
keeps the sample with the smallest round trip. The result says
``reference_clock = local_clock + offset_ns`` with an error of at most ``rtt_ns / 2``.
torch.distributed (``goodtrace.integrations.torch``) and JAX adapters supply the callables; the
recorder stores each measurement as a ``clock`` record, which the analysis turns into one
mapping of each rank's clock (:mod:`goodtrace.analysis.clock`).

At scale (:class:`BackgroundClockSync`): ranks on one host share its monotonic clock, so only one
rank per host (its *leader*, :func:`host_leaders`) measures; the reference answers the leaders'
pings in whatever order they arrive (:func:`serve_pings`), so hosts measure in parallel; each
leader passes its result to the other ranks of its host; and all of it runs on a daemon thread,
so the training thread only asks for a round and never waits for one.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence

from goodtrace.record.threads import Thread

__all__ = [
    "BackgroundClockSync",
    "OffsetSample",
    "estimate_offset",
    "host_leaders",
    "measure_offset",
    "ping_reference",
    "serve_pings",
]

Send = Callable[[int, Sequence[int]], None]
Recv = Callable[[int], Sequence[int]]
RecvAny = Callable[[], tuple[int, Sequence[int]]]  # (peer, values) from whichever peer sent first


@dataclasses.dataclass(frozen=True)
class OffsetSample:
    """``reference_clock ≈ local_clock + offset_ns``, accurate to ``rtt_ns / 2``."""

    offset_ns: int
    rtt_ns: int


def estimate_offset(t0: int, t1: int, t2: int, t3: int) -> OffsetSample:
    """One ping-pong: sent at local ``t0``, received at reference ``t1``, answered at reference
    ``t2``, answer received at local ``t3``. Assumes symmetric one-way delays (as NTP does)."""
    return OffsetSample(offset_ns=((t1 - t0) + (t2 - t3)) // 2, rtt_ns=(t3 - t0) - (t2 - t1))


def measure_offset(
    *,
    rank: int,
    world_size: int,
    clock: Callable[[], int],
    send: Send,
    recv: Recv,
    rounds: int = 16,
    reference_rank: int = 0,
) -> OffsetSample:
    """Every rank calls this together. The reference rank answers ``rounds`` pings from each
    other rank in turn (and returns a zero offset); every other rank returns its min-RTT sample.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if not 0 <= reference_rank < world_size or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} / reference rank {reference_rank} not in a world of {world_size}")
    if rank == reference_rank:
        for peer in range(world_size):
            if peer == reference_rank:
                continue
            for _ in range(rounds):
                recv(peer)
                t1 = clock()
                send(peer, (t1, clock()))
        return OffsetSample(0, 0)
    return ping_reference(reference_rank=reference_rank, clock=clock, send=send, recv=recv, rounds=rounds)


def ping_reference(*, reference_rank: int, clock: Callable[[], int], send: Send, recv: Recv, rounds: int) -> OffsetSample:
    """A non-reference rank's half: ``rounds`` ping-pongs, the sample with the smallest round trip."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    best: OffsetSample | None = None
    for _ in range(rounds):
        t0 = clock()
        send(reference_rank, (t0,))
        answer = recv(reference_rank)
        t3 = clock()
        sample = estimate_offset(t0, int(answer[0]), int(answer[1]), t3)
        if best is None or sample.rtt_ns < best.rtt_ns:
            best = sample
    assert best is not None  # rounds >= 1
    return best


def serve_pings(count: int, *, clock: Callable[[], int], recv_any: RecvAny, send: Send) -> None:
    """The reference's half when many ranks measure at once: answer ``count`` pings, each from
    whichever rank sent next, with (receive time, send time). Ranks are served as their pings
    arrive, so their round trips overlap instead of queueing one rank after another."""
    for _ in range(count):
        peer, _ = recv_any()
        t1 = clock()
        send(peer, (t1, clock()))


def host_leaders(keys: Sequence[str]) -> list[int]:
    """For ranks ``0..len(keys)-1`` with the clock key of each (its host, when it reads the host's
    monotonic clock; something unique otherwise), the rank whose measurement each one uses: the
    lowest rank with the same key."""
    first: dict[str, int] = {}
    return [first.setdefault(key, rank) for rank, key in enumerate(keys)]


class BackgroundClockSync:
    """Clock rounds on a daemon thread. ``request()`` (the training thread's whole cost: setting
    an event) asks for one more round; the thread runs ``measure()`` once per request, in order,
    and hands each result to ``on_result(sample, t0, t1)``. A failing round calls
    ``on_error(exc)`` and stops the thread: later requests are ignored.

    Every rank must request the same rounds (the same steps), as the old collective required;
    the rounds themselves are point-to-point and never block the requester.
    """

    def __init__(
        self,
        measure: Callable[[], OffsetSample],
        on_result: Callable[[OffsetSample, int, int], None],
        on_error: Callable[[BaseException], None],
        clock: Callable[[], int] = time.perf_counter_ns,
        name: str = "goodtrace-clocksync",
    ) -> None:
        self._measure = measure
        self._on_result = on_result
        self._on_error = on_error
        self._clock = clock
        self._cond = threading.Condition()
        self._requested = 0
        self._done = 0
        self._failed = False
        self._stopped = False
        self.blocked_ns: list[int] = []  # the requesting thread's time in request(), per round
        self.round_cpu_ns: list[int] = []  # CPU time of this thread per round (at most what it takes from others)
        self._thread = Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def failed(self) -> bool:
        return self._failed

    def request(self) -> None:
        t0 = time.perf_counter_ns()
        with self._cond:
            if not self._failed and not self._stopped:
                self._requested += 1
                self._cond.notify_all()
        self.blocked_ns.append(time.perf_counter_ns() - t0)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for every requested round; True if all completed."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._done < self._requested and not self._failed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(timeout=left)
            return not self._failed

    def close(self, timeout: float) -> bool:
        """Let the requested rounds finish (up to ``timeout`` s), then stop. Never joins without
        a timeout: a round stuck on a dead peer must not hold the process."""
        done = self.wait(timeout)
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if done:
            self._thread.join(timeout=1.0)
        return done

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._done >= self._requested and not self._stopped:
                    self._cond.wait()
                if self._done >= self._requested:
                    return
            t0 = self._clock()
            cpu0 = time.thread_time_ns()
            try:
                sample = self._measure()
                self.round_cpu_ns.append(time.thread_time_ns() - cpu0)
                self._on_result(sample, t0, self._clock())
            except BaseException as exc:
                with self._cond:
                    self._failed = True
                    self._cond.notify_all()
                try:
                    self._on_error(exc)
                except BaseException:
                    pass
                return
            with self._cond:
                self._done += 1
                self._cond.notify_all()
