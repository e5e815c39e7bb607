"""Rewinds inside one session: a rollback (reload a checkpoint, run the same steps again) or an
in-process restart, found once when a session is cut (docs/semantics.md sections 1.8 and 4.4).

:func:`find_rewinds` takes a session's executions (step numbers in entry order, entry times)
and its ``rollback`` events, and returns which executions a later rewind threw away (their
productive time becomes ``wasted_progress``, their rows "re-done later") and one
:class:`Rewind` per rewind. The rules:

- the program's word first: ``gt.event("rollback", to_step=4)`` says the state of step 4 was
  restored at that instant; every earlier execution of a higher step number was thrown away,
  and the execution after it, when it runs a step above that one, is not read as a rewind of
  its own (one that runs a step at or below it is: the event does not explain it);
- otherwise a step number lower than the one before it (8 then 5) is a rewind to the state
  after step 4: the earlier executions of steps 5 and up were thrown away. A number equal to
  the one before (1, 2, 2, 3) is a retry of that step, not a rewind: both executions count;
- an execution thrown away by one rewind is counted by that rewind only (two rewinds over the
  same steps never count it twice);
- the recovery itself is no step's work: in the interval of the first execution after a rewind,
  the time before the rewind (the loss check, an in-process restart's re-initialisation) that
  no overhead span covers is ``disruption`` (:func:`charge_recovery`), as the time after a
  crashed attempt's last sync point is; the restore span stays ``checkpoint_restore``.

:func:`rewind_rows` turns the reference rank's rewinds into the :class:`RewindRow` every view
shows (``RunAnalysis.rewinds``: the attempts section, ``--json``, the HTML notes, the sinks'
summary; the trace draws every rank's from the cuts).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from goodtrace import schema

if TYPE_CHECKING:
    from goodtrace.analysis.cut import Relabels

__all__ = [
    "ROLLBACK_EVENT",
    "Rewind",
    "RewindRow",
    "charge_recovery",
    "find_rewinds",
    "rewind_rows",
    "rewind_warning",
    "rollback_targets",
]

ROLLBACK_EVENT = schema.EVENT_ROLLBACK


@dataclasses.dataclass(frozen=True)
class Rewind:
    """One rewind of a session, on its own monotonic clock.

    ``to_step`` is the step whose state was restored (the program's ``to_step``, else one below
    the first step run again); ``from_step`` the highest step run before it since the previous
    rewind; ``resume_step`` the first step run after it (None: nothing ran after it);
    ``thrown`` the executions (indexes in the session's cut) it threw away, in entry order;
    ``skipped`` how many of them have a step number below ``resume_step`` (batches the rollback
    skipped: thrown away, never run again right after it)."""

    t: int
    from_step: int | None
    to_step: int
    resume_step: int | None
    thrown: tuple[int, ...]
    skipped: int
    explicit: bool
    resume: int = -1  # the index of the first execution after it (the count of executions: none)

    @property
    def redone(self) -> int:
        return len(self.thrown)


def rollback_targets(events: Sequence[tuple[str, int, int | None]]) -> list[tuple[int, int]]:
    """``(t, to_step)`` of the session's rollback events, by time (the recorder writes a
    rollback's ``to_step`` in the event's step field; one without it names no step)."""
    return sorted((t, step) for name, t, step in events if name == ROLLBACK_EVENT and step is not None)


def find_rewinds(numbers: Any, t0s: Any, events: Sequence[tuple[str, int, int | None]]) -> tuple[Any, list[Rewind]]:
    """The executions a later rewind threw away (a bool array over ``numbers``) and the
    rewinds, in time order (see the module docstring). ``numbers`` and ``t0s`` are int64
    arrays of the session's executions in entry order."""
    import numpy as np

    n = len(numbers)
    thrown = np.zeros(n, dtype=bool)
    targets = rollback_targets(events)
    decreasing = np.flatnonzero(numbers[1:] < numbers[:-1]) + 1 if n > 1 else np.zeros(0, dtype=np.int64)
    if not targets and not len(decreasing):
        return thrown, []
    # each rewind: (time, position of the first execution after it, to_step, explicit)
    points: list[tuple[int, int, int, bool]] = []
    explained: set[int] = set()  # executions a rollback event right before them explains
    for t, to_step in targets:
        j = int(np.searchsorted(t0s, t, side="left"))
        points.append((t, j, to_step, True))
        if j < n and numbers[j] > to_step:
            explained.add(j)
    for j in decreasing.tolist():
        if j not in explained:
            points.append((int(t0s[j]), j, int(numbers[j]) - 1, False))
    points.sort(key=lambda p: (p[0], p[1], not p[3]))
    rewinds: list[Rewind] = []
    segment_start = 0
    for t, j, to_step, explicit in points:
        before = numbers[:j]
        lost = np.flatnonzero((before > to_step) & ~thrown[:j])
        thrown[lost] = True
        resume = int(numbers[j]) if j < n else None
        high = int(numbers[segment_start:j].max()) if j > segment_start else None
        skipped = int((numbers[lost] < resume).sum()) if resume is not None else 0
        rewinds.append(Rewind(t, high, to_step, resume, tuple(lost.tolist()), skipped, explicit, j))
        segment_start = j
    return thrown, rewinds


def charge_recovery(cut: Any) -> None:
    """Move each rewind's recovery out of the productive time of the interval that holds it
    (``SessionCut.recovered``, ``interval_overhead["disruption"]``): the productive part of
    (interval start, rewind] when the interval begins with the first execution after the
    rewind (an interval that also holds earlier executions is theirs: left alone)."""
    from array import array

    for r in cut.rewinds:
        if r.resume >= len(cut.exec_interval) or (w := cut.exec_interval[r.resume]) < 0 or cut.interval_first[w] != r.resume:
            continue
        until = min(r.t, cut.interval_end[w])
        amount = sum(min(p.end, until) - p.start for p in cut.interval_pieces(w)
                     if p.label == schema.BUCKET_PRODUCTIVE and p.start < until)
        if amount > 0:
            cut.recovered[w] = cut.recovered.get(w, 0) + amount
            cut.interval_productive[w] -= amount
            column = cut.interval_overhead.get(schema.BUCKET_DISRUPTION)
            if column is None:
                column = cut.interval_overhead[schema.BUCKET_DISRUPTION] = array("q", bytes(8 * len(cut.interval_start)))
            column[w] += amount


@dataclasses.dataclass(frozen=True)
class RewindRow:
    """A rewind of the reference rank, as every view shows it: ``time_s`` from the job start,
    ``wasted_s`` the productive time of the executions it threw away (now ``wasted_progress``)."""

    rank: int
    attempt: int
    session: int
    t: int  # on the session's monotonic clock (the trace maps it with the analysis's clocks)
    time_s: float
    from_step: int | None
    to_step: int
    resume_step: int | None
    redone: int
    skipped: int
    explicit: bool
    wasted_s: float

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        del out["session"], out["t"]
        return out | {"text": self.text()}

    def text(self) -> str:
        """``rolled back from step 8 to 4 at +2.3 s, 4 steps re-done (1.21 s wasted)``."""
        source = "" if self.from_step is None else f" from step {self.from_step}"
        steps = f"{self.redone} step{'s' if self.redone != 1 else ''}"
        what = f"{steps} re-done"
        if self.skipped:
            what = f"{steps} thrown away ({self.skipped} skipped: resumed at step {self.resume_step})"
        how = "" if self.explicit else "; inferred from the step numbers"
        return f"rolled back{source} to {self.to_step} at +{self.time_s:.1f} s, {what} ({self.wasted_s:.2f} s wasted{how})"


def rewind_rows(
    cuts: Sequence[Any], relabels: dict[int, Relabels], attempt_of: dict[int, int],
    sessions: Sequence[Any], job_start: int,
) -> list[RewindRow]:
    """The rewinds of the reference timeline's cuts (``SessionCut``), each with the productive
    time of the executions it threw away: their share of their interval's productive time (after
    the warm-up relabel, as the step table shows it)."""
    rows: list[RewindRow] = []
    for cut in cuts:
        info = sessions[cut.session]
        attempt = attempt_of.get(cut.session, -1)
        relabels_of = relabels.get(cut.session)
        warmup = 0 if relabels_of is None else relabels_of.warmup_ns
        for r in cut.rewinds:
            wasted = 0.0
            for i in r.thrown:
                w = cut.exec_interval[i]
                if w >= 0:
                    wasted += (cut.interval_productive[w] - (warmup if w == 0 else 0)) / cut.interval_count[w] / 1e9
            rows.append(RewindRow(info.rank, attempt, cut.session, r.t, (info.wall(r.t) - job_start) / 1e9,
                                  r.from_step, r.to_step, r.resume_step, r.redone, r.skipped, r.explicit, wasted))
    return rows


def rewind_warning(rows: Sequence[RewindRow]) -> str:
    """The report's warning about rewinds (inferred ones may be a loop numbered per epoch)."""
    inferred = sum(1 for r in rows if not r.explicit)
    text = (f"{len(rows)} rollback(s) inside an attempt: the executions they threw away are wasted_progress, "
            "marked re-done later")
    if inferred:
        text += (f"; {inferred} inferred from step numbers that went back (a loop that numbers steps per epoch "
                 "should number them globally; gt.event('rollback', to_step=N) says a rollback outright)")
    return text
