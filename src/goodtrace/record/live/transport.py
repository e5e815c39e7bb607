"""How the live line's vectors travel: an asynchronous all-gather of one equally sized float
vector per rank. The framework integrations provide one over the job's distributed engine
(PyTorch: gloo with ``async_op``; JAX: its multi-host utilities); :class:`LocalTransport` is
the one-process case."""

from __future__ import annotations

from typing import Protocol

__all__ = ["GatherHandle", "LocalTransport", "Transport"]


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
