"""``goodtrace compact``: every segment of a run reduced once (a chunk of the segment cache,
:mod:`goodtrace.read.segment_cache`) and every record as one Parquet file, for fast reports."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
from typing import Any

from goodtrace.read import duckdb_sql, fold_batches
from goodtrace.read.chunk_files import FileIdentity, write_chunk
from goodtrace.read.discovery import collect_sessions, count_lines, int_or_none, read_header
from goodtrace.read.file_skips import FileSkips
from goodtrace.read.loaded import LoadError, Progress
from goodtrace.read.segment_cache import CACHE_DIR, SegmentCache, open_cache
from goodtrace.read.segments import SEGMENT_SUFFIX, NotARunError, list_segments
from goodtrace.read.validate import check_header
from goodtrace.record.io.storage import is_url, local_path
from goodtrace.record.process import pid_alive

__all__ = ["COMPACT_DIR", "CompactResult", "compact_manifest", "compact_run"]

COMPACT_DIR = "compact"  # RUN/compact/{records.parquet, manifest.json}
COMPACT_MANIFEST = "manifest.json"
COMPACT_RECORDS = "records.parquet"
COMPACT_FORMAT = 3  # 2: the seq, after, exception and rtt_ns columns; 3: every line, and why it is no record (bad)


def compact_manifest(root: str) -> dict[str, Any] | None:
    path = os.path.join(root, COMPACT_DIR, COMPACT_MANIFEST)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            manifest = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != COMPACT_FORMAT:
        return None
    if not os.path.exists(os.path.join(root, COMPACT_DIR, COMPACT_RECORDS)):
        return None
    return manifest


MODEL_PREFIX = "model-"  # RUN/compact/model-<chunk>-<table>.parquet: the run's reduction, a chunk of the segment cache


def _store_reduction(
    con: Any, entries: list[dict[str, Any]], segments: list[str], out_dir: str, skips: FileSkips,
) -> dict[str, Any]:
    """The fold's reduction of every segment, extracted once here and stored beside the
    Parquet copy as one chunk of the segment cache (:mod:`goodtrace.read.segment_cache`,
    files ``model-*.parquet``, its index in the manifest): a report takes each segment's rows
    from it while the segment is as it was compacted (or gone: the copy is then its record).
    Sessions are numbered as the reader groups files (by the header's session id)."""
    drafts = collect_sessions([(p, e["header"]) for p, e in zip(segments, entries, strict=True)], [],
                              lambda _: None, {})
    entry_of = dict(zip(segments, entries, strict=True))
    main_tids = {i: int_or_none(d.header.get("main_tid")) for i, d in enumerate(drafts.values())}
    con.execute("CREATE TEMP TABLE sessmain (sid INTEGER, main_tid UBIGINT)")
    con.execute("CREATE TEMP TABLE session_files (fid INTEGER, sid INTEGER)")
    duckdb_sql.insert_rows(con, "sessmain", list(main_tids.items()))
    duckdb_sql.insert_rows(con, "session_files",
                           [(entry_of[p]["fid"], sid) for sid, d in enumerate(drafts.values()) for p in d.files])
    duckdb_sql.create_segment_tables(con)
    # a few files at a time (fold_batches.file_parts), as the fold parses them: the whole run at
    # once was one grouping of every span start, which DuckDB could not do within its memory for
    # a session of 10 M steps; the files are numbered in order, so each part's rows are a range
    for part in fold_batches.file_parts([e["size"] for e in entries]):
        con.execute(
            "CREATE OR REPLACE TEMP VIEW model_source AS SELECT s.sid, r.* EXCLUDE (bad) "
            "FROM records r JOIN session_files s USING (fid) "
            f"WHERE r.bad IS NULL AND r.fid BETWEEN {part.start} AND {part.stop - 1}"
        )
        duckdb_sql.extract_segments(con, "model_source")
    files: dict[int, FileIdentity] = {}
    for sid, draft in enumerate(drafts.values()):
        for p in draft.files:
            entry = entry_of[p]
            if p in skips.substitutes or "too_long" in skips.by_file.get(p, {}):
                continue  # its records are read again from JSON, through a copy without the long lines
            files[entry["fid"]] = FileIdentity(entry["path"], entry["size"], entry["mtime_ns"], entry.get("inode"),
                                               main_tids[sid])
    return write_chunk(con, out_dir, "model", duckdb_sql.SEGMENT_NAMES, files,
                       {entry_of[p]["fid"]: skips.by_file.get(p, {}) for p in segments}, prefix=MODEL_PREFIX,
                       index_file=False)


@dataclasses.dataclass(frozen=True)
class CompactResult:
    path: str
    files: int
    records: int  # valid records
    json_bytes: int
    parquet_bytes: int
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)  # lines that are none, by reason
    problems: list[str] = dataclasses.field(default_factory=list)  # files left out, long lines


WORK_PREFIX = "work-"  # compact/work-<pid>-*: a compaction in progress


def _remove_leftovers(out_dir: str) -> None:
    """What a killed compaction left in ``out_dir``: its work directory (DuckDB's files) and
    the ``.partial`` files it was writing. Nothing is removed while another compaction of the
    run is alive (its work directory names its process)."""
    alive = False
    stale = []
    for name in os.listdir(out_dir):
        full = os.path.join(out_dir, name)
        if name.startswith(WORK_PREFIX) and os.path.isdir(full):
            pid = name[len(WORK_PREFIX):].split("-", 1)[0]
            if pid.isdigit() and pid_alive(int(pid)):
                alive = True
            else:
                stale.append(full)
    if alive:
        return
    for full in stale:
        shutil.rmtree(full, ignore_errors=True)
    for name in os.listdir(out_dir):
        if name.endswith(".partial"):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(out_dir, name))


def compact_run(run_dir: str | os.PathLike[str], *, progress: Progress | None = None) -> CompactResult:
    """Write RUN/compact/records.parquet (every line of every segment, with its file id and why
    it is no valid record, NULL for a record), the reduction of every segment (one chunk of the
    segment cache, ``model-*.parquet``; the chunks reports kept are dropped) and a manifest of
    the segments it covers (path, size, mtime_ns, inode, header, skipped lines by reason; the
    line count of a file whose header is unusable; the chunk's index).
    The JSON files are left as they are; segments that grow after compaction are read from
    JSON again."""
    path = os.fspath(run_dir)
    if is_url(path):
        raise NotARunError(f"{path!r}: compact works on local run directories")
    root = local_path(path)
    problems: list[str] = []
    # the one command that writes beside the run: the rings of processes proven gone become
    # segments of the run (the reports' copies of the others are not the run's: left out)
    segments = [path for _, path in list_segments(root, problems, in_place=True)]
    if not segments:
        raise NotARunError(f"{path!r} holds no goodtrace records (no rank-*/*{SEGMENT_SUFFIX} files)")
    entries: list[dict[str, Any]] = []
    readable: list[str] = []
    for p in segments:
        try:
            header = read_header(p)
            info = os.stat(p)
            lines = count_lines(p) if check_header(header).header is None else None
        except OSError as exc:
            problems.append(f"{os.path.relpath(p, root)}: cannot be read ({exc.strerror or exc}); skipped")
            continue
        entry = {"fid": len(readable), "path": os.path.relpath(p, root).replace(os.sep, "/"), "size": info.st_size,
                 "mtime_ns": info.st_mtime_ns, "inode": info.st_ino or None, "header": header}
        if lines is not None:
            entry["lines"] = lines
        entries.append(entry)
        readable.append(p)
    segments = readable
    out_dir = os.path.join(root, COMPACT_DIR)
    os.makedirs(out_dir, exist_ok=True)
    _remove_leftovers(out_dir)
    target = os.path.join(out_dir, COMPACT_RECORDS)
    partial = target + ".partial"
    # DuckDB's database and spill files live beside the copy (the run's own disk, and found
    # again by the next compaction if this one is killed), never in a system temp directory
    tmpdir = tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{os.getpid()}-", dir=out_dir)
    import duckdb

    try:
        con = duckdb_sql.connect(tmpdir)
        try:
            duckdb_sql.create_records_table(con)
            con.execute("ALTER TABLE records RENAME COLUMN sid TO fid")
            con.execute("CREATE TEMP TABLE files_batch (path VARCHAR, sid INTEGER)")
            skips = FileSkips()
            duckdb_sql.insert_json(con, segments, {p: i for i, p in enumerate(segments)}, progress, 0,
                                   len(segments), skips)
            records = int(con.execute("SELECT count(*) FROM records WHERE bad IS NULL").fetchone()[0])
            if progress is not None:
                progress("summarising sessions", len(segments), len(segments))
            model = _store_reduction(con, entries, segments, out_dir, skips)
            if progress is not None:
                progress("writing Parquet", len(segments), len(segments))
            con.execute(
                # Sorted by kind, then file: queries of one kind (sync points, spans) and of a
                # few files (the detail ranks) skip the other row groups.
                f"COPY (SELECT * FROM records ORDER BY kind, fid) TO {duckdb_sql.sql_str(partial)} "
                "(FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 122880)"
            )
        finally:
            con.close()
    except duckdb.Error as exc:
        raise LoadError(f"cannot compact {path!r}: {exc}") from None
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    os.replace(partial, target)
    skipped: dict[str, int] = {}
    for entry, p in zip(entries, segments, strict=True):
        counts = skips.by_file.get(p)
        if counts:
            entry["skipped"] = counts
            for reason, count in counts.items():
                skipped[reason] = skipped.get(reason, 0) + count
    problems.extend(skips.notes)
    manifest = {"format": COMPACT_FORMAT, "files": entries, "model": model}
    with open(os.path.join(out_dir, COMPACT_MANIFEST + ".partial"), "w", encoding="utf-8") as handle:
        json.dump(manifest, handle)
    os.replace(os.path.join(out_dir, COMPACT_MANIFEST + ".partial"), os.path.join(out_dir, COMPACT_MANIFEST))
    for name in os.listdir(out_dir):  # the reduction of an earlier compaction
        if name.startswith(MODEL_PREFIX) and name not in model["tables"].values():
            with contextlib.suppress(OSError):
                os.remove(os.path.join(out_dir, name))
    # what reports kept of the segments (in this reader's cache; beside the run, where older
    # goodtrace versions kept them): the chunk above holds it all now
    open_cache(root).clear("model")
    legacy = os.path.join(out_dir, CACHE_DIR)
    if os.path.isdir(legacy):
        SegmentCache(legacy).clear("model")
    return CompactResult(
        path=out_dir,
        files=len(segments),
        records=records,
        json_bytes=sum(e["size"] for e in entries),
        parquet_bytes=os.path.getsize(target),
        skipped=skipped,
        problems=problems,
    )
