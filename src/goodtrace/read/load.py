"""The analytical reader: a run directory -> a ``LoadedRun`` (plain dataclasses), via DuckDB.

DuckDB parses every rank's JSON-lines segments (or reads the Parquet copy that
``compact_run`` writes) into what the run model needs of every session (summaries and compact
columns: executions, sync points, overhead spans, compute per execution, clock samples), so
memory stays bounded for any number of ranks and steps; the step detail (tags, metrics, span time
per step, events) is loaded only for each attempt's reference session (rank 0, or the lowest rank present).
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
from goodtrace.read.cache_keep import (
    LONG_TABLES,
    closed_files,
    closing_columns,
    file_identities,
    kept_columns,
    last_segments,
    open_run_cache,
    prefix_ends,
    store_closed,
    store_prefixes,
)
from goodtrace.read.compact import COMPACT_DIR, COMPACT_RECORDS, compact_manifest, compact_run
from goodtrace.read.detail import Growing, load_details, read_details
from goodtrace.read.detail_columns import keep as keep_detail
from goodtrace.read.detail_columns import prune_kept
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
from goodtrace.read.file_skips import SHORTEN_TO, FileSkips, shortened_copy
from goodtrace.read.io_pool import io_map, stat_or_none
from goodtrace.read.loaded import (
    LoadedRun,
    LoadError,
    Progress,
    SessionDetail,
    SessionInfo,
    SessionRecords,
)
from goodtrace.read.mirror import mirror_run
from goodtrace.read.raw import hang_details, hang_events_in
from goodtrace.read.segment_cache import OPEN_KINDS, Hit
from goodtrace.read.segments import SEGMENT_SUFFIX, NotARunError, list_segments
from goodtrace.read.session_columns import KeptChanged, KeptColumns
from goodtrace.read.session_columns import prune_kept as prune_columns
from goodtrace.read.sessions import number_attempts
from goodtrace.read.validate import describe_skipped
from goodtrace.record.io.storage import is_url, local_path

__all__ = [
    "COMPACT_DIR",
    "Engine",
    "LoadError",
    "LoadedRun",
    "NotARunError",
    "SessionDetail",
    "SessionInfo",
    "SessionRecords",
    "compact_run",
    "load_run",
    "mirror_run",
]

MAX_FILE_WARNINGS = 20  # files named one by one in the warnings; the rest are summed
_YEAR_NS = 366 * 86_400 * 10**9
_STARTS = "seg_starts"  # the span starts: read from the cache last, as a sample where it can (see _load_run)
# The run model in memory (DuckDB spills beyond its limit) where the files whose rows it will
# hold are at most this many bytes of JSON lines: a re-report of a long run, whose closed files'
# long columns are kept, holds only the open files'. The model is about a third of the lines it
# is folded from (500 MB from 1,458 MB), so this much stays within the fetch's memory
# (duckdb_sql.FETCH_MEMORY), whose blocks then read it where it lies; a larger model is
# written to a database file, compressed, which the blocks read back and decode (the spill,
# uncompressed, cost a cold report of 1.4 GB of lines 0.5 s more to read back than the file).
IN_MEMORY_BYTES = 192 * 2**20


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
    return {path: (info.st_ino, info.st_size) for path, info in zip(paths, io_map(stat_or_none, paths, next(iter(paths), "")),
                                                                               strict=True)
            if info is not None}


def _probe(path: str) -> tuple[object, os.stat_result | None] | OSError:
    """A segment file's header (:func:`read_header`), then its stat (None: gone since), or why it
    cannot be read: the per-file work of listing a run, done for many files at once."""
    try:
        header = read_header(path)
    except OSError as exc:
        return exc
    return header, stat_or_none(path)


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


def _warn_skipped(skips: FileSkips, skipped: dict[str, int], warnings: list[str]) -> None:
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
    use_cache: bool = True,
) -> LoadedRun:
    """Read a run directory (JSON lines, and its compacted Parquet form when present).

    ``engine`` says where the sessions are folded (:class:`~goodtrace.read.engine.Engine`; by
    default a local process per core when the run is large enough, ``GOODTRACE_WORKERS``):
    the result is the same wherever; a local worker is a fresh interpreter that imports
    nothing of the caller's program (:mod:`goodtrace.read.fold_worker`). ``use_cache``: take the reduction of closed
    segments from the segment cache, and keep the new ones there
    (:mod:`goodtrace.read.segment_cache`); the result is the same either way.

    Raises ``NotARunError`` when the path holds no readable records, ``LoadError`` when DuckDB
    cannot read them (a damaged compacted copy is skipped in favour of the JSON lines first).
    """
    import duckdb

    listed: dict[str, tuple[int, int]] = {}  # the JSON segments as the first try found them
    try:
        try:
            return _load_run(run_dir, progress=progress, use_compact=use_compact, engine=engine or Engine(),
                             listed=listed, use_cache=use_cache)
        except KeptChanged:  # kept columns or detail replaced by another report while this one read, or damaged: without them
            return _load_run(run_dir, progress=progress, use_compact=use_compact, engine=engine or Engine(),
                             listed=listed, use_cache=use_cache, keep_columns=False)
    except duckdb.Error as exc:
        changed: list[str] = []
        _warn_changed(listed, _identities(list(listed)), changed)
        if not use_compact and not changed:
            raise LoadError(f"cannot read the records of {os.fspath(run_dir)!r}: {exc}") from None
        first = str(exc).splitlines()[0]
    try:  # again, without the compacted copy and with the files as they are now
        loaded = _load_run(run_dir, progress=progress, use_compact=False, engine=engine or Engine(),
                           use_cache=use_cache)
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
    use_cache: bool = True,
    keep_columns: bool = True,
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
    listed_compacted = [p for p in segment_paths if p in compacted]  # a stat each, many at once
    same = {p for p, unchanged in zip(listed_compacted, io_map(lambda p: _unchanged(p, compacted[p]), listed_compacted, root),
                                      strict=True) if unchanged}
    for p in segment_paths:
        if p in same:
            parquet_ok[p] = compacted[p]
        else:
            json_paths.append(p)
    for p, entry in compacted.items():
        if p not in parquet_ok and not os.path.exists(p):
            parquet_ok[p] = entry  # JSON deleted after compaction: the Parquet copy is the record
    if not json_paths and not parquet_ok:
        raise NotARunError(f"{path!r} holds no goodtrace records (no rank-*/*{SEGMENT_SUFFIX} files)")
    files: list[tuple[str, object]] = []
    skips = FileSkips()
    for p, entry in parquet_ok.items():
        files.append((p, entry.get("header")))
    readable: list[str] = []
    stats: dict[str, os.stat_result] = {}  # each file as listed: its identity for the cache, and the check at the end
    for p, probed in zip(json_paths, io_map(_probe, json_paths, root), strict=True):
        if isinstance(probed, OSError):
            warnings.append(f"{where_of(p)}: cannot be read ({probed.strerror or probed}); skipped")
            continue
        files.append((p, probed[0]))
        readable.append(p)
        if probed[1] is not None:
            stats[p] = probed[1]
    json_paths = readable
    if listed is None:
        listed = {}
    listed.update({p: (info.st_ino, info.st_size) for p, info in stats.items()})
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
    main_tids = {i: int_or_none(d.header.get("main_tid")) for i, d in enumerate(drafts.values())}
    # every file of every session numbered in session order: the segment tables' ``fid``
    fid_of: dict[str, int] = {}
    sid_of_fid: dict[int, int] = {}
    for sid, draft in enumerate(drafts.values()):
        for f in draft.files:
            sid_of_fid[fid_of.setdefault(f, len(fid_of))] = sid
    identities = file_identities(root, drafts, main_tids, parquet_ok, stats)
    cache = open_run_cache(root, manifest, use_cache)
    tmpdir = tempfile.mkdtemp(prefix="goodtrace-load-")
    parquet_fids: dict[int, list[int]] = {}
    json_by_sid: dict[int, list[str]] = {}
    for p in json_paths:
        if p in sid_of_file:
            json_by_sid.setdefault(sid_of_file[p], []).append(p)
    for p, entry in parquet_ok.items():
        if p in sid_of_file:
            parquet_fids.setdefault(sid_of_file[p], []).append(int(entry["fid"]))
    parquet = os.path.join(root, COMPACT_DIR, COMPACT_RECORDS)
    con = None
    try:
        # Closed segments the cache holds as they are now are not read again
        hits: dict[int, Hit] = {}
        kept: KeptColumns | None = None
        covered: set[int] = set()
        if cache is not None:
            hits = cache.find("model", {fid_of[p]: ident for p, ident in identities.items()})
            kept = kept_columns(cache, hits, drafts, fid_of, identities) if keep_columns else None
            covered = kept.covered() if kept is not None else set()
        # the files whose rows DuckDB will hold (all but those whose long columns are kept)
        held = sum(ident.size for p, ident in identities.items() if fid_of[p] not in covered)
        con = duckdb_sql.connect(tmpdir, in_memory=not parquet_ok and held <= IN_MEMORY_BYTES)
        for statement in duckdb_sql.MODEL_TABLES:
            con.execute(statement)
        duckdb_sql.insert_rows(con, "sessmain", list(main_tids.items()))
        if parquet_ok:
            # A view, not a copy: each query reads only the Parquet columns it needs.
            con.execute(f"CREATE TEMP VIEW parquet_records AS SELECT * FROM read_parquet({duckdb_sql.sql_str(parquet)})")
        if cache is not None:
            # every table but the span starts, of which only a sample is kept (below); of the
            # files whose long columns are kept, only the small tables
            failed = cache.load(con, "model", {fid: hit for fid, hit in hits.items() if fid not in covered},
                                sid_of_fid, tables=_STARTS.__ne__)
            failed |= cache.load(con, "model", {fid: hit for fid, hit in hits.items() if fid in covered},
                                 sid_of_fid, tables=lambda t: t != _STARTS and t not in LONG_TABLES)
            if kept is not None and failed & covered:  # those sessions' long tables from the cache after all
                for sid in {sid_of_fid[fid] for fid in failed & covered}:
                    lost = kept.sessions.pop(sid)
                    failed |= cache.load(con, "model", {fid: hits[fid] for fid in lost.fids.tolist() if fid not in failed},
                                         sid_of_fid, tables=LONG_TABLES.__contains__)
                duckdb_sql.delete_files(con, failed)  # whatever was loaded of them: they are read again whole
            for fid in failed:
                del hits[fid]
        path_of = {fid: p for p, fid in fid_of.items()}
        for fid, hit in hits.items():
            skips.add_stored(path_of[fid], hit.skipped)
        # The files still being written: the longest prefix of each the cache holds is loaded,
        # and only the bytes after it are read, from a copy (whole lines up to there are kept).
        # In the mirror of a run on object storage too: it appends what a grown object gained
        # to its file (the same inode), unless the object was rewritten (then a new file).
        # (Only where prefixes can be kept: with the cache off, or no folder to write it in, an open
        # file is read as it is, not copied first.)
        open_hits: dict[int, Hit] = {}
        ranges: dict[str, tuple[int, int]] = {}
        if cache is not None and cache.folder is not None:
            json_set = set(json_paths)
            growing = {fid_of[p]: p for p in last_segments(drafts, files)
                       if p in json_set and p in identities and fid_of[p] not in hits}
            open_hits = cache.find_prefixes(OPEN_KINDS["model"], {fid: (p, identities[p]) for fid, p in growing.items()})
            for fid in cache.load(con, OPEN_KINDS["model"], open_hits, sid_of_fid):
                del open_hits[fid]
            for fid, p in growing.items():
                found = open_hits.get(fid)
                ranges[p] = ((found.prefix or 0) if found is not None else 0, identities[p].size)
                if found is not None:
                    skips.add_stored(p, found.skipped)
        for p, entry in parquet_ok.items():  # lines the compacted copy skipped, of the files read from it
            if p in sid_of_file and fid_of[p] not in hits:
                skips.add_stored(p, entry.get("skipped") or {})
        fold_json_by_sid = {sid: [p for p in paths if fid_of[p] not in hits] for sid, paths in json_by_sid.items()}
        fold_json_by_sid = {sid: paths for sid, paths in fold_json_by_sid.items() if paths}
        fold_parquet = [(int(entry["fid"]), sid_of_file[p], fid_of[p]) for p, entry in parquet_ok.items()
                        if p in sid_of_file and fid_of[p] not in hits]
        total = sum(len(paths) for paths in fold_json_by_sid.values()) + (1 if fold_parquet else 0)
        done = 0
        if fold_parquet:
            duckdb_sql.insert_rows(con, "foldmap", fold_parquet)
            duckdb_sql.fold_parquet(con)
            done += 1
            if progress is not None:
                progress("reading compacted records", done, total)
        read_bytes = sum(ranges[p][1] - ranges[p][0] if p in ranges else identities[p].size if p in identities else 0
                         for paths in fold_json_by_sid.values() for p in paths)
        done = fold_sessions(con, fold_json_by_sid, fid_of, main_tids, tmpdir, engine, progress, done, total, skips,
                             remote, ranges)
        if hits and cache is not None:
            # the span starts: only the sample finish_model keeps, now that every file's summary
            # is in (all of them of the chunks this load's chunk will replace: it keeps them)
            merged = cache.merging("model")
            failed = cache.load(con, "model", {fid: hit for fid, hit in hits.items() if hit.chunk in merged},
                                sid_of_fid, tables=_STARTS.__eq__)
            failed |= cache.load(con, "model", {fid: hit for fid, hit in hits.items() if hit.chunk not in merged},
                                 sid_of_fid, tables=_STARTS.__eq__, filters={"seg_starts": duckdb_sql.sampled_starts(con)})
            if failed:  # read again, whole
                duckdb_sql.delete_files(con, failed)
                again: dict[int, list[str]] = {}
                again_parquet: list[tuple[int, int, int]] = []
                for fid in sorted(failed):
                    del hits[fid]
                    skips.by_file.pop(path_of[fid], None)  # counted again as it is read
                    entry = parquet_ok.get(path_of[fid])
                    if entry is not None:
                        again_parquet.append((int(entry["fid"]), sid_of_fid[fid], fid))
                        skips.add_stored(path_of[fid], entry.get("skipped") or {})
                    else:
                        again.setdefault(sid_of_fid[fid], []).append(path_of[fid])
                if again_parquet:
                    con.execute("DELETE FROM foldmap")
                    duckdb_sql.insert_rows(con, "foldmap", again_parquet)
                    duckdb_sql.fold_parquet(con)
                fold_sessions(con, again, fid_of, main_tids, tmpdir, Engine(workers=1), None, 0, 0, skips, remote)
        for p in ranges:  # a range read without its long lines: the views that read the file
            # again (records, trace, hang stacks) need all of it without them, as a file read whole
            if p in skips.long_ranges and p not in skips.substitutes:
                shortened = shortened_copy(p, SHORTEN_TO)
                if shortened is not None:
                    skips.substitutes[p] = shortened[0]
        for paths in json_by_sid.values():  # files read from copies without their long lines
            paths[:] = [skips.substitutes.get(p, p) for p in paths]
        if cache is not None:
            closed = closed_files(con, drafts, files)
            store_closed(cache, con, root, "model", duckdb_sql.SEGMENT_NAMES,
                   {fid_of[p]: identities[p] for p in closed if p in identities}, hits, skips, path_of)
            ends = prefix_ends(ranges, skips)
            store_prefixes(cache, con, OPEN_KINDS["model"], duckdb_sql.SEGMENT_NAMES, ends, open_hits, closed,
                            identities, fid_of)
            cache.prune({ident.path: ident for ident in identities.values()})
        else:
            closed = set()
            ends = {}
        duckdb_sql.finish_model(con)
        if progress is not None:
            progress("summarising", total, total)
        summaries = model_fetch.session_summaries(con)
        sessions = [
            session_info(i, draft, summaries.get(i, {})) for i, draft in enumerate(drafts.values())
        ]
        record_count = sum(int(s.get("records") or 0) for s in summaries.values())
        attempts = number_attempts([(s.rank, s.restart, s.start_wall, s.last_seen_wall, s.wall(s.init)) for s in sessions])
        references = reference_sessions(sessions, attempts)
        detail = read_details(con, root, cache, references, list(drafts.values()), fid_of, identities, closed, skips,
                               parquet_ok, path_of, Growing(ranges, ends, os.path.join(tmpdir, "detail")), list(drafts),
                               use_kept=keep_columns)
        # DuckDB's memory cut before the reference sessions' detail is fetched and ordered in numpy
        duckdb_sql.settle(con)
        folder, names = detail.folder, list(drafts)
        details = load_details(
            con, references, detail.columns, detail.closing,
            None if folder is None else lambda sid, columns: keep_detail(
                folder, names[sid], duckdb_sql.RUN_MODEL_VERSION, detail.files[sid], columns))
        if folder is not None:
            prune_kept(folder, drafts)
        models = model_fetch.model_events(con)
        for sid, session_detail in details.items():
            session_detail.model = models.get(sid, {})
        if kept is not None:
            closing_columns(con, kept, root, drafts, sessions, fid_of, identities, closed, skips)
        vocab = model_fetch.model_vocab(con, kept)
        model_fetch.fill_compute(con, [s.step_count for s in sessions], vocab, kept)  # within the settled memory
        if kept is not None:
            prune_columns(kept.folder, drafts)
        hangs = hang_events_in(con)
        file_ranges = {skips.substitutes.get(path_of[fid], path_of[fid]): found
                       for fid, found in model_fetch.file_ranges(con).items() if fid in path_of}
        # the analysis fetches each session's columns when it cuts it (a block at a time)
        records = model_fetch.SessionRecordsSource(
            con, len(sessions), [s.step_count for s in sessions],
            lambda: shutil.rmtree(tmpdir, ignore_errors=True), vocab, kept)
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
        path=path, sessions=sessions, details=details, session_records=records,
        warnings=fold_file_warnings(warnings),
        form=form, records=record_count, files=json_by_sid, file_ranges=file_ranges, parquet_fids=parquet_fids,
        parquet_path=parquet if parquet_ok else None, skipped=skipped, read_bytes=read_bytes,
    )
    loaded.hang_events = hang_details(loaded, hangs)  # the few sessions with a hang: their events' details
    return loaded
