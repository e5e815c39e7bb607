"""A small, dependency-free reader: a run directory -> sessions of plain record dicts.

Each *session* is one process incarnation of one rank (its header says rank, host, pid,
launcher restart counter and clock anchor). Torn last lines (a process killed mid-write) are
skipped silently; undecodable lines elsewhere are skipped and reported in ``Run.problems``.
Attempts are discovered here: by launcher restart counter when present, otherwise from the
records (a rank cannot appear twice in one attempt). The analytical reader (DuckDB) builds on
the same file layout; this one is for tests, tools and small runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

from goodtrace import schema
from goodtrace._storage import is_url, local_path

SEGMENT_SUFFIX = ".jsonl"


class NotARunError(ValueError):
    """The path holds no goodtrace records."""


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
        return str(self.header[schema.H_SESSION])

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
                if isinstance(value, int) and value > latest:
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


def _list_segments(run_dir: str) -> list[tuple[str, str]]:
    """(rank directory name, segment path) pairs, sorted."""
    found: list[tuple[str, str]] = []
    if is_url(run_dir):
        import fsspec

        fs, root = fsspec.core.url_to_fs(run_dir)
        for path in sorted(fs.glob(root.rstrip("/") + "/rank-*/*" + SEGMENT_SUFFIX)):
            found.append((path.rsplit("/", 2)[-2], path))
        return found
    root = local_path(run_dir)
    if not os.path.isdir(root):
        raise NotARunError(f"{run_dir!r} is not a directory")
    for entry in sorted(os.listdir(root)):
        rank_dir = os.path.join(root, entry)
        if entry.startswith("rank-") and os.path.isdir(rank_dir):
            for name in sorted(os.listdir(rank_dir)):
                if name.endswith(SEGMENT_SUFFIX):
                    found.append((entry, os.path.join(rank_dir, name)))
    return found


def _read_bytes(run_dir: str, path: str) -> bytes:
    if is_url(run_dir):
        import fsspec

        fs, _ = fsspec.core.url_to_fs(run_dir)
        return bytes(fs.cat_file(path))
    with open(path, "rb") as handle:
        return handle.read()


def parse_segment(data: bytes, where: str, problems: list[str]) -> tuple[list[dict[str, Any]], int]:
    """Decode JSON lines; returns (records, torn_lines). A torn *last* line is expected."""
    lines = data.split(b"\n")
    records: list[dict[str, Any]] = []
    torn = 0
    last = len(lines) - 1
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            torn += 1
            if index != last:
                problems.append(f"{where}: line {index + 1} is not valid JSON; skipped")
            continue
        if not isinstance(record, dict) or not isinstance(record.get(schema.F_KIND), str):
            problems.append(f"{where}: line {index + 1} is not a goodtrace record; skipped")
            continue
        records.append(record)
    return records, torn


def read_run(run_dir: str | os.PathLike[str]) -> Run:
    """Load every rank's segments of a run directory into sessions, attempts assigned."""
    path = os.fspath(run_dir)
    problems: list[str] = []
    by_session: dict[str, Session] = {}
    segments = _list_segments(path)
    if not segments:
        raise NotARunError(f"{path!r} holds no goodtrace records (no rank-*/*{SEGMENT_SUFFIX} files)")
    for rank_dir, segment in segments:
        where = f"{rank_dir}/{os.path.basename(segment)}"
        try:
            data = _read_bytes(path, segment)
        except OSError as exc:
            problems.append(f"{where}: cannot be read ({exc}); skipped")
            continue
        records, torn = parse_segment(data, where, problems)
        if not records or records[0].get(schema.F_KIND) != schema.HEADER:
            if records:
                problems.append(f"{where}: does not start with a header record; skipped")
            continue
        header = records[0]
        version = header.get(schema.H_SCHEMA)
        if version not in schema.READABLE_VERSIONS:
            problems.append(
                f"{where}: schema version {version!r} is not one this goodtrace reads "
                f"({sorted(schema.READABLE_VERSIONS)}); skipped — upgrade goodtrace"
            )
            continue
        session_id = str(header.get(schema.H_SESSION))
        session = by_session.get(session_id)
        if session is None:
            session = Session(header=header, records=[])
            by_session[session_id] = session
        elif header.get(schema.H_SEGMENT, 0) == 0:
            session.header = header
        session.records.extend(records[1:])
        session.segments += 1
        session.torn_lines += torn
    sessions = sorted(by_session.values(), key=lambda s: (s.start_wall_ns, s.rank))
    assign_attempts(sessions)
    return Run(path=path, sessions=sessions, problems=problems)


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
