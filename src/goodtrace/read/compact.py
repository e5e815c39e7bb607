"""``goodtrace compact``: every record of a run as one Parquet file, for fast reports."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from typing import Any

from goodtrace.read import duckdb_sql
from goodtrace.read.discovery import count_lines, read_header
from goodtrace.read.loaded import LoadError, Progress
from goodtrace.read.segments import SEGMENT_SUFFIX, NotARunError, list_segments
from goodtrace.read.validate import check_header
from goodtrace.record.storage import is_url, local_path

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


@dataclasses.dataclass(frozen=True)
class CompactResult:
    path: str
    files: int
    records: int  # valid records
    json_bytes: int
    parquet_bytes: int
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)  # lines that are none, by reason
    problems: list[str] = dataclasses.field(default_factory=list)  # files left out, long lines


def compact_run(run_dir: str | os.PathLike[str], *, progress: Progress | None = None) -> CompactResult:
    """Write RUN/compact/records.parquet (every line of every segment, with its file id and why
    it is no valid record, NULL for a record) and a manifest of the segments it covers (path,
    size, header, skipped lines by reason; the line count of a file whose header is unusable).
    The JSON files are left as they are; segments that grow after compaction are read from
    JSON again."""
    path = os.fspath(run_dir)
    if is_url(path):
        raise NotARunError(f"{path!r}: compact works on local run directories")
    root = local_path(path)
    problems: list[str] = []
    segments = [path for _, path in list_segments(root, problems)]
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
        entry = {"fid": len(readable), "path": os.path.relpath(p, root), "size": info.st_size,
                 "mtime_ns": info.st_mtime_ns, "header": header}
        if lines is not None:
            entry["lines"] = lines
        entries.append(entry)
        readable.append(p)
    segments = readable
    out_dir = os.path.join(root, COMPACT_DIR)
    os.makedirs(out_dir, exist_ok=True)
    target = os.path.join(out_dir, COMPACT_RECORDS)
    partial = target + ".partial"
    tmpdir = tempfile.mkdtemp(prefix="goodtrace-compact-")
    import duckdb

    try:
        con = duckdb_sql.connect(tmpdir)
        try:
            duckdb_sql.create_records_table(con)
            con.execute("ALTER TABLE records RENAME COLUMN sid TO fid")
            con.execute("CREATE TEMP TABLE files_batch (path VARCHAR, sid INTEGER)")
            skips = duckdb_sql.FileSkips()
            duckdb_sql.insert_json(con, segments, {p: i for i, p in enumerate(segments)}, progress, 0,
                                   len(segments), skips)
            records = int(con.execute("SELECT count(*) FROM records WHERE bad IS NULL").fetchone()[0])
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
    manifest = {"format": COMPACT_FORMAT, "files": entries}
    with open(os.path.join(out_dir, COMPACT_MANIFEST + ".partial"), "w", encoding="utf-8") as handle:
        json.dump(manifest, handle)
    os.replace(os.path.join(out_dir, COMPACT_MANIFEST + ".partial"), os.path.join(out_dir, COMPACT_MANIFEST))
    return CompactResult(
        path=out_dir,
        files=len(segments),
        records=records,
        json_bytes=sum(e["size"] for e in entries),
        parquet_bytes=os.path.getsize(target),
        skipped=skipped,
        problems=problems,
    )
