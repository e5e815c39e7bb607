"""The reduction of every closed segment file, kept in the reader's cache: re-reading a growing run
parses only the bytes written since.

A *chunk* is what one report (or ``goodtrace compact``) stored: one Parquet file per table of
the fold's map (``duckdb_sql.SEGMENT_NAMES``, kind ``model``) or of the reference rank's
detail (``detail.DETAIL_NAMES``, kind ``detail``), each row under its file's number in
the chunk, and an index ``<chunk>.json`` naming each file by its identity: path in the run,
size, mtime_ns, inode (where the filesystem has one) and the main thread its session's header
names, with the lines the fold skipped in it. A file's rows are used only while all of that is
unchanged; anything else (another format, a torn or unreadable chunk, a file rewritten with
the same size) is ignored, and the file read again.

A file still being written (the last segment of a session that has not finished) is kept as a
*prefix* (kinds ``model-open`` and ``detail-open``): the reduction of its first ``prefix``
bytes (whole lines), valid while the file has the same path, inode and main thread, is at
least that long, and those bytes still have the same digest (:func:`prefix_digest`: the
first 4 KiB and the 64 KiB before the cut); the next report reads only the bytes after it. Parquet files are written first and the
index last, each as a temporary file renamed into place, so a killed writer leaves at most
files no index names, removed by the next writer once their process is gone.

One chunk on disk (its tables, its index, the identities and digests above) is
:mod:`goodtrace.read.chunk_files`; this module keeps a folder of them (finding, loading,
merging, pruning).

Where: ``$GOODTRACE_CACHE_DIR/segments/<hash of the run's key>/`` (default
``~/.cache/goodtrace/runs/segments/...``; the key is the run's real path, or the URL of a run
mirrored from object storage: :func:`goodtrace.read.environment.run_cache_dir`), never the run
directory: a report writes nothing beside the run it reads. ``GOODTRACE_SEGMENT_CACHE=0`` turns
it off. Two reports at once (on one host or on two sharing the cache) never remove each other's
work: every file is written under a name of its own and renamed into place, and what a killed
writer left is removed only once its process is known gone (:func:`chunk_files.leftover_gone`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from goodtrace.read import duckdb_sql
from goodtrace.read.chunk_files import (
    CHUNK_NAME,
    INDEX_SUFFIX,
    FileIdentity,
    index_ok,
    leftover_gone,
    prefix_digest,
    prefix_of,
    read_index,
    write_chunk,
)
from goodtrace.read.environment import run_cache_dir
from goodtrace.read.io_pool import io_map
from goodtrace.record.errors import warn

__all__ = ["CACHE_DIR", "ENV_SEGMENT_CACHE", "RANKS_DIR", "Hit", "SegmentCache", "open_cache", "rank_chunks"]

CACHE_DIR = "cache"  # RUN/compact/cache/
RANKS_DIR = "ranks"  # RUN/compact/cache/ranks/<rank dir>/<session>/: a rank's own compactor's (read.rank_compact)
ENV_SEGMENT_CACHE = "GOODTRACE_SEGMENT_CACHE"
# How chunks of a kind are merged (:meth:`SegmentCache.merging`): a chunk's *level* is how many
# whole factors of MAX_CHUNKS its size is above MERGE_FLOOR (level 0 below MAX_CHUNKS x
# MERGE_FLOOR); once a level holds MAX_CHUNKS chunks, the next chunk stored holds their files
# too and replaces them. Each report of a growing run adds a chunk; a file's rows are rewritten
# once per level, not once per MAX_CHUNKS reports (which made the cost of a long run's
# re-reports grow with its square), and a folder holds at most MAX_CHUNKS - 1 chunks per level
# (one query per table reads them all).
MAX_CHUNKS = 8
MERGE_FLOOR = 1 << 20
# The kinds of the prefixes of open files (see the module's docstring)
OPEN_KINDS = {"model": "model-open", "detail": "detail-open"}


@dataclasses.dataclass(frozen=True)
class Hit:
    """A file found in a chunk: the chunk, its number there, and the lines the fold skipped
    in it (by reason)."""

    chunk: str
    number: int
    skipped: dict[str, int]
    prefix: int | None = None  # a prefix entry: the bytes of the file it covers


def _writable_dir(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK | os.X_OK)


def open_cache(root: str, extra: Sequence[tuple[str, dict[str, Any]]] = ()) -> SegmentCache:
    """The cache of the run at ``root``; ``extra``: chunks kept elsewhere (``goodtrace
    compact``'s: its folder and index), read however the cache is set. Turned off
    (``GOODTRACE_SEGMENT_CACHE=0``) or with no writable folder, it holds only those. In the
    reader's cache (:func:`~goodtrace.read.environment.run_cache_dir`), never in the run."""
    if os.environ.get(ENV_SEGMENT_CACHE, "").strip().lower() in ("0", "off", "false", "no"):
        return SegmentCache(None, extra)
    folder = run_cache_dir(root, "segments")
    return SegmentCache(folder if _writable_dir(folder) else None, extra)


def rank_chunks(root: str) -> list[tuple[str, dict[str, Any]]]:
    """The chunks the ranks' own compactors kept (:mod:`goodtrace.read.rank_compact`), each with
    its folder: read beside the report's own, never written or removed by a report."""
    from goodtrace.read.compact import COMPACT_DIR

    base = os.path.join(root, COMPACT_DIR, CACHE_DIR, RANKS_DIR)
    found: list[tuple[str, dict[str, Any]]] = []
    try:
        rank_dirs = sorted(os.listdir(base))
    except OSError:
        return found
    for rank_dir in rank_dirs:
        try:
            sessions = sorted(os.listdir(os.path.join(base, rank_dir)))
        except OSError:
            continue
        for session in sessions:
            folder = os.path.join(base, rank_dir, session)
            try:
                names = sorted(os.listdir(folder))
            except OSError:
                continue
            for name in names:
                if name.endswith(INDEX_SUFFIX):
                    index = read_index(os.path.join(folder, name))
                    if index is not None and index.get("chunk") == name[: -len(INDEX_SUFFIX)]:
                        found.append((folder, index))
    return found


class SegmentCache:
    """The chunks in one folder (see the module's docstring)."""

    def __init__(self, folder: str | None, extra: Sequence[tuple[str, dict[str, Any]]] = ()) -> None:
        self.folder = folder
        self._warned = False
        # chunk name -> (its folder, its index); ``extra``: chunks kept elsewhere (compact's)
        self._chunks: dict[str, tuple[str, dict[str, Any]]] = {}
        for folder_of, index in extra:
            if (index_ok(index) and index.get("version") == duckdb_sql.RUN_MODEL_VERSION
                    and self._complete(folder_of, index)):
                self._chunks[str(index["chunk"])] = (folder_of, index)
        self._read_indexes()
        # the chunks listed from an index file (not from compact's manifest): one whose file is
        # gone by the time it is read was replaced by its writer, not damaged
        self._indexed = {chunk for chunk, (folder_of, _) in self._chunks.items()
                         if os.path.exists(os.path.join(folder_of, chunk + INDEX_SUFFIX))}

    # ------------------------------------------------------------------ reading
    def _warn(self, what: str, folder: str | None = None) -> None:
        if not self._warned:
            warn(f"the segment cache in {folder or self.folder} {what}; ignored (the files are read again and it "
                 "is rebuilt)")
            self._warned = True

    def _read_indexes(self) -> None:
        if self.folder is None:
            return
        try:
            names = sorted(os.listdir(self.folder))
        except OSError:
            return
        for name in names:
            if not name.endswith(INDEX_SUFFIX):
                continue
            chunk = name[: -len(INDEX_SUFFIX)]
            index = read_index(os.path.join(self.folder, name))
            if index is None or index.get("chunk") != chunk or not self._complete(self.folder, index):
                if not os.path.exists(os.path.join(self.folder, name)):
                    continue  # removed since it was listed (merged away by another report): not damaged
                self._warn(f"has an unreadable or torn chunk ({name})")
                self._remove(chunk, index)
                continue
            if index.get("version") != duckdb_sql.RUN_MODEL_VERSION:
                self._remove(chunk, index)  # another goodtrace's reduction: rebuilt, quietly
                continue
            self._chunks[chunk] = (self.folder, index)

    @staticmethod
    def _complete(folder: str, index: dict[str, Any]) -> bool:
        tables = index.get("tables")
        return isinstance(tables, dict) and all(
            isinstance(name, str) and "/" not in name and os.sep not in name
            and os.path.isfile(os.path.join(folder, name)) for name in tables.values())

    def _remove(self, chunk: str, index: dict[str, Any] | None) -> None:
        self._chunks.pop(chunk, None)
        if self.folder is None:
            return
        with contextlib.suppress(OSError):
            os.remove(os.path.join(self.folder, chunk + INDEX_SUFFIX))
        for name in os.listdir(self.folder) if os.path.isdir(self.folder) else ():
            if name.startswith(chunk + "-"):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(self.folder, name))

    def find(self, kind: str, wanted: Mapping[int, FileIdentity]) -> dict[int, Hit]:
        """The files of ``wanted`` (this load's file number -> identity) that a chunk of ``kind``
        holds as they are now."""
        by_path: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        for chunk, (_, index) in self._chunks.items():
            if index.get("kind") != kind:
                continue
            for entry in index["files"]:
                by_path.setdefault(entry.get("path"), []).append((chunk, entry))
        hits: dict[int, Hit] = {}
        for fid, ident in wanted.items():
            for chunk, entry in by_path.get(ident.path, ()):
                if ident.matches(entry):
                    hits[fid] = Hit(chunk, int(entry["number"]), dict(entry.get("skipped") or {}))
                    break
        return hits

    def find_prefixes(self, kind: str, wanted: Mapping[int, tuple[str, FileIdentity]]) -> dict[int, Hit]:
        """The files of ``wanted`` (file number -> its path here and its identity now) whose first
        bytes a chunk of ``kind`` (an open kind) holds: the longest such prefix of each, its
        length in ``Hit.prefix``."""
        by_path: dict[str, list[tuple[int, str, dict[str, Any]]]] = {}
        for chunk, (_, index) in self._chunks.items():
            if index.get("kind") != kind:
                continue
            for entry in index["files"]:
                n = prefix_of(entry)
                if n is not None:
                    by_path.setdefault(entry.get("path"), []).append((n, chunk, entry))
        def longest(item: tuple[int, tuple[str, FileIdentity]]) -> Hit | None:
            path, ident = item[1]
            for n, chunk, entry in sorted(by_path.get(ident.path, ()), key=lambda found: -found[0]):
                if ident.inode is None or entry.get("inode") != ident.inode or entry.get("main_tid") != ident.main_tid \
                        or n > ident.size or prefix_digest(path, n) != entry["digest"]:
                    continue
                return Hit(chunk, int(entry["number"]), dict(entry.get("skipped") or {}), prefix=n)
            return None

        # each check reads two parts of its file: many files at once (a network filesystem)
        found = io_map(longest, list(wanted.items()), next((path for path, _ in wanted.values()), ""))
        return {fid: hit for fid, hit in zip(wanted, found, strict=True) if hit is not None}

    def load(
        self, con: Any, kind: str, hits: Mapping[int, Hit], sid_of: Mapping[int, int], *,
        tables: Callable[[str], bool] = lambda _: True, filters: Mapping[str, str] | None = None,
    ) -> set[int]:
        """The hits' rows into ``con``'s tables of ``kind`` (under this load's session and file
        numbers; only the ``tables`` it accepts; ``filters``: SQL joined after a table's rows
        ``p`` and their map ``m`` (sid, fid), to keep only some); returns the files whose
        chunk could not be read (their rows in the tables loaded here are left out: read them
        again)."""
        import duckdb

        by_chunk: dict[str, list[tuple[int, int, int]]] = {}
        for fid, hit in hits.items():
            by_chunk.setdefault(hit.chunk, []).append((hit.number, sid_of[fid], fid))
        if len(by_chunk) > 1:
            # one query per table over every chunk's file (thousands of ranks' compactors keep
            # chunks of their own); a chunk that cannot be read makes it fail whole, undone,
            # and the chunks are read one by one below to find it
            try:
                self._load_together(con, by_chunk, tables, filters or {})
                return set()
            except (duckdb.Error, KeyError):
                pass
        failed: set[int] = set()
        con.execute("CREATE OR REPLACE TEMP TABLE cachemap (number INTEGER, sid INTEGER, fid INTEGER)")
        for chunk, rows in sorted(by_chunk.items()):
            folder, index = self._chunks[chunk]
            con.execute("DELETE FROM cachemap")
            duckdb_sql.insert_rows(con, "cachemap", rows)
            done: list[str] = []
            try:
                for table, name in index["tables"].items():
                    if not tables(table):
                        continue
                    path = duckdb_sql.sql_str(os.path.join(folder, name))
                    con.execute(f"INSERT INTO {table} SELECT m.sid, m.fid, p.* EXCLUDE (fid) FROM read_parquet({path}) p "
                                f"JOIN cachemap m ON p.fid = m.number {(filters or {}).get(table, '')}")
                    done.append(table)
            except (duckdb.Error, KeyError) as exc:
                fids = ", ".join(str(fid) for _, _, fid in rows)
                for table in done:
                    con.execute(f"DELETE FROM {table} WHERE fid IN ({fids})")
                failed.update(fid for _, _, fid in rows)
                if chunk in self._indexed and not os.path.exists(os.path.join(folder, chunk + INDEX_SUFFIX)):
                    continue  # its writer (a rank's compactor, another report) merged it away since: read again, quietly
                self._warn(f"has a chunk that cannot be read ({chunk}: {str(exc).splitlines()[0]})", folder)
                if folder == self.folder:
                    self._remove(chunk, index)
        con.execute("DROP TABLE cachemap")
        return failed

    def _load_together(
        self, con: Any, by_chunk: Mapping[str, list[tuple[int, int, int]]], tables: Callable[[str], bool],
        filters: Mapping[str, str],
    ) -> None:
        """:meth:`load` of several chunks, a query per table (in one transaction: all or nothing)."""
        chunks = sorted(by_chunk)
        names = [table for table in self._chunks[chunks[0]][1]["tables"] if tables(table)]
        con.execute("CREATE OR REPLACE TEMP TABLE cachemap (path VARCHAR, number INTEGER, sid INTEGER, fid INTEGER)")
        con.execute("BEGIN TRANSACTION")
        try:
            for table in names:
                paths = []
                rows: list[tuple[str, int, int, int]] = []
                for chunk in chunks:
                    folder, index = self._chunks[chunk]
                    path = os.path.join(folder, index["tables"][table])
                    paths.append(path)
                    rows.extend((path, number, sid, fid) for number, sid, fid in by_chunk[chunk])
                con.execute("DELETE FROM cachemap")
                duckdb_sql.insert_rows(con, "cachemap", rows)
                listed = ", ".join(duckdb_sql.sql_str(path) for path in paths)
                con.execute(f"INSERT INTO {table} SELECT m.sid, m.fid, p.* EXCLUDE (fid, filename) "
                            f"FROM read_parquet([{listed}], filename=true) p "
                            f"JOIN cachemap m ON p.filename = m.path AND p.fid = m.number {filters.get(table, '')}")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        finally:
            con.execute("DROP TABLE IF EXISTS cachemap")

    # ------------------------------------------------------------------ writing
    def merging(self, kind: str) -> frozenset[str]:
        """The chunks of ``kind`` in this folder that the next chunk of ``kind`` stored should hold
        (their files' rows too) and replace: those of the lowest level that holds
        :data:`MAX_CHUNKS` of them (see :data:`MERGE_FLOOR`), or none. Of an open kind, every
        chunk once there are :data:`MAX_CHUNKS` (their size is bounded by the open files')."""
        if self.folder is None:
            return frozenset()
        own = [(chunk, index) for chunk, (folder, index) in self._chunks.items()
               if folder == self.folder and index.get("kind") == kind]
        if len(own) < MAX_CHUNKS:
            return frozenset()
        if kind in OPEN_KINDS.values():
            return frozenset(chunk for chunk, _ in own)
        levels: dict[int, list[str]] = {}
        for chunk, index in own:
            levels.setdefault(_level(self._bytes(index)), []).append(chunk)
        for level in sorted(levels):
            if len(levels[level]) >= MAX_CHUNKS:
                return frozenset(levels[level])
        return frozenset()

    def _bytes(self, index: dict[str, Any]) -> int:
        """The size of a chunk of this folder: its tables' files."""
        assert self.folder is not None
        total = 0
        for name in index["tables"].values():
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(self.folder, name))
        return total

    def store(
        self, con: Any, kind: str, tables: Iterable[str], files: Mapping[int, FileIdentity],
        skipped: Mapping[int, dict[str, int]], *, replace: Iterable[str] = (),
        prefixes: Mapping[int, tuple[int, str]] | None = None,
    ) -> dict[str, Any] | None:
        """A new chunk of the rows of ``files`` (this load's file number -> identity) in
        ``con``'s ``tables``; returns its index, None when it could not be written (the cache
        is then left as it was). ``replace``: chunks of this folder that go once it is written
        (the new one holds their files: :meth:`merging`). ``prefixes``: of a file kept as a
        prefix, the bytes its rows cover and their :func:`prefix_digest`."""
        import duckdb

        if not files or self.folder is None:
            return None
        try:
            self._remove_leftovers()
            index = write_chunk(con, self.folder, kind, tables, files, skipped, prefixes=prefixes)
        except (OSError, duckdb.Error) as exc:
            self._warn(f"cannot be written ({exc})")
            return None
        for chunk in replace:
            if chunk in self._chunks and self._chunks[chunk][0] == self.folder:
                self._remove(chunk, self._chunks[chunk][1])
        self._chunks[index["chunk"]] = (self.folder, index)
        return index

    def prune(self, current: Mapping[str, FileIdentity]) -> None:
        """Remove the chunks of this folder none of whose files is still as it was (``current``:
        every segment of the run now, by path in the run): a prefix entry lives while it is
        its file's longest, the file has not been kept whole since, and could still begin
        with those bytes (same inode, at least as long)."""
        whole: set[tuple[str, str]] = set()  # (the kind of the file's prefixes, its path)
        longest: dict[tuple[str, str], int] = {}
        for _, index in self._chunks.values():
            kind = str(index.get("kind"))
            for entry in index["files"]:
                n = prefix_of(entry)
                path = entry.get("path")
                if n is not None:
                    longest[kind, path] = max(longest.get((kind, path), 0), n)
                elif path in current and current[path].matches(entry):
                    whole.add((OPEN_KINDS.get(kind, ""), path))

        def alive(kind: str, entry: dict[str, Any]) -> bool:
            ident = current.get(entry["path"])
            if ident is None:
                return False
            n = prefix_of(entry)
            if n is None:
                return ident.matches(entry)
            return (n == longest.get((kind, entry["path"])) and (kind, entry["path"]) not in whole
                    and ident.size >= n and ident.inode is not None and entry.get("inode") == ident.inode)

        for chunk, (folder, index) in list(self._chunks.items()):
            if folder == self.folder and not any(alive(str(index.get("kind")), entry) for entry in index["files"]):
                self._remove(chunk, index)

    def clear(self, kind: str) -> None:
        """Every chunk of ``kind`` in this folder (``goodtrace compact`` stores the run's
        reduction itself)."""
        for chunk, (folder, index) in list(self._chunks.items()):
            if folder == self.folder and index.get("kind") == kind:
                self._remove(chunk, index)

    def _remove_leftovers(self) -> None:
        """Files of chunks whose index was never written, by a process that is gone."""
        assert self.folder is not None
        for name in os.listdir(self.folder):
            found = CHUNK_NAME.match(name)
            if found is None or found.group(1) in self._chunks or not leftover_gone(self.folder, name):
                continue
            if name.endswith(".partial") or not os.path.exists(os.path.join(self.folder, found.group(1) + INDEX_SUFFIX)):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(self.folder, name))


def _level(size: int) -> int:
    """A chunk's level by its size (:data:`MERGE_FLOOR`)."""
    level, bound = 0, MERGE_FLOOR * MAX_CHUNKS
    while size >= bound:
        level, bound = level + 1, bound * MAX_CHUNKS
    return level
