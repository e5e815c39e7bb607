"""Clock offsets between ranks, measured inside the job (framework-neutral).

:func:`measure_offset` runs an NTP-like ping-pong between this rank and the reference rank
through two callables, ``send(peer, values)`` and ``recv(peer) -> values`` (lists of ints), and
keeps the sample with the smallest round trip. The result says
``reference_clock = local_clock + offset_ns`` with an error of at most ``rtt_ns / 2``.
torch.distributed (``goodtrace.integrations.torch``) and JAX adapters supply the callables; the
recorder stores each measurement as a ``clock`` record, which the analysis turns into one
mapping of each rank's clock (:mod:`goodtrace.analysis.clock`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

__all__ = ["OffsetSample", "estimate_offset", "measure_offset"]

Send = Callable[[int, Sequence[int]], None]
Recv = Callable[[int], Sequence[int]]


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
