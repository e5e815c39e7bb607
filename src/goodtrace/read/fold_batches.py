"""The fold's JSON parsing in batches: whole sessions of about :data:`FOLD_BATCH_FILES` files
parsed at once into a table, their invalid lines counted and dropped, then extracted into the
segment tables (:func:`goodtrace.read.duckdb_sql.extract_segments`); of the files still being
written, only the bytes after what the cache holds, read from a copy of that range (in memory
when small). The SQL that makes the tables is :mod:`goodtrace.read.duckdb_sql`'s; this module
decides what is parsed together and from where."""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from goodtrace import schema
from goodtrace.read.discovery import where_of
from goodtrace.read.duckdb_sql import INVALID, RECORD_COLUMNS, count_skips, extract_segments, read_batch
from goodtrace.read.file_skips import FileSkips, range_copy
from goodtrace.read.io_pool import io_map, stat_or_none
from goodtrace.read.loaded import Progress

__all__ = ["FOLD_BATCH_BYTES", "FOLD_BATCH_FILES", "FOLD_BATCH_MOST", "batch_parts", "file_parts", "fold_json", "fold_sizes",
           "session_batches"]

FOLD_BATCH_FILES = 32  # files parsed into one batch table (whole sessions, but a long session's in parts of this many)
# ... or more, while the batch's bytes stay under FOLD_BATCH_BYTES (up to FOLD_BATCH_MOST files): a
# batch costs a dozen statements whatever it holds, which the small parts of the files a live
# run's re-report reads (thousands of ranks' open segments, a few KB each) would pay per 32 files
FOLD_BATCH_BYTES = 64 << 20
FOLD_BATCH_MOST = 1024


def fold_sizes(files_by_sid: Mapping[int, Sequence[str]], ranges: Mapping[str, tuple[int, int]] | None) -> dict[str, int]:
    """Each file's size, or that of the part of it to read (0 when it cannot be read: the fold
    reports it); the stats many at once (a network filesystem)."""
    paths = [path for paths in files_by_sid.values() for path in paths]
    whole = [path for path in paths if not (ranges and path in ranges)]
    found = dict(zip(whole, io_map(stat_or_none, whole, next(iter(whole), "")), strict=True))
    return {path: ranges[path][1] - ranges[path][0] if ranges and path in ranges
            else (info.st_size if (info := found[path]) is not None else 0) for path in paths}


def session_batches(files_by_sid: Mapping[int, Sequence[str]], sizes: Mapping[str, int]) -> list[list[int]]:
    """The sessions of each batch :func:`fold_json` parses at once: in session order, whole
    sessions of about :data:`FOLD_BATCH_FILES` files, more while they are small (see
    :data:`FOLD_BATCH_BYTES`). :mod:`goodtrace.read.engine` gives each worker a run of
    consecutive batches, so that a worker parses the batches one process would."""
    sids = sorted(files_by_sid)
    groups = _groups([(len(files_by_sid[sid]), sum(sizes.get(p, 0) for p in files_by_sid[sid])) for sid in sids])
    return [sids[group.start:group.stop] for group in groups]


def _groups(items: Sequence[tuple[int, int]]) -> list[range]:
    """Consecutive items (their files, their bytes) in groups of about :data:`FOLD_BATCH_FILES`
    files, more while they add up to under :data:`FOLD_BATCH_BYTES` (up to
    :data:`FOLD_BATCH_MOST` files); an item is never split. The one rule of a batch's size."""
    groups: list[range] = []
    start = files = held = 0
    for i, (count, size) in enumerate(items):
        if files and files + count > FOLD_BATCH_FILES and (held + size > FOLD_BATCH_BYTES
                                                           or files + count > FOLD_BATCH_MOST):
            groups.append(range(start, i))
            start, files, held = i, 0, 0
        files += count
        held += size
    if len(items) > start:
        groups.append(range(start, len(items)))
    return groups


SHARED_MEMORY = "/dev/shm"
SHARED_MEMORY_BYTES = 16 << 20  # a batch's range copies kept in memory up to this (a quarter of its free space at most)


def _copies_dir(size: int) -> str | None:
    """Where a batch's range copies go: in memory (``/dev/shm``) when they are small (what a
    live run's re-report reads of each rank's open segment: a file created there costs
    microseconds, on a disk it may cost a millisecond, thousands of times) and fit four times
    in its free space (a container's may be 64 MB); else the temporary directory."""
    try:
        if size <= SHARED_MEMORY_BYTES and os.access(SHARED_MEMORY, os.W_OK | os.X_OK):
            free = os.statvfs(SHARED_MEMORY)
            if free.f_bavail * free.f_frsize >= 4 * size:
                return SHARED_MEMORY
    except OSError:
        pass
    return None


def _copy_of(ranges: Mapping[str, tuple[int, int]], folders: list[str], lock: threading.Lock,
             row: tuple[str, int, int]) -> str | OSError | None:
    """The range copy of a batch's file (None: read whole), or why it could not be made."""
    if row[0] not in ranges:
        return None
    try:
        return _range_copy(row[0], ranges[row[0]], folders, lock)
    except OSError as exc:
        return exc


def _range_copy(path: str, part: tuple[int, int], folders: list[str], lock: threading.Lock) -> str:
    """:func:`range_copy` into the batch's folder, or, when that is in memory and the copy fails
    there (full since it was checked), into a folder on disk added to ``folders`` (under
    ``lock``: the copies of a batch are made on several threads)."""
    try:
        return range_copy(path, *part, folders[0])
    except OSError:
        if not folders[0].startswith(SHARED_MEMORY + os.sep):
            raise
    with lock:
        if len(folders) < 2:
            folders.append(tempfile.mkdtemp(prefix="goodtrace-range-"))
    return range_copy(path, *part, folders[1])


def fold_json(
    con: Any, files_by_sid: dict[int, list[str]], fid_of: Mapping[str, int], progress: Progress | None, done: int,
    total: int, skips: FileSkips, ranges: Mapping[str, tuple[int, int]] | None = None,
    sizes: Mapping[str, int] | None = None,
) -> int:
    """Parse the JSON files, whole sessions of about 32 files at a time: each batch is parsed
    once into a table (every line, with why it is no valid record) that the extraction queries
    then read for its valid records, into the segment tables (each file's rows under its
    number in ``fid_of``). Skipped lines are counted in ``skips``; a file read from a
    copy without its long lines is replaced by the copy in ``files_by_sid``. ``ranges``: of
    the files being written, the bytes to read (start, end): read from a copy of those
    (:func:`range_copy`, made as its batch is read and removed after it)."""
    batches: list[list[tuple[str, int, int]]] = []
    sizes = sizes if sizes is not None else fold_sizes(files_by_sid, ranges)
    for sids in session_batches(files_by_sid, sizes):
        batch = [(p, sid, fid_of[p]) for sid in sids for p in files_by_sid[sid]]
        batches.extend(batch_parts(batch, sizes))
    names = ", ".join(f"r.{name}" for name in RECORD_COLUMNS)
    for batch in batches:
        if not batch:
            continue
        folders: list[str] = []  # the batch's range copies: in memory when small, on disk if that fails
        sent = batch
        try:
            if ranges and any(p in ranges for p, _, _ in batch):
                ranged = sum(ranges[p][1] - ranges[p][0] for p, _, _ in batch if p in ranges)
                folders.append(tempfile.mkdtemp(prefix="goodtrace-range-", dir=_copies_dir(ranged)))
                copy_of = functools.partial(_copy_of, ranges, folders, threading.Lock())
                sent = []
                for (p, sid, fid), copy in zip(batch, io_map(copy_of, batch, batch[0][0]), strict=True):  # many files at once
                    if isinstance(copy, OSError):
                        if ranges[p][0] > 0 and os.path.exists(p):  # its first part is read already
                            import duckdb

                            raise duckdb.IOException(f"cannot copy the new part of {where_of(p)}: {copy}") from None
                        # gone since it was listed (DuckDB says so, as for any file), or read whole
                        skips.unranged.add(p)
                    elif copy is not None:
                        skips.ranged[copy] = p, ranges[p][0]
                        p = copy
                    sent.append((p, sid, fid))
            _fold_batch(con, batch, sent, files_by_sid, names, skips)
        finally:
            for copy in [copy for copy in skips.ranged if os.path.dirname(copy) in folders]:
                shortened = skips.substitutes.pop(copy, None)  # its count is the file's
                if shortened is not None:
                    skips.long_ranges.add(skips.ranged[copy][0])
                    shutil.rmtree(os.path.dirname(shortened), ignore_errors=True)
                del skips.ranged[copy]
            for folder in folders:
                shutil.rmtree(folder, ignore_errors=True)
        done += len(batch)
        if progress is not None:
            progress("reading rank files", done, total)
    return done


def file_parts(sizes: Sequence[int]) -> list[range]:
    """Consecutive files (their sizes) in the parts one table of parsed lines holds: the rule of
    :func:`session_batches` on files, not sessions. Parsed whole, one session of 10 M steps
    (7 GB of lines) was a table whose span starts DuckDB could not group within its memory.
    What the fold keeps of a file depends on no other file of its session (the pool splits a
    long session between its tasks the same way), so the tables are the same whatever the parts."""
    return _groups([(1, size) for size in sizes])


def batch_parts(batch: list[tuple[str, int, int]], sizes: Mapping[str, int]) -> list[list[tuple[str, int, int]]]:
    """A batch of (path, session, file number) in the parts :func:`file_parts` gives (``sizes``:
    each path's bytes): itself but where it is one long session."""
    return [batch[part.start:part.stop] for part in file_parts([sizes.get(p, 0) for p, _, _ in batch])]


def _fold_batch(
    con: Any, batch: list[tuple[str, int, int]], sent: list[tuple[str, int, int]], files_by_sid: dict[int, list[str]],
    names: str, skips: FileSkips,
) -> None:
    """One batch of :func:`fold_json` (``sent``: the batch's rows with range copies in place
    of their files)."""
    read = read_batch(
        con, sent,
        f"CREATE OR REPLACE TEMP TABLE batch AS SELECT f.sid, f.fid, {names}, "
        f"CASE WHEN r.kind = '{schema.EVENT}' THEN r.attrs END AS attrs FROM {{source}}", skips,
    )
    for (path, sid, _), (was, _, _), (copy, _, _) in zip(batch, sent, read, strict=True):
        if copy != was and was == path:  # a range copy's shortened copy is not the file's
            files_by_sid[sid][files_by_sid[sid].index(path)] = copy
    # The lines that are no valid record (a few), checked once the batch is a table (the
    # check inside the JSON scan slowed the scan), counted, then deleted from the batch.
    con.execute(f"CREATE OR REPLACE TEMP TABLE batch_bad AS SELECT * FROM (SELECT rowid AS row, fid, {INVALID} "
                "AS bad FROM batch) WHERE bad IS NOT NULL")
    count_skips(con, "batch_bad", [(p, f) for p, _, f in read], skips)
    con.execute("DELETE FROM batch WHERE rowid IN (SELECT row FROM batch_bad)")
    extract_segments(con, "batch")
    con.execute("DROP TABLE batch_bad")
    con.execute("DROP TABLE batch")
