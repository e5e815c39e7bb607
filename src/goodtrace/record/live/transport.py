"""How the live line's vectors travel. Either an asynchronous all-gather of one equally sized
float vector per rank (:class:`Transport`: JAX's multi-host utilities; :class:`LocalTransport`,
the one-process case), or a rooted exchange (:class:`RootedTransport`: PyTorch's gloo group
with ``async_op``): every vector gathered to rank 0 only, which then broadcasts the small part
every rank needs and sends the merged line to the ranks with sinks (live/rooted.py), so that a
rank's traffic per log step does not grow with the number of ranks."""

from __future__ import annotations

from typing import Protocol

__all__ = ["GatherHandle", "LocalTransport", "RootedTransport", "Transport"]


class GatherHandle(Protocol):
    """An all-gather in flight."""

    def done(self) -> bool:
        """True when :meth:`wait` would return at once (never blocks)."""
        ...

    def wait(self) -> list[list[float]]:
        """One vector per rank, in rank order (blocks until the gather completes)."""
        ...


class Transport(Protocol):
    """Gathers one equally sized float vector from every rank, asynchronously."""

    rank: int
    world_size: int

    def all_gather(self, vector: list[float]) -> GatherHandle: ...


class RootedTransport(Protocol):
    """Gather to rank 0, broadcast from it, and point to point from it; all asynchronous.

    Every rank issues the same gathers and broadcasts in the same order; a rank that will get
    a summary (:meth:`recv_summary`) says so in its gathered vector, so that rank 0 sends it
    exactly one per gather."""

    rank: int
    world_size: int

    def gather(self, vector: list[float]) -> GatherHandle:
        """Rank 0: ``wait()`` gives every rank's vector; the others: ``[]``."""
        ...

    def broadcast(self, vector: list[float] | None, size: int) -> GatherHandle:
        """Rank 0 sends ``vector``; the others pass None and get ``[vector]`` of ``size`` floats."""
        ...

    def send_summary(self, rank: int, vector: list[float]) -> GatherHandle:
        """Rank 0 sends one rank its summary."""
        ...

    def recv_summary(self, size: int) -> GatherHandle:
        """A rank other than 0 receives its summary: ``[vector]``."""
        ...


class _Done:
    def __init__(self, vectors: list[list[float]]) -> None:
        self._vectors = vectors

    def done(self) -> bool:
        return True

    def wait(self) -> list[list[float]]:
        return self._vectors


class LocalTransport:
    """One process, no collective: the gather is the vector itself."""

    rank = 0
    world_size = 1

    def all_gather(self, vector: list[float]) -> GatherHandle:
        return _Done([list(vector)])
