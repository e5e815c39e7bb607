"""Attempts and jobs: which sessions were launched together, how each attempt ended, and
whether the run directory holds more than one job.

Pure functions over ``SessionInfo``. An attempt opens when a session starts after every
session of the current attempt went quiet, when a rank shows up a second time, or when the
launcher's restart counter changes. A new *job* (an unrelated job reusing the run directory)
opens when the previous attempt finished cleanly and the new one goes back in steps, when the
launcher restart counter goes backwards, or when the recorded submit time differs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from goodtrace.read.loaded import SessionInfo
from goodtrace.read.sessions import number_attempts

FINISHED = "finished"
PREEMPTED = "preempted"
EXITED = "exited"  # interpreter exit without finish(): completed unknown
CRASHED = "crashed"
RUNNING = "running"  # no finish record yet, but alive moments ago (a live run)
LIVE_WINDOW_NS = 30 * 10**9


def assign_attempts(sessions: Sequence[SessionInfo]) -> list[int]:
    """Attempt number of each session (indexed like ``sessions``): the reader's one rule."""
    return number_attempts([(s.rank, s.restart, s.start_wall, s.last_seen_wall) for s in sessions])


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One launch of the job's processes."""

    index: int  # within the run directory
    job: int
    sessions: tuple[int, ...]  # session indexes
    ranks: int
    world: int
    reference_session: int  # the session whose timeline stands for the attempt (rank 0)
    start_wall: int  # reference rank's process start
    end_wall: int  # its finish, or last sign of life when it crashed
    ended: str  # finished / preempted / exited / crashed
    first_step: int | None
    last_step: int | None
    restart_counter: int | None

    @property
    def duration_ns(self) -> int:
        return self.end_wall - self.start_wall

    def to_dict(self) -> dict[str, object]:
        return {
            "index": self.index,
            "job": self.job,
            "ranks": self.ranks,
            "world": self.world,
            "start_wall_ns": self.start_wall,
            "end_wall_ns": self.end_wall,
            "duration_s": self.duration_ns / 1e9,
            "ended": self.ended,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "restart_counter": self.restart_counter,
        }


def how_ended(session: SessionInfo) -> str:
    if not session.has_finish:
        return CRASHED
    if session.finish_completed is True:
        return FINISHED
    if session.finish_completed is False or session.preempt_events:
        return PREEMPTED
    return EXITED


def discover_attempts(
    sessions: Sequence[SessionInfo],
    warnings: list[str] | None = None,
    *,
    now_wall_ns: int | None = None,
    live_window_ns: int = LIVE_WINDOW_NS,
) -> list[Attempt]:
    """Attempts in order, each with its job number (see the module docstring). Given the
    current time, a last attempt without a finish record that showed life within
    ``live_window_ns`` is ``running`` rather than ``crashed``."""
    numbers = assign_attempts(sessions)
    groups: dict[int, list[SessionInfo]] = {}
    for s, n in zip(sessions, numbers, strict=True):
        groups.setdefault(n, []).append(s)
    attempts: list[Attempt] = []
    job = 0
    previous: Attempt | None = None
    previous_submit: int | None = None
    for n in sorted(groups):
        members = sorted(groups[n], key=lambda s: s.rank)
        reference = members[0]
        if reference.rank != 0 and warnings is not None:
            warnings.append(
                f"attempt {n}: rank 0 has no records; rank {reference.rank}'s timeline stands for the job"
            )
        steps = [s.first_step for s in members if s.first_step is not None]
        last_steps = [s.last_step for s in members if s.last_step is not None]
        first_step = min(steps) if steps else None
        submit = reference.submit_wall
        if previous is not None:
            backwards = (
                first_step is not None and previous.last_step is not None and first_step <= previous.last_step
            )
            counter_back = (
                reference.restart is not None
                and previous.restart_counter is not None
                and reference.restart < previous.restart_counter
            )
            other_submit = submit is not None and previous_submit is not None and submit != previous_submit
            if (previous.ended == FINISHED and backwards) or counter_back or other_submit:
                job += 1
                if warnings is not None:
                    why = (
                        "a different submit time" if other_submit else
                        "the launcher restart counter went back" if counter_back else
                        f"the previous attempt finished at step {previous.last_step} and this one "
                        f"starts again at step {first_step}"
                    )
                    warnings.append(
                        f"the run directory holds an unrelated job from attempt {n} on ({why}): "
                        "a reused run directory; the jobs are reported separately"
                    )
        attempt = Attempt(
            index=n,
            job=job,
            sessions=tuple(s.index for s in members),
            ranks=len(members),
            world=max(s.world for s in members),
            reference_session=reference.index,
            start_wall=reference.start_wall,
            end_wall=reference.last_seen_wall,
            ended=how_ended(reference),
            first_step=first_step,
            last_step=max(last_steps) if last_steps else None,
            restart_counter=reference.restart,
        )
        attempts.append(attempt)
        previous = attempt
        previous_submit = submit if submit is not None else previous_submit
    if attempts and now_wall_ns is not None:
        last = attempts[-1]
        if last.ended == CRASHED and now_wall_ns - last.end_wall <= live_window_ns:
            attempts[-1] = dataclasses.replace(last, ended=RUNNING)
    return attempts
