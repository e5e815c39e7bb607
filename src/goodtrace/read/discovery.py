"""Session discovery for the analytical reader: headers, sessions, and which sessions to load
record by record (plain Python, one header line per file, checked by
:func:`goodtrace.read.validate.check_header`)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

from goodtrace import schema
from goodtrace.read.loaded import SessionInfo
from goodtrace.read.validate import MAX_LINE_BYTES, check_header

_HEADER_BYTES = 4 * 1024 * 1024  # a header line is a few hundred bytes; a longer one is not a header


def read_header(path: str) -> object:
    """The first non-blank line of a segment, decoded (None when it is not JSON)."""
    with open(path, "rb") as handle:
        line = b""
        while not line.strip():
            line = handle.readline(_HEADER_BYTES)
            if not line:
                return None
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None


def last_newline(handle: BinaryIO, end: int, limit: int) -> int | None:
    """Where the last line of a file's first ``end`` bytes starts: just after the last newline
    before ``end`` (0 when there is none, from the file's start), searched back in growing
    blocks; None when none is found within ``limit`` bytes of ``end`` (a line longer than that)
    or the file is shorter than ``end``."""
    position = end
    block = 1 << 16
    while position > 0:
        if end - position >= limit:
            return None
        start = max(0, position - block)
        handle.seek(start)
        data = handle.read(position - start)
        if len(data) != position - start:
            return None
        found = data.rfind(b"\n")
        if found >= 0:
            return start + found + 1
        position = start
        block = min(block * 4, 1 << 24)
    return 0


def torn_tail(path: str) -> bool:
    """Whether the file ends in a partial line that is not JSON (a write cut short): the
    line DuckDB reads as an unreadable row and the segment reader counts as torn."""
    with open(path, "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return False
        handle.seek(-1, os.SEEK_END)
        if handle.read(1) == b"\n":
            return False
        start = last_newline(handle, size, MAX_LINE_BYTES + 1)
        if start is None:
            return True  # longer than a record may be
        handle.seek(start)
        line = handle.read(size - start)
    if not line.strip():
        return False
    if len(line) > MAX_LINE_BYTES:
        return True
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return True
    return False


def count_lines(path: str) -> int:
    """Non-blank lines of a file (what a skipped file held), read in blocks."""
    count = 0
    with open(path, "rb") as handle:
        for line in handle:
            if line.strip():
                count += 1
    return count


def int_or_none(value: object) -> int | None:
    return value if type(value) is int else None


@dataclasses.dataclass
class SessionDraft:
    header: dict[str, Any]
    files: list[str]
    where: str


def where_of(path: str) -> str:
    """``rank-NNNNN/<file>``: how warnings name a segment file."""
    return os.path.join(os.path.basename(os.path.dirname(path)), os.path.basename(path))


FOLD_AFTER = 3  # a warning about more files than this is one line naming the first few


def fold_file_warnings(warnings: Sequence[str]) -> list[str]:
    """The same problem in many segment files (``"<rank-N/file>: <problem>"``, e.g. every
    header of a run written by another version) as one line with the count and the first
    few files, where the first of them stood; every other warning as it is."""
    groups: dict[str, list[str]] = {}
    for warning in warnings:
        where, sep, problem = warning.partition(": ")
        if sep and where.endswith(".jsonl") and "/" in where:
            groups.setdefault(problem, []).append(where)
    out: list[str] = []
    for warning in warnings:
        where, sep, problem = warning.partition(": ")
        files = groups.get(problem) if sep and where.endswith(".jsonl") and "/" in where else None
        if files is None or len(files) <= FOLD_AFTER:
            out.append(warning)
        elif files[0] == where:
            shown = ", ".join(files[:FOLD_AFTER])
            out.append(f"{problem} (in {len(files):,} segment files: {shown}, ...)")
    return out


def collect_sessions(
    files: Sequence[tuple[str, object]], warnings: list[str], lines_of: Callable[[str], int | None],
    skipped: dict[str, int],
) -> dict[str, SessionDraft]:
    """Sessions from each file's first line: a file whose header is unusable is skipped, its
    lines (``lines_of(path)``) counted in ``skipped``; ignored header fields are named."""
    sessions: dict[str, SessionDraft] = {}
    skipped_versions: dict[object, int] = {}
    older: dict[object, int] = {}
    for path, first in files:
        where = where_of(path)
        check = check_header(first)
        header = check.header
        if header is None:
            lines = lines_of(path)
            if lines:
                skipped["file_skipped"] = skipped.get("file_skipped", 0) + lines
            if check.newer is not None:
                skipped_versions[check.newer] = skipped_versions.get(check.newer, 0) + 1
            else:
                held = "" if lines is None else f" ({lines:,} line{'s' if lines != 1 else ''})"
                warnings.append(f"{where}: {check.refused}; skipped{held}")
            continue
        version = header[schema.H_SCHEMA]
        if check.older:
            older[version] = older.get(version, 0) + 1
        if check.ignored:
            warnings.append(f"{where}: header field(s) {', '.join(check.ignored)} out of range or of the wrong "
                            "type; ignored")
        session_id = str(header.get(schema.H_SESSION) or path)
        draft = sessions.get(session_id)
        if draft is None:
            sessions[session_id] = SessionDraft(header, [path], where)
        else:
            draft.files.append(path)
            if header.get(schema.H_SEGMENT, 0) == 0:
                draft.header = header
    for version, count in skipped_versions.items():
        warnings.append(
            f"{count} segment file(s) have schema version {version!r}, newer than this goodtrace reads "
            f"({schema.SCHEMA_VERSION}); skipped — upgrade goodtrace to read them"
        )
    for version, count in older.items():
        warnings.append(
            f"{count} segment file(s) have the older schema version {version!r}; read as best effort "
            "(fields they lack, such as the OS process start, fall back to the init time)"
        )
    return sessions


def process_start(header: dict[str, Any]) -> int:
    """A session's process start (monotonic ns) by its (checked) header: the one it names, else
    its ``init()``, else its clock anchor. What every reader takes as its start."""
    for key in (schema.H_PROC_START, schema.H_INIT):
        value = int_or_none(header.get(key))
        if value is not None:
            return value
    return int(header[schema.F_MONO])


def declared_overhead(header: dict[str, Any]) -> frozenset[str]:
    """The overhead categories a session's (checked) header names: the recorder lists the
    built-in ones and those the program declared, another or an older writer may list only the
    declared ones (or none), so every reader adds the built-in ones
    (:data:`goodtrace.schema.OVERHEAD_CATEGORIES`) itself."""
    config = header.get(schema.H_CONFIG) if isinstance(header.get(schema.H_CONFIG), dict) else {}
    assert isinstance(config, dict)
    named = header.get(schema.H_OVERHEAD_CATEGORIES) or config.get("overhead_categories") or []
    return frozenset(str(c) for c in named if isinstance(c, str))


def declared_blocking(header: dict[str, Any]) -> frozenset[str]:
    """The blocking categories of a session: the built-in ones and those its (checked) header's
    config declares."""
    config = header.get(schema.H_CONFIG) if isinstance(header.get(schema.H_CONFIG), dict) else {}
    assert isinstance(config, dict)
    blocking = config.get("blocking_categories") or []
    return schema.BLOCKING_CATEGORIES | frozenset(str(c) for c in blocking if isinstance(c, str))


def session_info(index: int, draft: SessionDraft, summary: dict[str, Any]) -> SessionInfo:
    """One session's summary: its header (checked) and what DuckDB folded of its records."""
    header = draft.header
    mono = int(header[schema.F_MONO])
    init = int_or_none(header.get(schema.H_INIT))
    proc_start = process_start(header)
    config = header.get(schema.H_CONFIG) if isinstance(header.get(schema.H_CONFIG), dict) else {}
    assert isinstance(config, dict)
    last_seen = max(
        v for v in (mono, proc_start, summary.get("last_seen"), summary.get("finish_t")) if isinstance(v, int)
    )
    lag = config.get("lag", 1)
    flush = config.get("flush_interval_s")
    return SessionInfo(
        index=index,
        session=str(header.get(schema.H_SESSION) or draft.where),
        rank=int(header[schema.H_RANK]),
        world=max(1, int_or_none(header.get(schema.H_WORLD)) or 1),
        host=str(header.get(schema.H_HOST) or "?"),
        pid=int_or_none(header.get(schema.H_PID)) or 0,
        restart=int_or_none(header.get(schema.H_RESTART)),
        proc_start=proc_start,
        init=init if init is not None else mono,
        submit_wall=int_or_none(header.get(schema.H_SUBMIT_WALL)),
        wall_anchor=int_or_none(header.get(schema.F_WALL)) or 0,
        mono_anchor=mono,
        last_seen=last_seen,
        finish_completed=summary.get("finish_completed"),
        finish_t=summary.get("finish_t"),
        finish_reason=summary.get("finish_reason"),
        finish_exception=summary.get("finish_exception"),
        has_finish=bool(summary.get("has_finish")),
        last_heartbeat=summary.get("heartbeat"),
        flush_interval_s=float(flush) if isinstance(flush, (int, float)) and flush > 0 else schema.DEFAULT_FLUSH_INTERVAL_S,
        main_tid=int_or_none(header.get(schema.H_MAIN_TID)),
        overhead_categories=declared_overhead(header),
        blocking_categories=declared_blocking(header),
        lag=int(lag) if isinstance(lag, int) else 1,
        dropped=int(summary.get("dropped") or 0),
        schema_version=int_or_none(header.get(schema.H_SCHEMA)) or 0,
        first_step=summary.get("first_step"),
        last_step=summary.get("last_step"),
        step_count=int(summary.get("step_count") or 0),
        sync_count=int(summary.get("sync_count") or 0),
        preempt_events=int(summary.get("preempt_events") or 0),
        records=int(summary.get("records") or 0),
        rank_source=source if isinstance(source := header.get(schema.H_RANK_SOURCE), str) else None,
    )


def reference_sessions(sessions: Sequence[SessionInfo], attempts: Sequence[int]) -> list[int]:
    """The sessions read record by record: each attempt's lowest rank (rank 0 when present),
    whose timeline stands for the job (tags, metrics and spans of the step table)."""
    lowest: dict[int, SessionInfo] = {}
    for s in sessions:
        best = lowest.get(attempts[s.index])
        if best is None or s.rank < best.rank:
            lowest[attempts[s.index]] = s
    return sorted(s.index for s in lowest.values())


def warn_about_gaps(sessions: Sequence[SessionInfo], warnings: list[str]) -> None:
    world = max((s.world for s in sessions), default=1)
    present = {s.rank for s in sessions if s.rank < world}
    missing = world - len(present)
    if missing:
        first: list[int] = []
        for r in range(world):  # stops after the first 11 missing ranks
            if r not in present:
                first.append(r)
                if len(first) > 10:
                    break
        shown = ", ".join(str(r) for r in first[:10]) + (" ..." if missing > 10 else "")
        warnings.append(f"{missing} of {world} ranks have no records (ranks {shown})")
    dropped = sum(s.dropped for s in sessions)
    if dropped:
        warnings.append(f"the recorder dropped {dropped} records (storage could not keep up)")
