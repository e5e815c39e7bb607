"""What ``goodtrace watch`` shows of a running run, kept up to date from records as they arrive
(pure: fed records, no I/O).

Nothing here is a second derivation: the goodput so far is the live line's
(:class:`goodtrace.record.live.goodput.AttemptGoodput`, the report's partition rules) for the
newest session of the lowest rank; the first rank that stopped is the rule shared by the live
line and the report (:mod:`goodtrace.record.hang_peers`); a slowdown is the report's change
point (:func:`goodtrace.analysis.slowdown.slowdown_of`), on each process's step times so far.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from array import array
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from goodtrace import schema
from goodtrace.analysis.attempts import LOST, RUNNING, Ending, Liveness, lost_or_running
from goodtrace.analysis.slowdown import slowdown_of
from goodtrace.read.discovery import declared_blocking, declared_overhead, int_or_none, process_start
from goodtrace.record.hang_peers import in_collective, stop_order, summary_line, where_text
from goodtrace.record.live.goodput import AttemptGoodput

__all__ = ["RankState", "RecentTimes", "WatchState"]

FINISHED, HANGING, READING = "finished", "hung", "reading"  # a process's status in the view (and LOST, RUNNING)
NEED = (LOST, HANGING, READING, RUNNING, FINISHED)  # the order in which statuses need a look
RECENT_STEPS = 2000  # step times kept per process for its slowdown and the worst recent steps
MAX_PROBLEMS = 100  # the newest distinct problems reading the files kept to show


class RecentTimes:
    """A process's last :data:`RECENT_STEPS` step times, (step, ns) each: two arrays of 8-byte
    integers, cut back once twice as long (16 bytes a step, not a tuple of two ints: a view of
    10,000 ranks holds 20 M of them)."""

    __slots__ = ("_ns", "_steps")

    def __init__(self, times: Iterable[tuple[int, int]] = ()) -> None:
        self._steps, self._ns = array("q"), array("q")
        for step, ns in times:
            self.append((step, ns))

    def append(self, item: tuple[int, int]) -> None:
        self._steps.append(item[0])
        self._ns.append(item[1])
        if len(self._steps) >= 2 * RECENT_STEPS:
            del self._steps[:-RECENT_STEPS], self._ns[:-RECENT_STEPS]

    def __len__(self) -> int:
        return min(len(self._steps), RECENT_STEPS)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        start = len(self._steps) - len(self)
        return zip(self._steps[start:], self._ns[start:], strict=True)

    def last(self) -> tuple[int, int]:
        return self._steps[-1], self._ns[-1]

    def columns(self) -> tuple[Any, Any]:
        """(steps, ns) as numpy arrays."""
        import numpy as np

        start = len(self._steps) - len(self)
        return (np.frombuffer(self._steps, dtype=np.int64)[start:].copy(),
                np.frombuffer(self._ns, dtype=np.int64)[start:].copy())


@dataclasses.dataclass
class RankState:
    """One process (session) of one rank, as far as its files go."""

    rank: int
    host: str
    pid: int
    flush_interval_s: float
    session: str
    wall_minus_mono: int
    overhead: frozenset[str]
    goodput: AttemptGoodput
    last_step: int | None = None
    last_seen_wall: int = 0
    finished: str | None = None  # its finish reason, once it finished
    finished_at: int | None = None  # ... and when (its clock)
    hang: dict[str, Any] | None = None  # its newest hang event's attributes, while not over
    last_sync: int | None = None
    last_seq: int = -1  # the execution whose step record came last
    held_syncs: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # sync points before their step
    step_times: RecentTimes = dataclasses.field(default_factory=RecentTimes)
    first_sync: tuple[int, int] | None = None  # (step, time) of the first step completion read (a tail's)
    slowdown: tuple[int, float, float] | None = None  # the slowdown of its step times ...
    slowdown_key: tuple[int, tuple[int, int]] | None = None  # ... when they were these many, and ended so
    metered: bool = True  # its goodput fed (read from its start); a tail's is not: it would be wrong, and unused

    def wall(self, mono: int) -> int:
        return mono + self.wall_minus_mono


class WatchState:
    """Feed it ``(path, header, record)`` from :class:`goodtrace.read.follow.RunFollower`."""

    def __init__(self) -> None:
        self.sessions: dict[str, RankState] = {}
        self.reading: dict[str, float] = {}  # sessions not read to their end yet (a long past): how far
        self.history: dict[str, float] = {}  # sessions whose step times before their tail are still read: how far
        self._before: dict[str, RankState] = {}  # ... and those step times so far (tail sessions' histories)
        self.problems: dict[str, None] = {}  # the newest distinct problems reading the files, oldest first
        self.problem_count = 0  # ... and how many there were
        self.alive: Liveness | None = None  # a probe of a process on this host (the report's), where one may run

    def note_problems(self, problems: Iterable[str]) -> None:
        """Problems the reader met (a file it could not read, a line it skipped), kept to show."""
        for problem in problems:
            if problem in self.problems:
                continue
            self.problems[problem] = None
            self.problem_count += 1
            if len(self.problems) > MAX_PROBLEMS:
                del self.problems[next(iter(self.problems))]

    def reading_plan(self, headers: Mapping[str, dict[str, Any]]) -> tuple[set[str], set[str]]:
        """Given the header of each file there now (by path; their sessions opened here), the
        sessions the view needs from their start (``whole``: the one whose goodput it shows) and
        those it needs from their last :data:`RECENT_STEPS` step completions (``tail``: the newest
        of every other rank, whose last step, age, hang and recent step times it shows); an
        earlier process of a rank adds nothing to the view. So a run of any length opens at the
        cost of one rank's history and every rank's tail."""
        for path in sorted(headers):  # a session's first file first: its header is the session's
            self.open(headers[path])
        newest = [state.session for state in self.ranks()]
        for session in self.sessions.keys() - set(newest[:1]):
            self.sessions[session].metered = False
        return set(newest[:1]), set(newest[1:])

    def read_so_far(self) -> float:
        """How much of what the view reads before it is whole is read: the shown rank's records
        and the ranks' step times before their tails, each session's share alike."""
        parts = list(self.reading.values()) + list(self.history.values())
        ranks = len(self.sessions)
        return max(0.0, 1.0 - sum(1.0 - part for part in parts) / max(1, ranks))

    def history_read(self) -> float | None:
        """How much of the session whose goodput the view shows is read, while it is not all."""
        ranks = self.ranks()
        return self.reading.get(ranks[0].session) if ranks else None

    def add(self, header: dict[str, Any], record: dict[str, Any]) -> None:
        state = self.open(header)
        kind = record.get(schema.F_KIND)
        t = record.get(schema.F_T1, record.get(schema.F_T))
        if isinstance(t, int):
            state.last_seen_wall = max(state.last_seen_wall, state.wall(t))
        meter = state.goodput if state.metered else None
        if kind == schema.STEP:  # written at the step's exit: its sync point may be in the file already
            step, t0, t1 = record[schema.F_STEP], record[schema.F_T0], record[schema.F_T1]
            if meter is not None:
                meter.on_step_begin(step, t0, thread=meter.training_thread)
            state.last_step = step
            seq = record.get(schema.F_SEQ)
            state.last_seq = seq if isinstance(seq, int) else state.last_seq + 1
            held, state.held_syncs = state.held_syncs, []
            for sync in held:  # in the order the recorder told them: entry, sync point, exit
                self._sync(state, sync)
            if meter is not None:
                meter.on_step_end(step, t0, t1)
        elif kind == schema.SYNC:
            seq = record.get(schema.F_SEQ)
            if isinstance(seq, int) and seq > state.last_seq:
                state.held_syncs.append(record)  # its execution's step record (the entry) comes later
            else:
                self._sync(state, record)
        elif kind == schema.SPAN:
            category = record.get(schema.F_CATEGORY)
            if meter is not None and (category in state.overhead or category == schema.DATA):
                meter.on_span(str(category), record[schema.F_T0], record[schema.F_T1], thread=record.get(schema.F_THREAD))
        elif kind == schema.EVENT and record.get(schema.F_NAME) == "hang":
            attrs = record.get(schema.F_ATTRS)
            state.hang = attrs if isinstance(attrs, dict) else {}
        elif kind == schema.EVENT and record.get(schema.F_NAME) == "hang_over":
            state.hang = None
        elif kind == schema.FINISH:
            state.finished = str(record.get("reason") or "finish")
            state.finished_at = t if isinstance(t, int) else None
        elif kind == schema.HEARTBEAT and isinstance(record.get(schema.F_MONO), int):
            state.last_seen_wall = max(state.last_seen_wall, state.wall(record[schema.F_MONO]))

    def add_history(self, header: dict[str, Any], record: dict[str, Any]) -> None:
        """A step completion (a ``sync`` record) of a session's history: those before the tail the
        view read first (:meth:`goodtrace.read.follow.RunFollower.poll_history`), in order."""
        session = str(header.get(schema.H_SESSION))
        before = self._before.get(session)
        if before is None:
            state = self.open(header)
            before = self._before[session] = dataclasses.replace(
                state, step_times=RecentTimes(), last_sync=None, first_sync=None, held_syncs=[],
                metered=False)
        self._sync(before, record)

    def end_history(self, session: str) -> None:
        """The history of ``session`` is read: its step times go before the tail's, as a read of
        the whole session in order gives them (the first of the tail's is timed from the last
        of the history's)."""
        before = self._before.pop(session, None)
        self.history.pop(session, None)
        state = self.sessions.get(session)
        if before is None or state is None:
            return
        times = list(before.step_times)
        if state.first_sync is not None and before.last_sync is not None:
            step, when = state.first_sync
            if when > before.last_sync:
                times.append((step, when - before.last_sync))
        state.step_times = RecentTimes(itertools.chain(times[-RECENT_STEPS:], state.step_times))

    @staticmethod
    def _sync(state: RankState, record: dict[str, Any]) -> None:
        step, when = record.get(schema.F_STEP), record[schema.F_T]
        if state.metered:
            state.goodput.on_sync(step, when, str(record.get(schema.F_HOW)))
        if isinstance(step, int):
            if state.last_sync is None:
                state.first_sync = (step, when)  # a tail's first: its time is the history's to give
            if state.last_sync is not None and when > state.last_sync:
                state.step_times.append((step, when - state.last_sync))
            state.last_sync = max(when, state.last_sync or when)

    def open(self, header: dict[str, Any]) -> RankState:
        """The state of the session ``header`` (a segment's header) belongs to."""
        session = str(header.get(schema.H_SESSION))
        state = self.sessions.get(session)
        if state is None:
            meter = AttemptGoodput(process_start(header), declared_blocking(header))
            meter.training_thread = int_or_none(header.get(schema.H_MAIN_TID))  # as the report's SessionInfo
            pid = header.get(schema.H_PID)
            # headers are checked by the readers' rule: a config is a dict, an interval in it a finite number above 0
            interval = (header.get(schema.H_CONFIG) or {}).get("flush_interval_s", schema.DEFAULT_FLUSH_INTERVAL_S)
            state = self.sessions[session] = RankState(
                rank=int(header.get(schema.H_RANK, 0)), host=str(header.get(schema.H_HOST, "?")),
                pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else 0,
                flush_interval_s=float(interval), session=session,
                wall_minus_mono=int(header[schema.F_WALL]) - int(header[schema.F_MONO]),
                overhead=schema.OVERHEAD_CATEGORIES | declared_overhead(header),  # as the report's cut takes them
                goodput=meter, last_seen_wall=int(header[schema.F_WALL]))  # its start is a sign of life
        return state

    # ------------------------------------------------------------------ what the view shows
    def ranks(self) -> list[RankState]:
        """The newest process of each rank, by rank."""
        newest: dict[int, RankState] = {}
        for state in self.sessions.values():
            held = newest.get(state.rank)
            if held is None or state.goodput.process_start_ns + state.wall_minus_mono > (
                    held.goodput.process_start_ns + held.wall_minus_mono):
                newest[state.rank] = state
        return [newest[r] for r in sorted(newest)]

    def status(self, state: RankState, now_wall: int, newest: int | None = None) -> Ending:
        """How a process stands: finished (its reason), lost (no heartbeat since ...: the
        report's rule, :func:`goodtrace.analysis.attempts.lost_or_running`), hung (a hang event
        not over) or running; ``.text`` says it. (``newest``: :meth:`newest_seen`, when the
        caller has it.)"""
        if state.finished:
            return Ending(FINISHED, state.finished)
        newest = self.newest_seen() if newest is None else newest
        started = state.goodput.process_start_ns + state.wall_minus_mono
        ending = lost_or_running(state.last_seen_wall, state.flush_interval_s, newest_wall=newest, now_wall_ns=now_wall,
                                 alive=self.alive(state.host, state.pid, started) if self.alive is not None else None)
        return ending if ending.kind == LOST else Ending(HANGING if state.hang is not None else RUNNING)

    def newest_seen(self) -> int:
        """When the run's newest record or heartbeat was written (wall ns)."""
        return max((s.last_seen_wall for s in self.sessions.values()), default=0)

    def rank_rows(self, now_wall: int, limit: int) -> tuple[list[tuple[RankState, Ending | None]], list[str]]:
        """The ranks to show, each with its :meth:`status` (None while its records are still
        read), and the kinds of status of those left out (``"reading"`` for those): every rank, by
        rank, when there are at most ``limit``; else the ``limit`` that most need a look, in the
        order of :data:`NEED` (then the furthest behind in steps, the longest unseen)."""
        newest = self.newest_seen()
        rows = [(state, None if state.session in self.reading else self.status(state, now_wall, newest))
                for state in self.ranks()]
        if len(rows) <= limit:
            return rows, []

        def need(row: tuple[RankState, Ending | None]) -> tuple[int, int, int, int]:
            state, status = row
            return (NEED.index(READING if status is None else status.kind), -1 if state.last_step is None
                    else state.last_step, state.last_seen_wall, state.rank)

        rows.sort(key=need)
        return rows[:limit], [READING if status is None else status.kind for _, status in rows[limit:]]

    def read_ranks(self) -> list[RankState]:
        """:meth:`ranks` but those not read to their end yet (what is read of them so far is
        their past: no alarm is raised from it)."""
        return [state for state in self.ranks() if state.session not in self.reading]

    def goodput(self, now_wall: int) -> float | None:
        """The lowest rank's goodput of its attempt so far (the live line's figure): until now
        while it runs, until its finish, or, lost, until its last sign of life (as the report
        ends a lost attempt: the time since is nobody's job time yet)."""
        ranks = self.ranks()
        if not ranks or not ranks[0].metered:
            return None
        first = ranks[0]
        if first.finished_at is not None:
            end = first.finished_at
        elif self.status(first, now_wall).kind == LOST:
            end = first.last_seen_wall - first.wall_minus_mono
        else:
            end = now_wall - first.wall_minus_mono
        return first.goodput.goodput(end)

    def hang_line(self) -> str | None:
        """The rank that stopped first and where the others wait (the live line's words)."""
        hung = [s for s in self.read_ranks() if s.hang is not None and isinstance(s.hang.get("since"), int)]
        if not hung:
            return None
        first = min(hung, key=lambda s: stop_order(s.hang.get("step") if s.hang else None,
                                                   s.wall(s.hang["since"]) if s.hang else 0, s.rank,
                                                   in_collective(s.hang.get("in_span"), s.hang.get("stack"))
                                                   if s.hang else False))
        assert first.hang is not None
        waiting = [(s.hang.get("step"), where_text(s.hang.get("function"), s.hang.get("location"),
                                                   in_span=s.hang.get("in_span")))
                   for s in hung if s is not first and s.hang is not None]
        since = time.strftime("%H:%M:%S UTC", time.gmtime(first.wall(first.hang["since"]) / 1e9))
        return summary_line(first.rank, first.host, where_text(first.hang.get("function"), first.hang.get("location"),
                                                               first.hang.get("span"), first.hang.get("phase"),
                                                               first.hang.get("in_span")),
                            first.hang.get("step"), since, waiting)

    def slowdowns(self) -> list[str]:
        """Each process whose step time so far shows a slowdown of its own."""

        found = []
        for state in self.read_ranks():
            if not state.step_times or state.session in self.history:  # its step times are not all read yet
                continue
            times = (len(state.step_times), state.step_times.last())
            if state.slowdown_key != times:  # a frame of thousands of ranks: only those with new step times
                steps, ns = state.step_times.columns()
                state.slowdown_key, state.slowdown = times, slowdown_of(steps, ns / 1e9)
            slowdown = state.slowdown
            if slowdown is not None:
                onset, before, after = slowdown
                found.append(f"rank {state.rank} on {state.host}: steps {after / before - 1:.0%} slower since step "
                             f"{onset} ({before * 1e3:.1f} -> {after * 1e3:.1f} ms per step)")
        return found

    def worst_recent(self, n: int = 5) -> list[tuple[int, int, float]]:
        """The slowest of the recent steps of the lowest rank: (rank, step, seconds)."""
        ranks = self.ranks()
        if not ranks or ranks[0].session in self.reading:
            return []
        first = ranks[0]
        worst = sorted(first.step_times, key=lambda item: -item[1])[:n]
        return [(first.rank, step, ns / 1e9) for step, ns in worst]
