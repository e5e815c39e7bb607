"""The analytical reader: a run directory -> a ``LoadedRun`` (plain dataclasses), via DuckDB.

DuckDB parses every rank's JSON-lines segments (or reads the Parquet copy that
``compact_run`` writes) straight into per-session aggregates, so memory stays bounded for any
number of ranks and steps; full per-record timelines are loaded only for the ranks the
analysis needs (rank 0, or the lowest rank present, plus a sample for the per-rank spread).
Torn lines, missing ranks, missing finish records and older schema versions are tolerated and
reported in ``LoadedRun.warnings``; a path that holds no records raises ``NotARunError``.
``duckdb`` is imported only when a run is loaded.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from goodtrace.read import duckdb_sql
from goodtrace.read.compact import COMPACT_DIR, COMPACT_RECORDS, compact_manifest, compact_run
from goodtrace.read.discovery import (
    collect_sessions,
    ends_torn,
    int_or_none,
    pick_detail_sessions,
    read_header,
    session_info,
    warn_about_gaps,
)
from goodtrace.read.loaded import LoadedRun, LoadError, Progress, RankSummary, SessionInfo, SessionTimeline
from goodtrace.read.mirror import mirror_run
from goodtrace.read.segments import SEGMENT_SUFFIX, NotARunError, list_segments
from goodtrace.read.sessions import number_attempts
from goodtrace.record.storage import is_url, local_path

__all__ = [
    "COMPACT_DIR",
    "LoadError",
    "LoadedRun",
    "NotARunError",
    "RankSummary",
    "SessionInfo",
    "SessionTimeline",
    "compact_run",
    "load_run",
    "mirror_run",
]

DEFAULT_DETAIL_RANKS = 16  # ranks loaded record by record for the per-rank spread


def _segment_paths(root: str) -> list[str]:
    return [path for _, path in list_segments(root)]


def load_run(
    run_dir: str | os.PathLike[str],
    *,
    detail_ranks: int = DEFAULT_DETAIL_RANKS,
    progress: Progress | None = None,
    use_compact: bool = True,
) -> LoadedRun:
    """Read a run directory (JSON lines, and its compacted Parquet form when present).

    Raises ``NotARunError`` when the path holds no readable records, ``LoadError`` when DuckDB
    cannot read them (a damaged compacted copy is skipped in favour of the JSON lines first).
    """
    import duckdb

    try:
        return _load_run(run_dir, detail_ranks=detail_ranks, progress=progress, use_compact=use_compact)
    except duckdb.Error as exc:
        if not use_compact:
            raise LoadError(f"cannot read the records of {os.fspath(run_dir)!r}: {exc}") from None
        first = str(exc).splitlines()[0]
    try:
        loaded = _load_run(run_dir, detail_ranks=detail_ranks, progress=progress, use_compact=False)
    except duckdb.Error as exc:
        raise LoadError(f"cannot read the records of {os.fspath(run_dir)!r}: {exc}") from None
    loaded.warnings.insert(0, f"the compacted copy could not be read ({first}); read the JSON lines instead")
    return loaded


def _load_run(
    run_dir: str | os.PathLike[str],
    *,
    detail_ranks: int,
    progress: Progress | None,
    use_compact: bool,
) -> LoadedRun:
    path = os.fspath(run_dir)
    warnings: list[str] = []
    if is_url(path):
        path = mirror_run(path, progress=progress)
        warnings.append(f"read from a local mirror of {os.fspath(run_dir)!r}: {path}")
    root = local_path(path)
    manifest = compact_manifest(root) if use_compact else None
    segment_paths = _segment_paths(root)
    compacted: dict[str, dict[str, Any]] = {}
    if manifest is not None:
        for entry in manifest.get("files", []):
            full = os.path.join(root, entry["path"])
            compacted[full] = entry
    # A compacted file is used from Parquet unless it has changed since (then re-read as JSON).
    json_paths: list[str] = []
    parquet_ok: dict[str, dict[str, Any]] = {}
    for p in segment_paths:
        entry = compacted.get(p)
        if entry is not None and os.path.getsize(p) == entry["size"]:
            parquet_ok[p] = entry
        else:
            json_paths.append(p)
    for p, entry in compacted.items():
        if p not in parquet_ok and not os.path.exists(p):
            parquet_ok[p] = entry  # JSON deleted after compaction: the Parquet copy is the record
    if not json_paths and not parquet_ok:
        raise NotARunError(f"{path!r} holds no goodtrace records (no rank-*/*{SEGMENT_SUFFIX} files)")
    files: list[tuple[str, dict[str, Any] | None]] = []
    for p, entry in parquet_ok.items():
        files.append((p, entry.get("header")))
    torn = 0
    for p in json_paths:
        try:
            files.append((p, read_header(p)))
            torn += ends_torn(p)
        except OSError as exc:
            warnings.append(f"{p}: cannot be read ({exc}); skipped")
    if torn:
        warnings.append(
            f"{torn} segment file(s) end in a torn line (a process killed mid-write); the torn line is ignored"
        )
    drafts = collect_sessions(files, warnings)
    if not drafts:
        raise NotARunError(f"{path!r} holds no readable goodtrace records")
    sid_of_file: dict[str, int] = {}
    for index, draft in enumerate(drafts.values()):
        for f in draft.files:
            sid_of_file[f] = index
    tmpdir = tempfile.mkdtemp(prefix="goodtrace-load-")
    try:
        con = duckdb_sql.connect(tmpdir)
        try:
            duckdb_sql.create_records_table(con, "records_json")  # empty: the column layout of a record
            con.execute("CREATE TEMP TABLE files_batch (path VARCHAR, sid INTEGER)")
            con.execute("CREATE TEMP TABLE fidmap (fid INTEGER, sid INTEGER)")
            con.execute("CREATE TEMP TABLE sessmain (sid INTEGER, main_tid UBIGINT)")
            duckdb_sql.insert_rows(
                con, "sessmain", [(i, int_or_none(d.header.get("main_tid"))) for i, d in enumerate(drafts.values())]
            )
            for statement in duckdb_sql.AGGREGATE_TABLES:
                con.execute(statement)
            json_by_sid: dict[int, list[str]] = {}
            for p in json_paths:
                if p in sid_of_file:
                    json_by_sid.setdefault(sid_of_file[p], []).append(p)
            total = len(json_paths) + (1 if parquet_ok else 0)
            parquet_fids: dict[int, list[int]] = {}
            done = 0
            if parquet_ok:
                fid_to_sid = {
                    int(entry["fid"]): sid_of_file[p] for p, entry in parquet_ok.items() if p in sid_of_file
                }
                for fid, sid in fid_to_sid.items():
                    parquet_fids.setdefault(sid, []).append(fid)
                duckdb_sql.insert_rows(con, "fidmap", list(fid_to_sid.items()))
                parquet = os.path.join(root, COMPACT_DIR, COMPACT_RECORDS)
                # A view, not a copy: each query reads only the Parquet columns it needs.
                con.execute(f"CREATE TEMP VIEW parquet_records AS SELECT * FROM read_parquet({duckdb_sql.sql_str(parquet)})")
                duckdb_sql.insert_rows(con, "keymap", [(f"fid:{f}", sid) for f, sid in fid_to_sid.items()])
                duckdb_sql.fold_parquet(con)
                done += 1
                if progress is not None:
                    progress("reading compacted records", done, total)
            done = duckdb_sql.fold_json(con, json_by_sid, progress, done, total)
            duckdb_sql.distribute(con)
            if progress is not None:
                progress("summarising", total, total)
            summaries = duckdb_sql.session_summaries(con)
            sessions = [
                session_info(i, draft, summaries.get(i, {})) for i, draft in enumerate(drafts.values())
            ]
            record_count = sum(int(s.get("records") or 0) for s in summaries.values())
            attempts = number_attempts([(s.rank, s.restart, s.start_wall, s.last_seen_wall) for s in sessions])
            counts = {sid: int(v.get("records") or 0) for sid, v in summaries.items()}
            rank_summaries = duckdb_sql.rank_summaries(con, sessions, attempts, counts)
            detail = pick_detail_sessions(sessions, rank_summaries, detail_ranks)
            timelines = duckdb_sql.load_timelines(con, detail, parquet_fids, json_by_sid)
        finally:
            con.close()
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    form = "jsonl" if not parquet_ok else ("parquet" if not json_paths else "parquet+jsonl")
    warn_about_gaps(sessions, warnings)
    return LoadedRun(
        path=path, sessions=sessions, timelines=timelines, rank_summaries=rank_summaries,
        warnings=warnings, form=form, records=record_count,
    )
