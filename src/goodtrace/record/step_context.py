"""``with gt.step(n) as s:``: one execution of a step, as the recorder hands it to the program.

The context only forwards to its recorder (:class:`goodtrace.record.recorder.Recorder`), which
owns the step's timing; it carries what the recorder tracks per execution (number, ``seq``,
start, sync state, the barrier of a blocking span).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from goodtrace.record.values.readiness import Pending

if TYPE_CHECKING:
    from goodtrace.record.recorder import Recorder


class StepContext:
    """``with gt.step(n) as s:`` sets the ambient step; ``s.complete_on(loss)`` marks its end.

    One object per execution of a step: ``seq`` numbers executions in entry order within the
    session, so a repeated or decreasing step number is still its own execution.
    """

    __slots__ = ("_rec", "barrier", "number", "seq", "sync", "t0")

    def __init__(self, rec: Recorder, number: int) -> None:
        self._rec = rec
        self.number = number
        self.t0 = 0
        self.seq = -1  # also how many steps had ended when it began (steps do not nest): the lag
        # None: no completion value yet; a Pending: its completion (a sync point once taken);
        # True: its sync point is written (nothing more is added to it).
        self.sync: Pending | bool | None = None
        # A blocking span started in it before its completion value: the device barrier's
        # instant (> 0), or -1 when there was no barrier to run.
        self.barrier = 0

    def __enter__(self) -> StepContext:
        self._rec.begin_step(self)
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._rec.end_step(self)

    def complete_on(self, value: object) -> None:
        """The step is complete when ``value`` is (dated when it became ready)."""
        self._rec.complete_execution(self, self.number, value)
