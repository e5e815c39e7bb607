"""The value-adapter protocol: how goodtrace tests, waits on and reads one kind of value.

A leaf of the recording layer: the adapter registry (:mod:`goodtrace.record.values.adapters`) and the
framework adapters (:mod:`goodtrace.record.values.torch_values`, :mod:`goodtrace.record.values.jax_values`)
all build on it, and it imports none of them.
"""

from __future__ import annotations

from typing import Any, Final, Protocol


class ValueAdapter(Protocol):
    """How goodtrace handles one kind of value.

    ``prepare`` (a step's completion value) and ``prepare_read`` (a metric value) run on the
    training thread's hot path and must be cheap and never wait. ``ready`` must never wait
    either, and is also called from goodtrace's readiness thread (``goodtrace-ready``), so it
    must be safe to call from any thread. ``wait``, ``to_float`` and ``barrier`` may wait.
    """

    host: bool  # True: complete on arrival, never waits

    def prepare(self, value: Any) -> Any:
        """A handle on a step's completion value (or :data:`COMPLETE`)."""
        ...

    def prepare_read(self, value: Any) -> Any:
        """A handle from which ``to_float`` reads the value later (a metric)."""
        ...

    def ready(self, handle: Any) -> bool | None:
        """Whether the value is complete now, without waiting; None: cannot tell."""
        ...

    def wait(self, handle: Any) -> None: ...

    def to_float(self, handle: Any) -> float: ...

    def barrier(self, handle: Any) -> bool:
        """Wait for all work dispatched so far on the device that produced ``handle``'s value
        (before a blocking span of a step with no completion value yet). False: no barrier."""
        ...


class UnsupportedValue(TypeError):
    """The value is of a type goodtrace cannot wait on or read."""


class _Complete:
    __slots__ = ()

    def __repr__(self) -> str:
        return "COMPLETE"


# What ``prepare`` returns for a value that is complete on arrival although its type may not be
# (a CPU tensor: torch tensors share one type whatever their device). Its step's sync point is
# then taken when the step ends ("ready"), as for a loop that synchronised itself.
COMPLETE: Final = _Complete()


class HostTimed:
    """What ``prepare`` returns for a value whose completion cannot be tested without waiting
    (a torch XLA tensor, or an MPS one where torch has no MPS events): its step gets no sync
    point of it, so it is closed at its host exit and labelled host-timed, with one warning
    naming ``what``."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what


class HostNumber:
    """A value already on the host (Python or NumPy number, CPU tensor): complete on arrival."""

    host = True

    def prepare(self, value: Any) -> Any:
        return value

    def prepare_read(self, value: Any) -> Any:
        return value

    def ready(self, handle: Any) -> bool | None:
        return True

    def wait(self, handle: Any) -> None:
        return None

    def to_float(self, handle: Any) -> float:
        return float(handle)

    def barrier(self, handle: Any) -> bool:
        return False
