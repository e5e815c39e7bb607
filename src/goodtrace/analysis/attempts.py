"""Attempts and jobs: which sessions were launched together, how each attempt ended, and
whether the run directory holds more than one job.

Pure functions over ``SessionInfo``. An attempt opens when a session starts after every
session of the current attempt went quiet, when a rank shows up a second time (a process of
it starts after its earlier one went quiet: processes claiming one rank at the same time are
one attempt, warned about), or when the launcher's restart counter changes (:func:`goodtrace.read.sessions.number_attempts`). A new
*job* (an unrelated job reusing the run directory) opens when the previous attempt completed
and the new one goes back in steps, when the launcher restart counter goes backwards, or when
the recorded submit time differs.

How a session ended: ``completed`` / ``stopped early`` (``finish()``), ``crashed`` (an uncaught
exception, named), ``preempted`` (SIGTERM), ``exited`` (interpreter exit without ``finish()``),
``hung`` (the hang watchdog ended it),
and without a finish record ``killed`` (a later attempt exists), ``running`` (alive moments ago)
or ``lost`` (no heartbeat since ...). An attempt's ending is its first rank's ending in time:
when one rank crashes and the launcher then stops the others, the attempt ``crashed (rank R:
...)``, not ``preempted``.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Mapping, Sequence

from goodtrace.read.loaded import SessionInfo
from goodtrace.read.sessions import number_attempts

COMPLETED = "completed"
STOPPED = "stopped early"
CRASHED = "crashed"
PREEMPTED = "preempted"
EXITED = "exited"  # interpreter exit without finish(): completed unknown
HUNG = "hung"  # the hang watchdog finished it (on_hang="abort"): goodtrace.record.hang
KILLED = "killed"  # no finish record, and a later attempt exists
LOST = "lost"  # no finish record, heartbeats stopped, nothing newer
RUNNING = "running"  # no finish record yet, but alive moments ago (a live run)
NORMAL_ENDINGS = frozenset({COMPLETED, STOPPED, EXITED})
MIN_STALE_NS = 10 * 10**9  # heartbeats are stale after 5 flush intervals, and at least this long

# (host, pid, process start on the wall clock) -> True (alive), False (gone: no such process, or
# the pid is another process's now, started after that one) or None (cannot tell: another host)
Liveness = Callable[[str, int, int], bool | None]


def assign_attempts(sessions: Sequence[SessionInfo]) -> list[int]:
    """Attempt number of each session (indexed like ``sessions``): the reader's one rule."""
    return number_attempts([(s.rank, s.restart, s.start_wall, s.last_seen_wall, s.wall(s.init)) for s in sessions])


@dataclasses.dataclass(frozen=True)
class Ending:
    """How a session, or an attempt, ended."""

    kind: str  # one of the endings above
    detail: str = ""  # the exception type, "no heartbeat since ...", "rank R: ..."

    @property
    def text(self) -> str:
        return f"{self.kind} ({self.detail})" if self.detail else self.kind


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
    ending: Ending
    first_step: int | None
    last_step: int | None
    restart_counter: int | None
    session_endings: dict[int, Ending] = dataclasses.field(default_factory=dict)

    @property
    def ended(self) -> str:
        return self.ending.kind

    @property
    def normal(self) -> bool:
        return self.ending.kind in NORMAL_ENDINGS

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
            "ended": self.ending.kind,
            "ended_detail": self.ending.detail,
            "ended_text": self.ending.text,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "restart_counter": self.restart_counter,
        }


def _exception_name(qualified: str | None) -> str:
    if not qualified:
        return "exception"
    return qualified.removeprefix("builtins.")


def _wall_time(ns: int) -> str:
    return datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def session_ending(
    s: SessionInfo, *, later_attempt: bool, newest_wall: int, now_wall_ns: int | None, alive: Liveness | None
) -> Ending:
    """How one session ended (see the module docstring)."""
    if s.has_finish:
        if s.finish_reason == "exception":
            return Ending(CRASHED, _exception_name(s.finish_exception))
        if s.finish_reason == "hang":
            return Ending(HUNG, "no progress")
        if s.finish_completed is True:
            return Ending(COMPLETED)
        if s.finish_reason == "signal" or s.preempt_events:
            return Ending(PREEMPTED)
        if s.finish_completed is False:
            return Ending(STOPPED)
        return Ending(EXITED)
    if later_attempt:
        return Ending(KILLED, "no finish record")
    return lost_or_running(s.last_seen_wall, s.flush_interval_s, newest_wall=newest_wall, now_wall_ns=now_wall_ns,
                           alive=alive(s.host, s.pid, s.start_wall) if alive is not None else None)


def lost_or_running(seen_wall: int, flush_interval_s: float, *, newest_wall: int, now_wall_ns: int | None,
                    alive: bool | None) -> Ending:
    """A process without a finish record, last seen at ``seen_wall`` (its newest record or
    heartbeat): lost when its heartbeats are stale (more than 5 flush intervals, and at least
    :data:`MIN_STALE_NS`, before the run's newest record, or before now when nothing on this
    host can tell) or its process is gone (``alive``: the probe's answer), else running. The
    report's rule and ``goodtrace watch``'s."""
    stale = max(5 * round(flush_interval_s * 1e9), MIN_STALE_NS)
    if alive is False or newest_wall - seen_wall > stale or (
        alive is None and (now_wall_ns is None or now_wall_ns - seen_wall > stale)
    ):
        return Ending(LOST, f"no heartbeat since {_wall_time(seen_wall)}")
    return Ending(RUNNING)


def _attempt_ending(members: Sequence[SessionInfo], endings: dict[int, Ending]) -> Ending:
    """The first rank's ending in time; running while any rank runs."""
    if any(endings[s.index].kind == RUNNING for s in members):
        return Ending(RUNNING)
    first = min(members, key=lambda s: (s.wall(s.finish_t) if s.has_finish and s.finish_t is not None
                                        else s.last_seen_wall, s.rank))
    ending = endings[first.index]
    if ending.kind in NORMAL_ENDINGS or len(members) == 1:
        return ending
    return Ending(ending.kind, f"rank {first.rank}" + (f": {ending.detail}" if ending.detail else ""))


# where a process's rank came from (the header's rank_source, goodtrace.record.process)
_RANK_SOURCES = {
    "default": "from no source (no rank= argument, no initialised torch.distributed or jax.distributed, no "
               "launcher variable such as RANK): each fell back to rank 0; call gt.init after the process group "
               "is initialised, or pass it rank= and world_size=",
    "argument": "from gt.init's rank= argument",
    "environment": "from the launcher's variables (RANK, SLURM_PROCID, ...)",
}


def _claimed_twice(attempt: int, members: Sequence[SessionInfo]) -> list[str]:
    """A warning per rank that several processes of one attempt claim (at the same time: their
    sessions overlap, or they would be attempts of their own), saying where the rank came from.
    The attempt's figures for that rank are its first process's (:func:`rank_processes`)."""
    by_rank: dict[int, list[SessionInfo]] = {}
    for s in members:
        by_rank.setdefault(s.rank, []).append(s)
    found = []
    for rank, claims in sorted(by_rank.items()):
        if len(claims) < 2:
            continue
        sources = sorted({s.rank_source or "unknown" for s in claims})
        where = "; ".join(_RANK_SOURCES.get(source, f"from {source}") for source in sources)
        pids = ", ".join(f"{s.pid} on {s.host}" for s in claims)
        found.append(
            f"attempt {attempt}: {len(claims)} processes claim rank {rank} at the same time (pids {pids}); "
            f"their rank came {where}. They are read as one attempt; rank {rank}'s figures are its first "
            f"process's (pid {claims[0].pid}), the others' time is in no figure"
        )
    return found


def rank_processes(sessions: Sequence[SessionInfo], attempt_of: Mapping[int, int]) -> set[int]:
    """The sessions that stand for their rank in their attempt: each rank's first process of
    each attempt (in ``sessions``' order, the attempt's reference session for the reference
    rank), the others claiming a rank some process of the attempt already has (a warning of
    :func:`discover_attempts` names them)."""
    first: dict[tuple[int, int], int] = {}
    for s in sessions:
        attempt = attempt_of.get(s.index)
        if attempt is not None:
            first.setdefault((attempt, s.rank), s.index)
    return set(first.values())


def discover_attempts(
    sessions: Sequence[SessionInfo],
    warnings: list[str] | None = None,
    *,
    now_wall_ns: int | None = None,
    alive: Liveness | None = None,
) -> list[Attempt]:
    """Attempts in order, each with its job number and ending (see the module docstring).
    ``now_wall_ns`` and ``alive`` (a process probe for this host) tell a last attempt that is
    still running from one that was lost; without them it counts as lost."""
    numbers = assign_attempts(sessions)
    groups: dict[int, list[SessionInfo]] = {}
    for s, n in zip(sessions, numbers, strict=True):
        groups.setdefault(n, []).append(s)
    newest = max((s.last_seen_wall for s in sessions), default=0)
    last_attempt = max(groups, default=-1)
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
        if warnings is not None:
            warnings.extend(_claimed_twice(n, members))
        endings = {
            s.index: session_ending(s, later_attempt=n != last_attempt, newest_wall=newest,
                                    now_wall_ns=now_wall_ns, alive=alive)
            for s in members
        }
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
            if (previous.ended == COMPLETED and backwards) or counter_back or other_submit:
                job += 1
                if warnings is not None:
                    why = (
                        "a different submit time" if other_submit else
                        "the launcher restart counter went back" if counter_back else
                        f"the previous attempt completed at step {previous.last_step} and this one "
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
            ranks=len({s.rank for s in members}),
            world=max(s.world for s in members),
            reference_session=reference.index,
            start_wall=reference.start_wall,
            end_wall=reference.last_seen_wall,
            ending=_attempt_ending(members, endings),
            first_step=first_step,
            last_step=max(last_steps) if last_steps else None,
            restart_counter=reference.restart,
            session_endings=endings,
        )
        attempts.append(attempt)
        previous = attempt
        previous_submit = submit if submit is not None else previous_submit
    return attempts
