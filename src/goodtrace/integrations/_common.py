"""What the torch and JAX integrations share: the model announcement, and the lifecycle of
the hooks ``instrument()`` installs (recorder listeners and the live aggregator).

Collectives at the end only when every rank ends normally: ``finish(completed=True)``, called
outside an exception handler, closes an integration collectively (the live aggregator's last
log interval is a gather, bounded by ``finish_timeout_s``). Any other end only unhooks, locally:
``finish(completed=False)`` (a rank stopping early, or crashing from an ``except`` block), a
``finish()`` while an exception is being handled, a signal, interpreter exit. A crashing rank
must never enter a collective: its peers are not in it, and it would wait for them until the
group's timeout (120 s under torch, without end under JAX) before writing its finish record.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from goodtrace.record.errors import warn as _warn


def warn(message: str) -> None:
    _warn(message, stacklevel=3)


def check_cadence(log_every: object, clock_sync_every: object, clock_sync_rounds: object) -> None:
    """``instrument()``'s cadence arguments, as every framework integration takes them."""
    for label, number in (("log_every", log_every), ("clock_sync_every", clock_sync_every),
                          ("clock_sync_rounds", clock_sync_rounds)):
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            raise ValueError(f"{label} must be a non-negative int, got {number!r}")
    if log_every == 0 or clock_sync_rounds == 0:
        raise ValueError("log_every and clock_sync_rounds must be at least 1")


def announce_model(
    recorder: Any, tokens_per_step: float | None, flops_per_step: float | None, peak_flops: float | None
) -> None:
    """Record the model's size: an event for people, step-less metrics for the offline analysis
    (which reads model FLOPs and tokens per step from them)."""
    if tokens_per_step is None and flops_per_step is None:
        return
    recorder.event("model", {"tokens_per_step": tokens_per_step, "flops_per_step": flops_per_step,
                             "peak_flops": peak_flops})
    if flops_per_step is not None:
        recorder.metric("flops_per_step", float(flops_per_step), "last", None)
    if tokens_per_step is not None:
        recorder.metric("tokens_per_step", float(tokens_per_step), "last", None)


def ending_normally(completed: bool | None, reason: str) -> bool:
    """True for an explicit ``finish(completed=True)`` outside an exception handler: the one end
    at which every rank can be expected in the same collective."""
    return reason == "finish" and completed is True and sys.exc_info()[0] is None


class Integration:
    """Base of ``TorchIntegration`` and ``JaxIntegration``: registers listeners so they can be
    removed exactly once, and closes the live aggregator."""

    aggregator: Any = None

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder
        self._closed = False
        self._hooks: list[tuple[list[Any], Callable[..., None]]] = []

    def _listen(self, listeners: list[Any], hook: Callable[..., None], *, first: bool = False) -> None:
        if first:
            listeners.insert(0, hook)
        else:
            listeners.append(hook)
        self._hooks.append((listeners, hook))

    def _on_finish(self, completed: bool | None, reason: str) -> None:
        if ending_normally(completed, reason):  # every rank finishes: collectives are safe
            self.close()
        else:
            self._unhook()

    def close(self) -> None:
        """Complete the last log intervals (collective), then remove the hooks."""
        if self._closed:
            return
        try:
            self._before_close()
            if self.aggregator is not None:
                self.aggregator.close()
        finally:
            self._unhook()

    def _before_close(self) -> None:
        """What must happen before the last log interval closes (subclasses)."""

    def _unhook(self) -> None:
        if self._closed:
            return
        self._closed = True
        for listeners, hook in self._hooks:
            if hook in listeners:
                listeners.remove(hook)
        self._hooks.clear()
        if self.aggregator is not None:
            self.aggregator.abandon()
        self._after_unhook()

    def _after_unhook(self) -> None:
        """Remove hooks installed outside the recorder (subclasses)."""


class Disabled:
    """What ``instrument()`` returns when goodtrace is not recording: does nothing."""

    aggregator = None

    def close(self) -> None:
        return None
