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
lists of a run of any length; :func:`iter_records` reads them again, one at a time). Reports
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
    "Run",
    "Session",
    "assign_attempts",
    "checked_header",
    "iter_records",
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

def read_run(run_dir: str | os.PathLike[str], *, keep_records: bool = True, progress: Progress | None = None) -> Run:
    """Load every rank's segments of a run directory into sessions, attempts assigned
    (``keep_records=False``: each session's records counted, not held: see the module).
    ``progress(what, done, total)`` is told of each segment read."""
    path = os.fspath(run_dir)
    problems: list[str] = []
    skipped: dict[str, int] = {}
    by_session: dict[str, Session] = {}
    for header, records, parsed in _segments(path, problems, skipped, progress, "reading segments"):
        _, session = _session_of(by_session, header, Session)
        for record in records:
            session.add(record, keep_records)
        session.segments += 1
        session.torn_lines += parsed.torn
    sessions = sorted(by_session.values(), key=lambda s: (s.start_wall_ns, s.rank))
    assign_attempts(sessions)
    return Run(path=path, sessions=sessions, problems=fold_file_warnings(problems), skipped=skipped)


def iter_records(run: Run, progress: Progress | None = None) -> Iterator[tuple[Session, dict[str, Any]]]:
    """Every record of ``run`` read again from its files, one at a time, with its session (in
    file order; the run read by :func:`read_run`, with or without its records kept). A file
    still being written is read as it is now: it may hold more records than were counted.
    ``progress(what, done, total)`` is told of each segment read."""
    by_id = {s.session_id: s for s in run.sessions}
    for header, records, _ in _segments(run.path, [], {}, progress, "reading segments again"):
        session = by_id.get(str(header.get(schema.H_SESSION)))
        for record in records:
            if session is not None:
                yield session, record


def _segments(
    path: str, problems: list[str], skipped: dict[str, int], progress: Progress | None = None, what: str = "",
) -> Iterator[tuple[dict[str, Any], Iterator[dict[str, Any]], SegmentRecords]]:
    """Each readable segment's checked header, its other records (decoded one at a time as they
    are iterated; the iteration must end before the next segment is asked for) and their
    decoder (its ``torn`` lines counted once they are). A file that cannot be read, or whose
    header is unusable, is named in ``problems``; its lines are counted in ``skipped``
    (``file_skipped``), as every skipped line is, by reason. ``progress(what, done, total)`` is
    told how many segments were read before each, and once all are."""
    segments = list_segments(path, problems)
    if not segments:
        raise NotARunError(f"{path!r} holds no goodtrace records (no rank-*/*{SEGMENT_SUFFIX} files)")
    for done, (rank_dir, segment) in enumerate(segments):
        if progress is not None:
            progress(what, done, len(segments))
        where = f"{rank_dir}/{os.path.basename(segment)}"
        try:
            data = read_bytes(path, segment)
        except OSError as exc:
            problems.append(f"{where}: cannot be read ({exc.strerror or exc}); skipped")
            continue
        own: dict[str, int] = {}
        own_problems: list[str] = []
        records = SegmentRecords(data, where, own_problems, own)
        walk = iter(records)
        first = next(walk, None)
        header = checked_header(first, where, problems) if first is not None else None
        if header is None:  # every line of the file is skipped with it
            lines = (first is not None) + sum(1 for _ in walk) + sum(own.values())
            if lines:
                skipped["file_skipped"] = skipped.get("file_skipped", 0) + lines
            continue
        yield header, walk, records
        problems.extend(own_problems)
        for reason, count in own.items():
            skipped[reason] = skipped.get(reason, 0) + count
    if progress is not None:
        progress(what, len(segments), len(segments))


def number_attempts(
    sessions: Sequence[tuple[int, int | None, int, int]],
) -> list[int]:
    """The one attempt rule, shared by this reader and the analysis.

    ``sessions`` holds ``(rank, launcher restart counter or None, start wall ns, last seen wall
    ns)`` per session; the result is each one's attempt number, 0, 1, ... in start order. A new
    attempt opens when a session starts after every session of the current one went quiet, when
    a rank shows up a second time (a rank cannot appear twice in one attempt), or when the
    launcher's restart counter changes.
    """
    order = sorted(range(len(sessions)), key=lambda i: (sessions[i][2], sessions[i][0]))
    result = [0] * len(sessions)
    attempt = -1
    ranks: set[int] = set()
    last_seen = 0
    counter: int | None = None
    for i in order:
        rank, restart, start, seen = sessions[i]
        if (
            attempt < 0
            or rank in ranks
            or start > last_seen
            or (restart is not None and counter is not None and restart != counter)
        ):
            attempt += 1
            ranks = set()
            last_seen = 0
            counter = restart
        result[i] = attempt
        ranks.add(rank)
        last_seen = max(last_seen, seen)
        if counter is None:
            counter = restart
    return result


def assign_attempts(sessions: list[Session]) -> None:
    """Set ``session.attempt`` on each session by :func:`number_attempts`."""
    numbers = number_attempts(
        [(s.rank, s.restart, s.start_wall_ns, s.wall_ns(s.last_seen_mono)) for s in sessions]
    )
    for session, number in zip(sessions, numbers, strict=True):
        session.attempt = number
