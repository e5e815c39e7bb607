"""The value-adapter protocol: how goodtrace tests, waits on and reads one kind of value.

A leaf of the recording layer: the adapter registry (:mod:`goodtrace.record.values`) and the
framework adapters (:mod:`goodtrace.record.torch_values`, :mod:`goodtrace.record.jax_values`)
all build on it, and it imports none of them.
"""

from __future__ import annotations

from typing import Any, Protocol


class ValueAdapter(Protocol):
    """How goodtrace handles one kind of value. ``prepare`` runs on the hot path (cheap)."""

    host: bool  # True: complete on arrival, never waits

    def prepare(self, value: Any) -> Any: ...

    def ready(self, handle: Any) -> bool | None: ...

    def wait(self, handle: Any) -> None: ...

    def to_float(self, handle: Any) -> float: ...


class UnsupportedValue(TypeError):
    """The value is of a type goodtrace cannot wait on or read."""


class HostNumber:
    """A value already on the host (Python or NumPy number, CPU tensor): complete on arrival."""

    host = True

    def prepare(self, value: Any) -> Any:
        return value

    def ready(self, handle: Any) -> bool | None:
        return True

    def wait(self, handle: Any) -> None:
        return None

    def to_float(self, handle: Any) -> float:
        return float(handle)
