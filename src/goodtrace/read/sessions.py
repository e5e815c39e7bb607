"""Sessions and attempts of a run directory, from its segment files (standard library only).

Each *session* is one process incarnation of one rank (its header says rank, host, pid,
launcher restart counter and clock anchor). Torn last lines (a process killed mid-write) are
skipped silently; undecodable or invalid lines elsewhere (:mod:`goodtrace.read.validate`) and
segments whose header is unusable are skipped and reported in ``Run.problems``; every skipped
line is counted by reason in ``Run.skipped``.
Attempts are discovered here: by launcher restart counter when present, otherwise from the
records (a rank cannot appear twice in one attempt). The analytical reader (DuckDB) builds on
the same file layout and the same attempt rule (:func:`number_attempts`).

Two forms: :func:`read_run` holds every record of the run in memory (small runs, tests);
:func:`index_run` reads every file once but keeps only each session's header, clock and finish
records and its latest time (plus a small caller-chosen summary), and
:meth:`RunIndex.load` then reads one session's records at a time, so a renderer streams a
run of any length in the memory of its largest session.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from goodtrace import schema
from goodtrace.read.discovery import fold_file_warnings
from goodtrace.read.segments import (
    SEGMENT_SUFFIX,
    NotARunError,
    SegmentRecords,
    list_segments,
    parse_segment,
    read_bytes,
)
from goodtrace.read.validate import check_header, is_time

__all__ = [
    "IndexedSession",
    "NotARunError",
    "Run",
    "RunIndex",
    "Session",
    "assign_attempts",
    "index_run",
    "number_attempts",
    "read_run",
]


@dataclasses.dataclass
class Session:
    """One process of one rank: its header (first segment) and all records, in file order."""

    header: dict[str, Any]
    records: list[dict[str, Any]]
    segments: int = 0
    torn_lines: int = 0
    attempt: int = -1

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
        """The last sign of life: the latest time in any record."""
        latest = int(self.header[schema.F_MONO])
        for record in self.records:
            for field in (schema.F_T1, schema.F_T, schema.F_MONO):
                value = record.get(field)
                if is_time(value) and value > latest:
                    latest = value
        return latest

    @property
    def finish(self) -> dict[str, Any] | None:
        for record in reversed(self.records):
            if record.get(schema.F_KIND) == schema.FINISH:
                return dict(record)
        return None

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

    def load(self, session: Session, keep: Callable[[dict[str, Any]], bool] | None = None) -> Session:
        """``session`` with all its records: here they are already in memory, returned as they
        are (``keep`` only matters to :meth:`RunIndex.load`, the streaming form)."""
        return session


S = TypeVar("S", bound="Session")


def _checked_header(first: dict[str, Any], where: str, problems: list[str]) -> dict[str, Any] | None:
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

def read_run(run_dir: str | os.PathLike[str]) -> Run:
    """Load every rank's segments of a run directory into sessions, attempts assigned."""
    path = os.fspath(run_dir)
    problems: list[str] = []
    skipped: dict[str, int] = {}
    by_session: dict[str, Session] = {}
    segments = list_segments(path, problems)
    if not segments:
        raise NotARunError(f"{path!r} holds no goodtrace records (no rank-*/*{SEGMENT_SUFFIX} files)")
    for rank_dir, segment in segments:
        where = f"{rank_dir}/{os.path.basename(segment)}"
        try:
            data = read_bytes(path, segment)
        except OSError as exc:
            problems.append(f"{where}: cannot be read ({exc.strerror or exc}); skipped")
            continue
        own: dict[str, int] = {}
        own_problems: list[str] = []
        records, torn = parse_segment(data, where, own_problems, own)
        header = _checked_header(records[0], where, problems) if records else None
        if header is None:  # every line of the file is skipped with it
            lines = len(records) + sum(own.values())
            if lines:
                skipped["file_skipped"] = skipped.get("file_skipped", 0) + lines
            continue
        problems.extend(own_problems)
        for reason, count in own.items():
            skipped[reason] = skipped.get(reason, 0) + count
        _, session = _session_of(by_session, header, Session)
        session.records.extend(records[1:])
        session.segments += 1
        session.torn_lines += torn
    sessions = sorted(by_session.values(), key=lambda s: (s.start_wall_ns, s.rank))
    assign_attempts(sessions)
    return Run(path=path, sessions=sessions, problems=fold_file_warnings(problems), skipped=skipped)


@dataclasses.dataclass
class IndexedSession(Session):
    """A session whose records stay on disk (see :func:`index_run`).

    ``records`` holds only its ``clock`` and ``finish`` records (what clock alignment and
    :attr:`Session.finish` read); its latest time in any record is kept in ``latest_mono``.
    ``files`` lists its segment files with the number of bytes read from each, so that
    :meth:`RunIndex.load` decodes exactly the same records again, even while a live run is
    still appending to them. ``summary`` is what ``index_run``'s ``summarise`` made of it.
    """

    files: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    latest_mono: int | None = None
    summary: Any = None

    @property
    def last_seen_mono(self) -> int:
        latest = int(self.header[schema.F_MONO])
        return self.latest_mono if self.latest_mono is not None and self.latest_mono > latest else latest


@dataclasses.dataclass
class RunIndex(Run):
    """A run read by :func:`index_run`: its sessions are :class:`IndexedSession` (attempts
    assigned, problems found) and :meth:`load` reads one session's records when asked."""

    def load(self, session: Session, keep: Callable[[dict[str, Any]], bool] | None = None) -> Session:
        """The session with its records, read again from its files: all of them, or those for
        which ``keep(record)`` is true (the others are never held, only decoded)."""
        if not isinstance(session, IndexedSession):
            return session
        records: list[dict[str, Any]] = []
        for segment, size in session.files:
            try:
                data = read_bytes(self.path, segment, size)
            except OSError:  # gone since it was indexed: its records are missing
                continue
            parsed = iter(SegmentRecords(data, segment, []))
            first = next(parsed, None)
            if first is not None and first.get(schema.F_KIND) == schema.HEADER:
                records.extend(parsed if keep is None else filter(keep, parsed))
        return Session(header=session.header, records=records, segments=session.segments,
                       torn_lines=session.torn_lines, attempt=session.attempt)


# Record kinds index_run keeps: clock and finish on the session, step and sync for summarise.
_INDEX_KEPT = frozenset({schema.CLOCK, schema.FINISH})
_SUMMARY_KINDS = frozenset({schema.STEP, schema.SYNC})


def index_run(
    run_dir: str | os.PathLike[str],
    *,
    summarise: Callable[[Session], Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> RunIndex:
    """Read every segment once, keeping per session only what :func:`read_run` would give
    its header, attempt, clock alignment, finish and last sign of life, in the memory of one
    file's text. ``summarise`` (optional) is called once per session with a :class:`Session`
    holding only that session's ``step`` and ``sync`` records (attempt not yet assigned); its
    result is kept as ``IndexedSession.summary``. ``progress(files done, files)`` after each
    file. Sessions, attempts and problems are those of ``read_run``.
    """
    path = os.fspath(run_dir)
    problems: list[str] = []
    skipped: dict[str, int] = {}
    by_session: dict[str, IndexedSession] = {}
    segments = list_segments(path, problems)
    if not segments:
        raise NotARunError(f"{path!r} holds no goodtrace records (no rank-*/*{SEGMENT_SUFFIX} files)")
    summarised: set[str] = set()
    split: set[str] = set()  # sessions whose files are not next to each other in file order
    current: str | None = None
    steps_kept: list[dict[str, Any]] = []

    def summarise_current() -> None:
        if current is not None and summarise is not None:
            session = by_session[current]
            session.summary = summarise(Session(header=session.header, records=steps_kept))
            summarised.add(current)

    span_kind, kept_kinds, summary_kinds = schema.SPAN, _INDEX_KEPT, _SUMMARY_KINDS
    t1_field, t_field, mono_field, kind_field = schema.F_T1, schema.F_T, schema.F_MONO, schema.F_KIND
    no_time = float("-inf")  # below every int, so no None test per record
    keep_steps = summarise is not None
    for done, (rank_dir, segment) in enumerate(segments, 1):
        where = f"{rank_dir}/{os.path.basename(segment)}"
        try:
            data = read_bytes(path, segment)
        except OSError as exc:
            problems.append(f"{where}: cannot be read ({exc.strerror or exc}); skipped")
            continue
        own: dict[str, int] = {}
        own_problems: list[str] = []
        reader = SegmentRecords(data, where, own_problems, own)
        records = iter(reader)
        first = next(records, None)
        header = _checked_header(first, where, problems) if first is not None else None
        if header is None:  # its lines are counted as read_run counts them
            lines = (0 if first is None else 1 + sum(1 for _ in records)) + sum(own.values())
            if lines:
                skipped["file_skipped"] = skipped.get("file_skipped", 0) + lines
            continue
        session_id, session = _session_of(by_session, header, IndexedSession)
        if session_id != current:
            summarise_current()
            if session_id in summarised:
                split.add(session_id)
            current, steps_kept = session_id, []
        latest: float = no_time if session.latest_mono is None else session.latest_mono
        kept = session.records
        for record in records:
            # Session.last_seen_mono's rule, unrolled (this loop sees every record of the run).
            get = record.get
            value = get(t1_field)
            if is_time(value) and value > latest:
                latest = value
            value = get(t_field)
            if is_time(value) and value > latest:
                latest = value
            value = get(mono_field)
            if is_time(value) and value > latest:
                latest = value
            kind = record[kind_field]
            if kind == span_kind:
                continue
            if kind in kept_kinds:
                kept.append(record)
            elif keep_steps and kind in summary_kinds:
                steps_kept.append(record)
        problems.extend(own_problems)
        for reason, count in own.items():
            skipped[reason] = skipped.get(reason, 0) + count
        session.latest_mono = None if latest == no_time else int(latest)
        session.segments += 1
        session.torn_lines += reader.torn
        session.files.append((segment, len(data)))
        if progress is not None:
            progress(done, len(segments))
    summarise_current()
    index = RunIndex(path=path, sessions=sorted(by_session.values(), key=lambda s: (s.start_wall_ns, s.rank)),
                     problems=fold_file_warnings(problems), skipped=skipped)
    for session_id in split:  # rare: summarised again from all of its files
        session = by_session[session_id]
        assert summarise is not None
        full = index.load(session)
        session.summary = summarise(Session(header=session.header, records=[
            r for r in full.records if r.get(schema.F_KIND) in summary_kinds]))
    assign_attempts(index.sessions)
    return index


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
