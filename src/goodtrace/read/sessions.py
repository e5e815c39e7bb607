"""Sessions and attempts of a run directory, from its segment files (standard library only).

Each *session* is one process incarnation of one rank (its header says rank, host, pid,
launcher restart counter and clock anchor). Torn last lines (a process killed mid-write) are
skipped silently; undecodable or invalid lines elsewhere (:mod:`goodtrace.read.validate`) and
segments whose header is unusable are skipped and reported in ``Run.problems``; every skipped
line is counted by reason in ``Run.skipped``.
Attempts are discovered here: by launcher restart counter when present, otherwise from the
records (a rank cannot appear twice in one attempt). The analytical reader (DuckDB) builds on
the same file layout and the same attempt rule (:func:`number_attempts`).

:func:`read_run` holds every record of the run in memory (what the tests read, record by
record), or, with ``keep_records=False``, only each session's header, counts, last sign of life
and finish record, each segment's records decoded one at a time (what ``goodtrace records``
lists of a run of any length; a large run's segments on a process per core);
:func:`count_in_range` reads them again to count those in a time range. Reports
read runs of any length through the analytical reader (:mod:`goodtrace.read.load`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from goodtrace import schema
from goodtrace.read.discovery import fold_file_warnings
from goodtrace.read.loaded import Progress
from goodtrace.read.segments import (
    SEGMENT_SUFFIX,
    NotARunError,
    SegmentRecords,
    list_segments,
    read_bytes,
)
from goodtrace.read.validate import check_header, is_time

__all__ = [
    "NotARunError",
    "RecordRange",
    "Run",
    "Session",
    "assign_attempts",
    "checked_header",
    "count_in_range",
    "number_attempts",
    "read_run",
]


@dataclasses.dataclass
class Session:
    """One process of one rank: its header (first segment) and all records, in file order
    (none kept when read with ``read_run(keep_records=False)``: ``record_count``,
    :attr:`last_seen_mono` and :attr:`finish` are kept as they are read either way)."""

    header: dict[str, Any]
    records: list[dict[str, Any]]
    segments: int = 0
    torn_lines: int = 0
    attempt: int = -1
    record_count: int = 0
    latest: int | None = None  # the latest time in any record read
    last_finish: dict[str, Any] | None = None  # the last finish record read

    def __post_init__(self) -> None:
        given, self.records = self.records, []
        for record in given:  # a session made with its records: counted as read
            self.add(record, True)

    def add(self, record: dict[str, Any], keep: bool) -> None:
        """One more of the session's records, in file order (held in ``records`` when ``keep``)."""
        self.record_count += 1
        if keep:
            self.records.append(record)
        for field in (schema.F_T1, schema.F_T, schema.F_MONO):
            value = record.get(field)
            if is_time(value) and (self.latest is None or value > self.latest):
                self.latest = value
        if record.get(schema.F_KIND) == schema.FINISH:
            self.last_finish = record

    def absorb(self, counted: SegmentCount) -> None:
        """One more of the session's segments, counted without its records (in file order)."""
        self.record_count += counted.records
        if counted.latest is not None and (self.latest is None or counted.latest > self.latest):
            self.latest = counted.latest
        if counted.last_finish is not None:
            self.last_finish = counted.last_finish
        self.segments += 1
        self.torn_lines += counted.torn

    @property
    def session_id(self) -> str:
        return str(self.header.get(schema.H_SESSION))

    @property
    def rank(self) -> int:
        return int(self.header[schema.H_RANK])

    @property
    def restart(self) -> int | None:
        value = self.header.get(schema.H_RESTART)
        return int(value) if isinstance(value, int) else None

    def wall_ns(self, mono: int) -> int:
        """Convert this session's monotonic time to wall-clock ns (latest anchor before it)."""
        wall0 = int(self.header[schema.F_WALL])
        mono0 = int(self.header[schema.F_MONO])
        return wall0 + (mono - mono0)

    @property
    def start_wall_ns(self) -> int:
        return self.wall_ns(int(self.header.get(schema.H_PROC_START, self.header[schema.F_MONO])))

    @property
    def last_seen_mono(self) -> int:
        """The last sign of life: the latest time in any record (the header's, without one)."""
        anchor = int(self.header[schema.F_MONO])
        return anchor if self.latest is None or self.latest < anchor else self.latest

    @property
    def finish(self) -> dict[str, Any] | None:
        """The session's last finish record (a copy), None without one."""
        return dict(self.last_finish) if self.last_finish is not None else None

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get(schema.F_KIND) == kind]


@dataclasses.dataclass
class Run:
    path: str
    sessions: list[Session]
    problems: list[str]
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)  # lines by reason (validate.SKIP_REASONS)

    def attempts(self) -> list[list[Session]]:
        """Sessions grouped by attempt, in order."""
        count = max((s.attempt for s in self.sessions), default=-1) + 1
        groups: list[list[Session]] = [[] for _ in range(count)]
        for session in self.sessions:
            groups[session.attempt].append(session)
        return groups

    def records(self, kind: str | None = None) -> Iterator[tuple[Session, dict[str, Any]]]:
        for session in self.sessions:
            for record in session.records:
                if kind is None or record.get(schema.F_KIND) == kind:
                    yield session, record


S = TypeVar("S", bound="Session")

# From this many bytes of segments on, ``read_run(keep_records=False)`` counts them on a local
# process per core (a worker starts in about 0.2 s; the standard-library reader decodes about
# 50 MB a second a core)
COUNT_POOL_MIN_BYTES = 64 * 2**20
COUNT_TASKS_PER_WORKER = 4  # at most: a task is segments in a row


@dataclasses.dataclass
class SegmentCount:
    """What one segment adds to its session read without its records (:meth:`Session.absorb`):
    its checked header (None: the segment is skipped), its records' count, latest time and last
    finish record, its torn lines, and the problems and skipped lines it brings to the run's."""

    header: dict[str, Any] | None
    records: int = 0
    latest: int | None = None
    last_finish: dict[str, Any] | None = None
    torn: int = 0
    problems: list[str] = dataclasses.field(default_factory=list)
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)
    in_range: int | None = None  # with a range: how many of its records it keeps


# a time range and each session's clock anchor (session id -> wall ns, monotonic ns)
_InRange = tuple["RecordRange", dict[str, tuple[int, int]]]


def count_segment(path: str, rank_dir: str, segment: str, in_range: _InRange | None = None) -> SegmentCount:
    """One segment of the run at ``path`` read, its records counted, none kept; with
    ``in_range``, also those the range keeps on its session's clock (a session it does not
    name: none)."""
    counted = SegmentCount(None)
    opened = _open_segment(path, rank_dir, segment, counted.problems, counted.skipped)
    if opened is None:
        return counted
    header, walk, records = opened
    tally = Session(header=header, records=[])
    span, anchor = (in_range[0], in_range[1].get(str(header.get(schema.H_SESSION)))) if in_range else (None, None)
    kept = 0
    for record in walk:
        tally.add(record, False)
        if anchor is not None and span is not None and span.keeps(record, *anchor):
            kept += 1
    counted.in_range = kept if in_range else None
    counted.header, counted.records, counted.latest = header, tally.record_count, tally.latest
    counted.last_finish, counted.torn = tally.last_finish, records.torn
    _own_into(records, counted.problems, counted.skipped)
    return counted


@dataclasses.dataclass(frozen=True)
class CountTask:
    """Segments in a row of one run, counted in a worker of the local pool
    (:func:`goodtrace.read.engine.run_pool`)."""

    index: int
    path: str
    segments: list[tuple[str, str]]
    in_range: _InRange | None = None

    def __call__(self) -> CountResult:
        return CountResult(self.index, [count_segment(self.path, rank_dir, segment, self.in_range)
                                        for rank_dir, segment in self.segments])


@dataclasses.dataclass
class CountResult:
    index: int
    counts: list[SegmentCount]


def checked_header(first: dict[str, Any], where: str, problems: list[str]) -> dict[str, Any] | None:
    """The segment's header when usable (invalid optional fields left out, a missing session
    id replaced by the file's name), else None (the problem named; the caller counts the
    file's lines as skipped)."""
    if first.get(schema.F_KIND) != schema.HEADER:
        problems.append(f"{where}: does not start with a header record; skipped")
        return None
    check = check_header(first, readable=schema.READABLE_VERSIONS)
    if check.header is None:
        problems.append(f"{where}: {check.refused}; skipped")
        return None
    if check.ignored:
        problems.append(f"{where}: header field(s) {', '.join(check.ignored)} out of range or of the wrong "
                        "type; ignored")
    header = check.header
    if schema.H_SESSION not in header:
        header[schema.H_SESSION] = where
    return header


def _session_of(by_session: dict[str, Any], header: dict[str, Any], make: type[S]) -> tuple[str, S]:
    """The session a segment belongs to (segments of one process share its session id); the
    first segment's header is the session's header."""
    session_id = str(header.get(schema.H_SESSION))
    session = by_session.get(session_id)
    if session is None:
        session = make(header=header, records=[])
        by_session[session_id] = session
    elif header.get(schema.H_SEGMENT, 0) == 0:
        session.header = header
    return session_id, session

def read_run(run_dir: str | os.PathLike[str], *, keep_records: bool = True, progress: Progress | None = None,
             workers: int | None = None) -> Run:
    """Load every rank's segments of a run directory into sessions, attempts assigned
    (``keep_records=False``: each session's records counted, not held: see the module; on
    ``workers`` local processes, by default one a core once the segments hold
    :data:`COUNT_POOL_MIN_BYTES`, or ``GOODTRACE_WORKERS``: the same run either way).
    ``progress(what, done, total)`` is told of each segment read."""
    path = os.fspath(run_dir)
    problems: list[str] = []
    skipped: dict[str, int] = {}
    by_session: dict[str, Session] = {}
    if keep_records:
        for header, records, parsed in _segments(path, problems, skipped, progress, "reading segments"):
            _, session = _session_of(by_session, header, Session)
            for record in records:
                session.add(record, True)
            session.segments += 1
            session.torn_lines += parsed.torn
    else:
        for counted in _counted(path, _listed(path, problems), workers, progress):
            problems.extend(counted.problems)
            for reason, count in counted.skipped.items():
                skipped[reason] = skipped.get(reason, 0) + count
            if counted.header is not None:
                _session_of(by_session, counted.header, Session)[1].absorb(counted)
    sessions = sorted(by_session.values(), key=lambda s: (s.start_wall_ns, s.rank))
    assign_attempts(sessions)
    return Run(path=path, sessions=sessions, problems=fold_file_warnings(problems), skipped=skipped)


@dataclasses.dataclass(frozen=True)
class RecordRange:
    """Which records a time range keeps: by the record's time (a span's start, else its time,
    else its monotonic time) on its session's wall clock, in [``since_ns``, ``until_ns``), and by
    its step number in [``low_step``, ``high_step``] (a record without a step is not kept when
    a step bound is given); None: no bound."""

    since_ns: int | None = None
    until_ns: int | None = None
    low_step: int | None = None
    high_step: int | None = None

    def keeps(self, record: dict[str, Any], wall0: int, mono0: int) -> bool:
        """Whether ``record`` of a session anchored at (``wall0``, ``mono0``) is in the range."""
        low, high = self.low_step, self.high_step
        if low is not None or high is not None:
            step = record.get(schema.F_STEP)
            if type(step) is not int or (low is not None and step < low) or (high is not None and step > high):
                return False
        a, b = self.since_ns, self.until_ns
        if a is None and b is None:
            return True
        for field in (schema.F_T0, schema.F_T, schema.F_MONO):
            value = record.get(field)
            if is_time(value):
                wall = wall0 + (value - mono0)
                return (a is None or wall >= a) and (b is None or wall < b)
        return False


def count_in_range(run: Run, span: RecordRange, *, progress: Progress | None = None,
                   workers: int | None = None) -> list[int]:
    """Each session's records (of ``run``, in its order) that ``span`` keeps: the run's files
    read again, a record at a time, as :func:`read_run` counted them (on the local pool the
    same way). A file still being written is read as it is now: it may hold more records than
    were counted."""
    anchors = {s.session_id: (int(s.header[schema.F_WALL]), int(s.header[schema.F_MONO])) for s in run.sessions}
    counts = dict.fromkeys(anchors, 0)
    for counted in _counted(run.path, _listed(run.path, []), workers, progress, "reading segments again",
                            (span, anchors)):
        if counted.header is not None and counted.in_range is not None:
            session_id = str(counted.header.get(schema.H_SESSION))
            if session_id in counts:
                counts[session_id] += counted.in_range
    return [counts[s.session_id] for s in run.sessions]


def _segments(
    path: str, problems: list[str], skipped: dict[str, int], progress: Progress | None = None, what: str = "",
) -> Iterator[tuple[dict[str, Any], Iterator[dict[str, Any]], SegmentRecords]]:
    """Each readable segment's checked header, its other records (decoded one at a time as they
    are iterated; the iteration must end before the next segment is asked for) and their
    decoder (its ``torn`` lines counted once they are). A file that cannot be read, or whose
    header is unusable, is named in ``problems``; its lines are counted in ``skipped``
    (``file_skipped``), as every skipped line is, by reason. ``progress(what, done, total)`` is
    told how many segments were read before each, and once all are."""
    segments = _listed(path, problems)
    for done, (rank_dir, segment) in enumerate(segments):
        if progress is not None:
            progress(what, done, len(segments))
        opened = _open_segment(path, rank_dir, segment, problems, skipped)
        if opened is None:
            continue
        header, walk, records = opened
        yield header, walk, records
        _own_into(records, problems, skipped)
    if progress is not None:
        progress(what, len(segments), len(segments))


def _listed(path: str, problems: list[str]) -> list[tuple[str, str]]:
    segments = list_segments(path, problems)
    if not segments:
        raise NotARunError(f"{path!r} holds no goodtrace records (no rank-*/*{SEGMENT_SUFFIX} files)")
    return segments


def _open_segment(
    path: str, rank_dir: str, segment: str, problems: list[str], skipped: dict[str, int],
) -> tuple[dict[str, Any], Iterator[dict[str, Any]], SegmentRecords] | None:
    """A segment's checked header, its other records (one at a time) and their decoder; None
    when the file cannot be read or its header is unusable (named in ``problems``, its lines
    counted in ``skipped``). The decoder's own problems and skipped lines are added by
    :func:`_own_into` once its records are read."""
    where = f"{rank_dir}/{os.path.basename(segment)}"
    try:
        data = read_bytes(path, segment)
    except OSError as exc:
        problems.append(f"{where}: cannot be read ({exc.strerror or exc}); skipped")
        return None
    records = SegmentRecords(data, where, [], {})
    walk = iter(records)
    first = next(walk, None)
    header = checked_header(first, where, problems) if first is not None else None
    if header is None:  # every line of the file is skipped with it
        lines = (first is not None) + sum(1 for _ in walk) + sum(records.skipped.values())
        if lines:
            skipped["file_skipped"] = skipped.get("file_skipped", 0) + lines
        return None
    return header, walk, records


def _own_into(records: SegmentRecords, problems: list[str], skipped: dict[str, int]) -> None:
    """A segment's own problems and skipped lines (its records all read) into the run's."""
    problems.extend(records.problems)
    for reason, count in records.skipped.items():
        skipped[reason] = skipped.get(reason, 0) + count


def _counted(
    path: str, segments: list[tuple[str, str]], workers: int | None, progress: Progress | None,
    what: str = "reading segments", in_range: _InRange | None = None,
) -> list[SegmentCount]:
    """Each segment counted (:func:`count_segment`), in order: here, or on the local pool."""
    from goodtrace.read.engine import local_workers, plan_tasks, run_pool

    sizes = []
    for _, segment in segments:
        try:
            sizes.append(os.path.getsize(segment))
        except OSError:
            sizes.append(0)  # named as it is read
    if workers is None:
        workers = local_workers(sum(sizes), COUNT_POOL_MIN_BYTES)
    if workers <= 1 or len(segments) < 2:
        out = []
        for done, (rank_dir, segment) in enumerate(segments):
            if progress is not None:
                progress(what, done, len(segments))
            out.append(count_segment(path, rank_dir, segment, in_range))
        if progress is not None:
            progress(what, len(segments), len(segments))
        return out
    groups = plan_tasks(sizes, min(len(segments), workers * COUNT_TASKS_PER_WORKER))
    tasks = [CountTask(i, path, [segments[k] for k in group], in_range) for i, group in enumerate(groups)]
    done = 0

    def finished(index: int) -> None:
        nonlocal done
        done += len(tasks[index].segments)
        if progress is not None:
            progress(f"{what} ({min(workers, len(tasks))} workers)", done, len(segments))

    results = run_pool(tasks, min(workers, len(tasks)), finished)
    return [counted for result in sorted(results, key=lambda r: r.index) for counted in result.counts]


def number_attempts(
    sessions: Sequence[tuple[int, int | None, int, int, int]],
) -> list[int]:
    """The one attempt rule, shared by this reader and the analysis.

    ``sessions`` holds ``(rank, launcher restart counter or None, start wall ns, last seen wall
    ns, wall ns its recording began)`` per session; the result is each one's attempt number, 0, 1, ... in the order the recordings began. A new
    attempt opens when a session starts after every session of the current one went quiet, when
    a rank shows up a second time (a rank cannot appear twice in one attempt), or when the
    launcher's restart counter changes. A rank shows up a second time when a process of it starts
    after the attempt's earlier processes of that rank went quiet (a restart of it); processes
    that claim one rank at the same time (overlapping in time: every process fell back to rank 0)
    are one attempt (:func:`goodtrace.analysis.attempts.discover_attempts` warns about them). A
    process's claim begins when its recording did (``init``), not at its process start: two
    recordings one after the other in one process claim the rank one after the other.
    """
    # in the order their recordings began (two recordings of one process share its start)
    order = sorted(range(len(sessions)), key=lambda i: (sessions[i][4], sessions[i][2], sessions[i][0]))
    result = [0] * len(sessions)
    attempt = -1
    ranks: dict[int, int] = {}  # rank -> the last sign of life of its processes in this attempt
    last_seen = 0
    counter: int | None = None
    for i in order:
        rank, restart, start, seen, claim = sessions[i]
        if (
            attempt < 0
            or claim > ranks.get(rank, claim)
            or start > last_seen
            or (restart is not None and counter is not None and restart != counter)
        ):
            attempt += 1
            ranks = {}
            last_seen = 0
            counter = restart
        result[i] = attempt
        ranks[rank] = max(ranks.get(rank, seen), seen)
        last_seen = max(last_seen, seen)
        if counter is None:
            counter = restart
    return result


def assign_attempts(sessions: list[Session]) -> None:
    """Set ``session.attempt`` on each session by :func:`number_attempts`."""
    numbers = number_attempts(
        [(s.rank, s.restart, s.start_wall_ns, s.wall_ns(s.last_seen_mono),
          s.wall_ns(int(s.header.get(schema.H_INIT, s.header[schema.F_MONO])))) for s in sessions]
    )
    for session, number in zip(sessions, numbers, strict=True):
        session.attempt = number
