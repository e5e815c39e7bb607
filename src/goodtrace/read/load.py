"""The analytical reader: a run directory -> a ``LoadedRun`` (plain dataclasses), via DuckDB.

DuckDB parses every rank's JSON-lines segments (or reads the Parquet copy that
``compact_run`` writes) into what the run model needs of every session (summaries and compact
columns: executions, sync points, overhead spans, compute per execution, clock samples), so
memory stays bounded for any number of ranks and steps; full per-record timelines are loaded
only for each attempt's reference session (rank 0, or the lowest rank present).
Torn lines, missing ranks, missing finish records and older schema versions are tolerated and
reported in ``LoadedRun.warnings``; every line that is not a valid record (not JSON, an
impossible field, longer than a record may be, in a file whose header is unusable:
:mod:`goodtrace.read.validate`) is skipped, counted by reason in ``LoadedRun.skipped`` and
named by file in the warnings; files that are not regular files (a FIFO) are never opened. A
path that holds no records raises ``NotARunError``. ``duckdb`` is imported only when a run is
loaded.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from goodtrace.read import duckdb_sql, model_fetch
from goodtrace.read.compact import (
    COMPACT_DIR,
    COMPACT_RECORDS,
    compact_manifest,
    compact_run,
    stored_run_model,
)
from goodtrace.read.discovery import (
    collect_sessions,
    count_lines,
    fold_file_warnings,
    int_or_none,
    read_header,
    reference_sessions,
    session_info,
    warn_about_gaps,
    where_of,
)
from goodtrace.read.engine import Engine, RemoteRun, fold_sessions
from goodtrace.read.hangs import hang_details, hang_events_in
from goodtrace.read.loaded import (
    LoadedRun,
    LoadError,
    Progress,
    SessionInfo,
    SessionRecords,
    SessionTimeline,
)
from goodtrace.read.mirror import mirror_run
from goodtrace.read.segments import SEGMENT_SUFFIX, NotARunError, list_segments
from goodtrace.read.sessions import number_attempts
from goodtrace.read.validate import SKIP_REASONS, describe_skipped
from goodtrace.record.io.storage import is_url, local_path

__all__ = [
    "COMPACT_DIR",
    "Engine",
    "LoadError",
    "LoadedRun",
    "NotARunError",
    "SessionInfo",
    "SessionRecords",
    "SessionTimeline",
    "compact_run",
    "load_run",
    "mirror_run",
]

MAX_FILE_WARNINGS = 20  # files named one by one in the warnings; the rest are summed
_YEAR_NS = 366 * 86_400 * 10**9


def _unchanged(path: str, entry: dict[str, Any]) -> bool:
    """Whether a segment is as it was compacted (same size and, where recorded, same mtime)."""
    try:
        info = os.stat(path)
    except OSError:
        return False
    mtime = entry.get("mtime_ns")
    return info.st_size == entry.get("size") and (mtime is None or info.st_mtime_ns == mtime)


def _identities(paths: list[str]) -> dict[str, tuple[int, int]]:
    """Each file's (inode, size) now; a file that is gone is left out."""
    out = {}
    for path in paths:
        try:
            info = os.stat(path)
        except OSError:
            continue
        out[path] = (info.st_ino, info.st_size)
    return out


def _warn_changed(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], warnings: list[str]) -> None:
    """Segments deleted, replaced or cut short while they were read: their records may be
    missing from the numbers (a file that grew is a live run, read up to where it was)."""
    for path, (inode, size) in before.items():
        now = after.get(path)
        if now is None:
            why = "was deleted"
        elif now[0] != inode:
            why = "was replaced by another file"
        elif now[1] < size:
            why = f"shrank from {size:,} to {now[1]:,} bytes"
        else:
            continue
        warnings.append(f"{where_of(path)} {why} while the report read it: some of its records may be missing "
                        "from the numbers; report again on a run nobody is changing")


def _segment_paths(root: str, warnings: list[str]) -> list[str]:
    return [path for _, path in list_segments(root, warnings)]


def _warn_skipped(skips: duckdb_sql.FileSkips, skipped: dict[str, int], warnings: list[str]) -> None:
    """One warning per file with skipped lines (the first few files), and the run's totals."""
    files = sorted(skips.by_file.items())
    shown = 0
    for path, counts in files:
        for reason, count in counts.items():
            skipped[reason] = skipped.get(reason, 0) + count
        if set(counts) == {"torn_last_line"}:
            continue  # expected after a kill: summed in one warning
        if shown < MAX_FILE_WARNINGS:
            warnings.append(f"{where_of(path)}: {describe_skipped(counts)}")
        shown += 1
    if shown > MAX_FILE_WARNINGS:
        warnings.append(f"{shown - MAX_FILE_WARNINGS} more segment file(s) have skipped lines")
    warnings.extend(skips.notes)
    torn = skipped.get("torn_last_line", 0)
    if torn:
        warnings.append(
            f"{torn} segment file(s) end in a torn line (a process killed mid-write); the torn line is ignored"
        )
    bad = {reason: count for reason, count in skipped.items() if reason != "torn_last_line" and count}
    if bad:
        warnings.append(f"in all, {describe_skipped(bad)}; the numbers leave them out")


def load_run(
    run_dir: str | os.PathLike[str],
    *,
    progress: Progress | None = None,
    use_compact: bool = True,
    engine: Engine | None = None,
) -> LoadedRun:
    """Read a run directory (JSON lines, and its compacted Parquet form when present).

    ``engine`` says where the sessions are folded (:class:`~goodtrace.read.engine.Engine`; by
    default a local process per core when the run is large enough, ``GOODTRACE_WORKERS``):
    the result is the same wherever. A caller running inside a script whose module level
    does work (a training script) passes ``Engine(workers=1)``: pool workers are spawned
    interpreters, which import the main module.

    Raises ``NotARunError`` when the path holds no readable records, ``LoadError`` when DuckDB
    cannot read them (a damaged compacted copy is skipped in favour of the JSON lines first).
    """
    import duckdb

    listed: dict[str, tuple[int, int]] = {}  # the JSON segments as the first try found them
    try:
        return _load_run(run_dir, progress=progress, use_compact=use_compact, engine=engine or Engine(),
                         listed=listed)
    except duckdb.Error as exc:
        changed: list[str] = []
        _warn_changed(listed, _identities(list(listed)), changed)
        if not use_compact and not changed:
            raise LoadError(f"cannot read the records of {os.fspath(run_dir)!r}: {exc}") from None
        first = str(exc).splitlines()[0]
    try:  # again, without the compacted copy and with the files as they are now
        loaded = _load_run(run_dir, progress=progress, use_compact=False, engine=engine or Engine())
    except duckdb.Error as exc:
        raise LoadError(f"cannot read the records of {os.fspath(run_dir)!r}: {exc}") from None
    if changed:
        loaded.warnings[:0] = changed
    else:
        loaded.warnings.insert(0, f"the compacted copy could not be read ({first}); read the JSON lines instead")
    return loaded


def _load_run(
    run_dir: str | os.PathLike[str],
    *,
    progress: Progress | None,
    use_compact: bool,
    engine: Engine,
    listed: dict[str, tuple[int, int]] | None = None,
) -> LoadedRun:
    path = os.fspath(run_dir)
    warnings: list[str] = []
    remote: RemoteRun | None = None
    if is_url(path):  # Ray tasks on a cluster fetch their sessions from the URL, not from this mirror
        path = mirror_run(path, progress=progress, use_compact=use_compact)
        remote = RemoteRun(os.fspath(run_dir), path)
        warnings.append(f"read from a local mirror of {os.fspath(run_dir)!r}: {path}")
    root = local_path(path)
    manifest = compact_manifest(root) if use_compact else None
    segment_paths = _segment_paths(root, warnings)
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
        if entry is not None and _unchanged(p, entry):
            parquet_ok[p] = entry
        else:
            json_paths.append(p)
    for p, entry in compacted.items():
        if p not in parquet_ok and not os.path.exists(p):
            parquet_ok[p] = entry  # JSON deleted after compaction: the Parquet copy is the record
    if not json_paths and not parquet_ok:
        raise NotARunError(f"{path!r} holds no goodtrace records (no rank-*/*{SEGMENT_SUFFIX} files)")
    files: list[tuple[str, object]] = []
    skips = duckdb_sql.FileSkips()
    for p, entry in parquet_ok.items():
        files.append((p, entry.get("header")))
    readable: list[str] = []
    for p in json_paths:
        try:
            files.append((p, read_header(p)))
            readable.append(p)
        except OSError as exc:
            warnings.append(f"{where_of(p)}: cannot be read ({exc.strerror or exc}); skipped")
    json_paths = readable
    if listed is None:
        listed = {}
    listed.update(_identities(json_paths))
    skipped: dict[str, int] = {}

    def lines_of(p: str) -> int | None:
        if p in parquet_ok:
            rows = parquet_ok[p].get("lines")
            return rows if isinstance(rows, int) else None
        try:
            return count_lines(p)
        except OSError:
            return None

    drafts = collect_sessions(files, warnings, lines_of, skipped)
    if not drafts:
        why = f" ({warnings[0]}{f'; and {len(warnings) - 1} more' if len(warnings) > 1 else ''})" if warnings else ""
        raise NotARunError(f"{path!r} holds no readable goodtrace records{why}")
    sid_of_file: dict[str, int] = {}
    for index, draft in enumerate(drafts.values()):
        for f in draft.files:
            sid_of_file[f] = index
    for p, entry in parquet_ok.items():  # lines the compacted copy skipped, of the files read
        if p in sid_of_file:
            for reason, count in (entry.get("skipped") or {}).items():
                if reason in SKIP_REASONS and isinstance(count, int):
                    skips.add(p, reason, count)
    tmpdir = tempfile.mkdtemp(prefix="goodtrace-load-")
    parquet_fids: dict[int, list[int]] = {}
    json_by_sid: dict[int, list[str]] = {}
    for p in json_paths:
        if p in sid_of_file:
            json_by_sid.setdefault(sid_of_file[p], []).append(p)
    parquet = os.path.join(root, COMPACT_DIR, COMPACT_RECORDS)
    con = None
    try:
        con = duckdb_sql.connect(tmpdir)
        for statement in duckdb_sql.MODEL_TABLES:
            con.execute(statement)
        main_tids = {i: int_or_none(d.header.get("main_tid")) for i, d in enumerate(drafts.values())}
        duckdb_sql.insert_rows(con, "sessmain", list(main_tids.items()))
        total = len(json_paths) + (1 if parquet_ok else 0)
        done = 0
        if parquet_ok:
            fid_to_sid = {
                int(entry["fid"]): sid_of_file[p] for p, entry in parquet_ok.items() if p in sid_of_file
            }
            for fid, sid in fid_to_sid.items():
                parquet_fids.setdefault(sid, []).append(fid)
            duckdb_sql.insert_rows(con, "fidmap", list(fid_to_sid.items()))
            # A view, not a copy: each query reads only the Parquet columns it needs.
            con.execute(f"CREATE TEMP VIEW parquet_records AS SELECT * FROM read_parquet({duckdb_sql.sql_str(parquet)})")
            # Sessions read from exactly the files a compaction summarised take its stored run
            # model; the others (grown since, or merged with newer files) are extracted here.
            stored = stored_run_model(root, manifest) if manifest is not None else None
            from_model: dict[int, int] = {}
            if stored is not None:
                csid_of = {frozenset(fids): csid for csid, fids in enumerate(stored[1])}
                for sid, fids in parquet_fids.items():
                    csid = csid_of.get(frozenset(fids))
                    if sid not in json_by_sid and csid is not None:
                        from_model[sid] = csid
                duckdb_sql.insert_rows(con, "csidmap", [(csid, sid) for sid, csid in from_model.items()])
                duckdb_sql.read_run_model(con, os.path.join(root, COMPACT_DIR), stored[0])
            extract = [(fid, sid) for fid, sid in fid_to_sid.items() if sid not in from_model]
            if extract:
                duckdb_sql.insert_rows(con, "foldmap", extract)
                duckdb_sql.fold_parquet(con)
            done += 1
            if progress is not None:
                progress("reading compacted records", done, total)
        done = fold_sessions(con, json_by_sid, main_tids, tmpdir, engine, progress, done, total, skips, remote)
        if progress is not None:
            progress("summarising", total, total)
        summaries = model_fetch.session_summaries(con)
        sessions = [
            session_info(i, draft, summaries.get(i, {})) for i, draft in enumerate(drafts.values())
        ]
        record_count = sum(int(s.get("records") or 0) for s in summaries.values())
        attempts = number_attempts([(s.rank, s.restart, s.start_wall, s.last_seen_wall) for s in sessions])
        timelines = model_fetch.load_timelines(con, reference_sessions(sessions, attempts), parquet_fids, json_by_sid)
        models = model_fetch.model_events(con)
        for sid, timeline in timelines.items():
            timeline.model = models.get(sid, {})
        duckdb_sql.settle(con)
        hangs = hang_events_in(con)
        # the analysis fetches each session's columns when it cuts it (a block at a time)
        records = model_fetch.SessionRecordsSource(
            con, len(sessions), [s.step_count for s in sessions],
            lambda: shutil.rmtree(tmpdir, ignore_errors=True))
    except BaseException:
        if con is not None:
            con.close()
        shutil.rmtree(tmpdir, ignore_errors=True)
        raise
    form = "jsonl" if not parquet_ok else ("parquet" if not json_paths else "parquet+jsonl")
    _warn_changed(listed, _identities(json_paths), warnings)
    _warn_skipped(skips, skipped, warnings)
    warn_about_gaps(sessions, warnings)
    for s in sessions:
        if s.last_seen - s.proc_start > _YEAR_NS:
            warnings.append(f"rank {s.rank} (session {s.session}) spans {(s.last_seen - s.proc_start) / _YEAR_NS:.0f} "
                            "years from its process start to its last record: a record's time is likely corrupt")
    loaded = LoadedRun(
        path=path, sessions=sessions, timelines=timelines, session_records=records,
        warnings=fold_file_warnings(warnings),
        form=form, records=record_count, files=json_by_sid, parquet_fids=parquet_fids,
        parquet_path=parquet if parquet_ok else None, skipped=skipped,
    )
    loaded.hang_events = hang_details(loaded, hangs)  # the few sessions with a hang: their events' details
    return loaded
