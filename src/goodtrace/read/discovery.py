"""Session discovery for the analytical reader: headers, sessions, and which sessions to load
record by record (plain Python, one header line per file)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

from goodtrace import schema
from goodtrace.read.loaded import SessionInfo


def read_header(path: str) -> dict[str, Any] | None:
    with open(path, "rb") as handle:
        line = handle.readline(4 * 1024 * 1024)
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if isinstance(record, dict) and record.get(schema.F_KIND) == schema.HEADER:
        return record
    return None


def ends_torn(path: str) -> bool:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        if handle.tell() == 0:
            return False
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) != b"\n"


def int_or_none(value: object) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclasses.dataclass
class SessionDraft:
    header: dict[str, Any]
    files: list[str]
    where: str


def collect_sessions(
    files: Sequence[tuple[str, dict[str, Any] | None]], warnings: list[str]
) -> dict[str, SessionDraft]:
    sessions: dict[str, SessionDraft] = {}
    skipped_versions: dict[object, int] = {}
    older: dict[object, int] = {}
    for path, header in files:
        where = os.path.join(os.path.basename(os.path.dirname(path)), os.path.basename(path))
        if header is None:
            warnings.append(f"{where}: does not start with a goodtrace header line; skipped")
            continue
        version = header.get(schema.H_SCHEMA)
        if not isinstance(version, int) or version > schema.SCHEMA_VERSION:
            skipped_versions[version] = skipped_versions.get(version, 0) + 1
            continue
        if version not in schema.READABLE_VERSIONS:
            older[version] = older.get(version, 0) + 1
        if not isinstance(header.get(schema.H_RANK), int) or not isinstance(header.get(schema.F_MONO), int):
            warnings.append(f"{where}: header has no rank or clock anchor; skipped")
            continue
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


def session_info(index: int, draft: SessionDraft, summary: dict[str, Any]) -> SessionInfo:
    header = draft.header
    mono = int(header[schema.F_MONO])
    init = int_or_none(header.get(schema.H_INIT))
    proc_start = int_or_none(header.get(schema.H_PROC_START))
    if proc_start is None:
        proc_start = init if init is not None else mono
    config = header.get(schema.H_CONFIG) if isinstance(header.get(schema.H_CONFIG), dict) else {}
    assert isinstance(config, dict)
    overhead = header.get("overhead_categories") or config.get("overhead_categories") or []
    last_seen = max(
        v for v in (mono, proc_start, summary.get("last_seen"), summary.get("finish_t")) if isinstance(v, int)
    )
    lag = config.get("lag", 1)
    blocking = config.get("blocking_categories") or []
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
        flush_interval_s=float(flush) if isinstance(flush, (int, float)) and flush > 0 else 1.0,
        main_tid=int_or_none(header.get("main_tid")),
        overhead_categories=frozenset(str(c) for c in overhead if isinstance(c, str)),
        blocking_categories=schema.BLOCKING_CATEGORIES | frozenset(str(c) for c in blocking if isinstance(c, str)),
        lag=int(lag) if isinstance(lag, int) else 1,
        dropped=int(summary.get("dropped") or 0),
        schema_version=int_or_none(header.get(schema.H_SCHEMA)) or 0,
        first_step=summary.get("first_step"),
        last_step=summary.get("last_step"),
        step_count=int(summary.get("step_count") or 0),
        sync_count=int(summary.get("sync_count") or 0),
        preempt_events=int(summary.get("preempt_events") or 0),
        records=int(summary.get("records") or 0),
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
    present = {s.rank for s in sessions}
    missing = [r for r in range(world) if r not in present]
    if missing:
        shown = ", ".join(str(r) for r in missing[:10]) + (" ..." if len(missing) > 10 else "")
        warnings.append(f"{len(missing)} of {world} ranks have no records (ranks {shown})")
    dropped = sum(s.dropped for s in sessions)
    if dropped:
        warnings.append(f"the recorder dropped {dropped} records (storage could not keep up)")
