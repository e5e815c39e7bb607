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

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

from goodtrace import schema
from goodtrace.read import duckdb_connection, duckdb_sql, model_fetch
from goodtrace.read.compact import COMPACT_DIR, COMPACT_RECORDS, compact_manifest, compact_run
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
from goodtrace.read.long_lines import shortened_copy
from goodtrace.read.mirror import mirror_run
from goodtrace.read.segment_cache import (
    OPEN_KINDS,
    FileIdentity,
    Hit,
    SegmentCache,
    identity_of,
    open_cache,
    prefix_digest,
)
from goodtrace.read.segments import SEGMENT_SUFFIX, NotARunError, list_segments
from goodtrace.read.sessions import number_attempts
from goodtrace.read.validate import MAX_LINE_BYTES, SKIP_REASONS, describe_skipped
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
# A file still being written is kept in the cache again (as a longer prefix) once this many
# bytes, or a quarter of the prefix kept, were read after the prefix: a re-report reads at most
# that much twice, and writes the file's reduction again that seldom.
PREFIX_STEP_BYTES = 1 << 20


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


def _file_identities(
    root: str, drafts: dict[str, Any], main_tids: dict[int, int | None], parquet_ok: dict[str, dict[str, Any]],
) -> dict[str, FileIdentity]:
    """Each file's identity for the segment cache: as it is on disk, or (its JSON gone, read
    from the compacted copy) as the compaction's manifest recorded it."""
    out: dict[str, FileIdentity] = {}
    for sid, draft in enumerate(drafts.values()):
        for p in draft.files:
            ident = identity_of(root, p, main_tids.get(sid))
            entry = parquet_ok.get(p)
            if ident is None and entry is not None and isinstance(entry.get("size"), int) \
                    and isinstance(entry.get("mtime_ns"), int):
                ident = FileIdentity(os.path.relpath(p, root).replace(os.sep, "/"), entry["size"], entry["mtime_ns"],
                                     None, main_tids.get(sid))
            if ident is not None:
                out[p] = ident
    return out


def _open_cache(root: str, manifest: dict[str, Any] | None, use_cache: bool) -> SegmentCache | None:
    """The run's segment cache, with the reduction a compaction stored (one more chunk)."""
    if not use_cache:
        return None
    stored = manifest.get("model") if manifest is not None else None
    extra = [(os.path.join(root, COMPACT_DIR), stored)] if isinstance(stored, dict) else []
    return open_cache(root, extra)


def _segment_number(header: object) -> int:
    value = header.get(schema.H_SEGMENT) if isinstance(header, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _closed_files(con: Any, drafts: dict[str, Any], files: list[tuple[str, object]]) -> set[str]:
    """The files no writer will append to: every file of a finished session, and every file
    of a session but its last segment (the writer rotated away from it)."""
    finished = {int(row[0]) for row in con.execute("SELECT DISTINCT sid FROM seg_summ WHERE has_finish > 0").fetchall()}
    number = {p: _segment_number(header) for p, header in files}
    closed: set[str] = set()
    for sid, draft in enumerate(drafts.values()):
        last = max(number.get(p, 0) for p in draft.files)
        closed.update(p for p in draft.files if sid in finished or number.get(p, 0) < last)
    return closed


def _last_segments(drafts: dict[str, Any], files: list[tuple[str, object]]) -> list[str]:
    """Each session's last segment: the file a writer may still be appending to."""
    number = {p: _segment_number(header) for p, header in files}
    return [max(draft.files, key=lambda p: number.get(p, 0)) for draft in drafts.values()]


def _whole_lines(path: str, end: int) -> int | None:
    """Where the last whole line of a file's first ``end`` bytes ends (None: none found, or
    the file cannot be read)."""
    try:
        with open(path, "rb") as handle:
            position = end
            block = 1 << 16
            while position > 0 and end - position <= 2 * MAX_LINE_BYTES:
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
    except OSError:
        return None
    return None


def _prefix_ends(ranges: dict[str, tuple[int, int]], skips: duckdb_sql.FileSkips) -> dict[str, tuple[int, dict[str, int]]]:
    """Of the files read up to a point (``ranges``), how much the cache may keep as a prefix and
    the lines skipped in it: up to the last whole line read, when a partial line after it
    (a write in progress) was counted as torn, not read as a record. A file with a line too
    long to read is not kept (as a closed one is not)."""
    out: dict[str, tuple[int, dict[str, int]]] = {}
    for path, (_, end) in ranges.items():
        if path in skips.unranged or path in skips.long_ranges:  # read whole (to wherever it ended then),
            continue  # or with lines too long to read: not kept, as a closed file is not
        counts = dict(skips.by_file.get(path, {}))
        n = _whole_lines(path, end) if end > 0 else None
        if n is None or "too_long" in counts:
            continue
        if n < end:
            if counts.get("torn_last_line", 0) < 1:
                continue  # the partial line read as a record: the next report could not start after it
            counts["torn_last_line"] -= 1
            if not counts["torn_last_line"]:
                del counts["torn_last_line"]
        out[path] = (n, counts)
    return out


def _store_prefixes(
    cache: SegmentCache, con: Any, kind: str, tables: Sequence[str], ends: dict[str, tuple[int, dict[str, int]]],
    hits: dict[int, Hit], closed: set[str], identities: dict[str, FileIdentity], fid_of: dict[str, int],
) -> None:
    """Keep the rows of the files still being written as prefixes (``ends``: how much of each,
    :func:`_prefix_ends`), where enough was read after the prefix the cache held (``hits``).
    When the folder holds many chunks of ``kind`` (files that grew at different times), the
    new one holds every file of ``ends`` and replaces them."""
    replace = cache.crowded(kind)
    files: dict[int, FileIdentity] = {}
    counts: dict[int, dict[str, int]] = {}
    prefixes: dict[int, tuple[int, str]] = {}
    for path, (n, skipped) in ends.items():
        fid = fid_of[path]
        hit = hits.get(fid)
        ident = identities.get(path)
        if path in closed or ident is None or ident.inode is None or (not replace and hit is not None and (
                hit.prefix is not None and n - hit.prefix < max(PREFIX_STEP_BYTES, hit.prefix // 4))):
            continue
        digest = prefix_digest(path, n)
        if digest is None:
            continue
        files[fid] = dataclasses.replace(ident, size=n)
        counts[fid] = skipped
        prefixes[fid] = (n, digest)
    cache.store(con, kind, tables, files, counts, prefixes=prefixes, replace=replace)


def _store(
    cache: SegmentCache, con: Any, root: str, kind: str, tables: Sequence[str], closed: dict[int, FileIdentity],
    hits: dict[int, Hit], skips: duckdb_sql.FileSkips, path_of: dict[int, str],
) -> None:
    """Keep the rows of the closed files just read (``closed``: every closed file, ``hits``: those
    read from the cache), unless a file changed while it was read or had lines too long to read
    (the views that read its records again need the copy). When the folder holds many chunks,
    the new one holds its hits too, and replaces them."""
    replace = cache.crowded(kind)
    files = {fid: ident for fid, ident in closed.items()
             if fid not in hits or (replace and cache.own(hits[fid]))}
    keep: dict[int, FileIdentity] = {}
    for fid, ident in files.items():
        path = path_of[fid]
        if path in skips.substitutes or "too_long" in skips.by_file.get(path, {}):
            continue
        if os.path.exists(path):
            now = identity_of(root, path, ident.main_tid)
            if now != ident:
                continue
        keep[fid] = ident
    cache.store(con, kind, tables, keep, {fid: skips.by_file.get(path_of[fid], {}) for fid in keep}, replace=replace)


@dataclasses.dataclass(frozen=True)
class _Growing:
    """The files still being written, as the fold read them: the bytes read of each
    (``ranges``), how much of each the cache may keep (``ends``), and a folder for copies."""

    ranges: dict[str, tuple[int, int]]
    ends: dict[str, tuple[int, dict[str, int]]]
    folder: str


def _read_details(
    con: Any, root: str, cache: SegmentCache | None, references: Sequence[int], drafts: Sequence[Any], fid_of: dict[str, int],
    identities: dict[str, FileIdentity], closed: set[str], skips: duckdb_sql.FileSkips,
    parquet_ok: dict[str, dict[str, Any]], path_of: dict[int, str], growing: _Growing,
) -> None:
    """The reference sessions' detail into the ``det_*`` tables: from the cache, or read from
    their files (JSON, or the compacted copy) and kept when closed; of a file still being
    written, the prefix the cache holds and the bytes the fold read after it."""
    model_fetch.create_detail_tables(con)
    wanted = {fid_of[p]: (sid, p) for sid in sorted(set(references)) for p in drafts[sid].files}
    hits: dict[int, Hit] = {}
    open_hits: dict[int, Hit] = {}
    kind = OPEN_KINDS["detail"]
    if cache is not None:
        hits = cache.find("detail", {fid: identities[p] for fid, (_, p) in wanted.items() if p in identities})
        for fid in cache.load(con, "detail", hits, {fid: sid for fid, (sid, _) in wanted.items()}):
            del hits[fid]
        open_hits = cache.find_prefixes(kind, {fid: (p, identities[p]) for fid, (_, p) in wanted.items()
                                               if fid not in hits and p in growing.ranges})
        for fid in cache.load(con, kind, open_hits, {fid: sid for fid, (sid, _) in wanted.items()}):
            del open_hits[fid]
    json_rows: list[tuple[str, int, int]] = []
    parquet_rows: list[tuple[int, int, int]] = []
    for fid, (sid, p) in sorted(wanted.items()):
        if fid in hits:
            continue
        if p in parquet_ok:
            parquet_rows.append((int(parquet_ok[p]["fid"]), sid, fid))
        elif p in growing.ranges:  # the bytes the fold read, after the prefix the cache holds
            hit = open_hits.get(fid)
            try:
                copy = duckdb_sql.range_copy(p, hit.prefix if hit is not None and hit.prefix is not None else 0,
                                             growing.ranges[p][1], growing.folder)
            except OSError:  # gone since the fold: DuckDB says so, and the run is read again
                copy = p
            if p in skips.long_ranges:
                found = shortened_copy(copy, duckdb_sql.SHORTEN_TO)
                copy = found[0] if found is not None else copy
            json_rows.append((copy, sid, fid))
        else:
            json_rows.append((skips.substitutes.get(p, p), sid, fid))
    try:
        model_fetch.extract_details(con, json_rows, parquet_rows)
    finally:
        shutil.rmtree(growing.folder, ignore_errors=True)
    if cache is not None:
        _store(cache, con, root, "detail", model_fetch.DETAIL_NAMES,
               {fid: identities[p] for fid, (_, p) in wanted.items() if p in closed and p in identities}, hits, skips,
               path_of)
        _store_prefixes(cache, con, kind, model_fetch.DETAIL_NAMES,
                        {p: end for fid, (_, p) in wanted.items() if fid not in hits and (end := growing.ends.get(p))},
                        open_hits, closed, identities, fid_of)


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
    the result is the same wherever. A caller running inside a script whose module level
    does work (a training script) passes ``Engine(workers=1)``: pool workers are spawned
    interpreters, which import the main module. ``use_cache``: take the reduction of closed
    segments from the segment cache, and keep the new ones there
    (:mod:`goodtrace.read.segment_cache`); the result is the same either way.

    Raises ``NotARunError`` when the path holds no readable records, ``LoadError`` when DuckDB
    cannot read them (a damaged compacted copy is skipped in favour of the JSON lines first).
    """
    import duckdb

    listed: dict[str, tuple[int, int]] = {}  # the JSON segments as the first try found them
    try:
        return _load_run(run_dir, progress=progress, use_compact=use_compact, engine=engine or Engine(),
                         listed=listed, use_cache=use_cache)
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
    main_tids = {i: int_or_none(d.header.get("main_tid")) for i, d in enumerate(drafts.values())}
    # every file of every session numbered in session order: the segment tables' ``fid``
    fid_of: dict[str, int] = {}
    sid_of_fid: dict[int, int] = {}
    for sid, draft in enumerate(drafts.values()):
        for f in draft.files:
            sid_of_fid[fid_of.setdefault(f, len(fid_of))] = sid
    identities = _file_identities(root, drafts, main_tids, parquet_ok)
    cache = _open_cache(root, manifest, use_cache)
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
        con = duckdb_connection.connect(tmpdir)
        for statement in duckdb_sql.MODEL_TABLES:
            con.execute(statement)
        duckdb_connection.insert_rows(con, "sessmain", list(main_tids.items()))
        if parquet_ok:
            # A view, not a copy: each query reads only the Parquet columns it needs.
            con.execute(f"CREATE TEMP VIEW parquet_records AS SELECT * FROM read_parquet({duckdb_connection.sql_str(parquet)})")
        # Closed segments the cache holds as they are now are not read again
        hits: dict[int, Hit] = {}
        if cache is not None:
            hits = cache.find("model", {fid_of[p]: ident for p, ident in identities.items()})
            # every table but the span starts, of which only a sample is kept (below)
            for fid in cache.load(con, "model", hits, sid_of_fid, tables=lambda table: table != "seg_starts"):
                del hits[fid]
        path_of = {fid: p for p, fid in fid_of.items()}
        for fid, hit in hits.items():
            for reason, count in hit.skipped.items():
                if reason in SKIP_REASONS and isinstance(count, int):
                    skips.add(path_of[fid], reason, count)
        # The files still being written: the longest prefix of each the cache holds is loaded,
        # and only the bytes after it are read, from a copy (whole lines up to there are kept).
        # Not for a mirror of object storage: it replaces a grown file (a new inode) with the
        # whole new object, so that a prefix would never be found again.
        open_hits: dict[int, Hit] = {}
        ranges: dict[str, tuple[int, int]] = {}
        if cache is not None and remote is None:
            json_set = set(json_paths)
            growing = {fid_of[p]: p for p in _last_segments(drafts, files)
                       if p in json_set and p in identities and fid_of[p] not in hits}
            open_hits = cache.find_prefixes(OPEN_KINDS["model"], {fid: (p, identities[p]) for fid, p in growing.items()})
            for fid in cache.load(con, OPEN_KINDS["model"], open_hits, sid_of_fid):
                del open_hits[fid]
            for fid, p in growing.items():
                found = open_hits.get(fid)
                ranges[p] = (found.prefix if found is not None and found.prefix is not None else 0, identities[p].size)
                for reason, count in (found.skipped.items() if found is not None else ()):
                    if reason in SKIP_REASONS and isinstance(count, int):
                        skips.add(p, reason, count)
        for p, entry in parquet_ok.items():  # lines the compacted copy skipped, of the files read from it
            if p in sid_of_file and fid_of[p] not in hits:
                for reason, count in (entry.get("skipped") or {}).items():
                    if reason in SKIP_REASONS and isinstance(count, int):
                        skips.add(p, reason, count)
        fold_json_by_sid = {sid: [p for p in paths if fid_of[p] not in hits] for sid, paths in json_by_sid.items()}
        fold_json_by_sid = {sid: paths for sid, paths in fold_json_by_sid.items() if paths}
        fold_parquet = [(int(entry["fid"]), sid_of_file[p], fid_of[p]) for p, entry in parquet_ok.items()
                        if p in sid_of_file and fid_of[p] not in hits]
        total = sum(len(paths) for paths in fold_json_by_sid.values()) + (1 if fold_parquet else 0)
        done = 0
        if fold_parquet:
            duckdb_connection.insert_rows(con, "foldmap", fold_parquet)
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
            # is in (all of them when this load's chunk will replace the others: it keeps them)
            failed = cache.load(con, "model", hits, sid_of_fid, tables=lambda table: table == "seg_starts",
                                filters=None if cache.crowded("model") else {"seg_starts": duckdb_sql.SAMPLED_STARTS})
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
                        for reason, count in (entry.get("skipped") or {}).items():
                            if reason in SKIP_REASONS and isinstance(count, int):
                                skips.add(path_of[fid], reason, count)
                    else:
                        again.setdefault(sid_of_fid[fid], []).append(path_of[fid])
                if again_parquet:
                    con.execute("DELETE FROM foldmap")
                    duckdb_connection.insert_rows(con, "foldmap", again_parquet)
                    duckdb_sql.fold_parquet(con)
                fold_sessions(con, again, fid_of, main_tids, tmpdir, Engine(workers=1), None, 0, 0, skips, remote)
        for p in ranges:  # a range read without its long lines: the views that read the file
            # again (records, trace, hang stacks) need all of it without them, as a file read whole
            if p in skips.long_ranges and p not in skips.substitutes:
                shortened = shortened_copy(p, duckdb_sql.SHORTEN_TO)
                if shortened is not None:
                    skips.substitutes[p] = shortened[0]
        for paths in json_by_sid.values():  # files read from copies without their long lines
            paths[:] = [skips.substitutes.get(p, p) for p in paths]
        if cache is not None:
            closed = _closed_files(con, drafts, files)
            _store(cache, con, root, "model", duckdb_sql.SEGMENT_NAMES,
                   {fid_of[p]: identities[p] for p in closed if p in identities}, hits, skips, path_of)
            ends = _prefix_ends(ranges, skips)
            _store_prefixes(cache, con, OPEN_KINDS["model"], duckdb_sql.SEGMENT_NAMES, ends, open_hits, closed,
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
        attempts = number_attempts([(s.rank, s.restart, s.start_wall, s.last_seen_wall) for s in sessions])
        references = reference_sessions(sessions, attempts)
        _read_details(con, root, cache, references, list(drafts.values()), fid_of, identities, closed, skips, parquet_ok,
                      path_of, _Growing(ranges, ends, os.path.join(tmpdir, "detail")))
        timelines = model_fetch.load_timelines(con, references)
        models = model_fetch.model_events(con)
        for sid, timeline in timelines.items():
            timeline.model = models.get(sid, {})
        duckdb_connection.settle(con)
        model_fetch.fill_compute(con, [s.step_count for s in sessions])  # within the settled memory
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
        parquet_path=parquet if parquet_ok else None, skipped=skipped, read_bytes=read_bytes,
    )
    loaded.hang_events = hang_details(loaded, hangs)  # the few sessions with a hang: their events' details
    return loaded
