"""One chunk of the segment cache on disk (:mod:`goodtrace.read.segment_cache` keeps a folder of
them): the identity of each file it holds (``FileIdentity``; a prefix of a growing file by
its digest, :func:`prefix_digest`), its Parquet tables written to temporary names and renamed
(:func:`write_chunk`), and its index ``<chunk>.json``, written last (:func:`write_index`) and
read back only when whole and of this layout (:func:`read_index`)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from goodtrace.read import duckdb_sql
from goodtrace.read.io_pool import on_network_filesystem, stat_or_none
from goodtrace.record.process import pid_alive

__all__ = [
    "CACHE_FORMAT",
    "CHUNK_NAME",
    "DIGEST_HEAD",
    "DIGEST_TAIL",
    "INDEX_SUFFIX",
    "FileIdentity",
    "identity_from",
    "identity_of",
    "index_ok",
    "leftover_gone",
    "prefix_digest",
    "prefix_of",
    "read_index",
    "write_chunk",
    "write_index",
]

CACHE_FORMAT = 1  # the index's layout; the tables' is duckdb_sql.RUN_MODEL_VERSION
INDEX_SUFFIX = ".json"
# A chunk's name (its files start with it): the writer's pid, then its host's tag (HOST_TAG) and a
# random part
CHUNK_NAME = re.compile(r"(?:model-)?(c([0-9]+)-([0-9a-f]{4})[0-9a-f]{8})")
HOST_TAG = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:4]
# What a killed writer left of another host (or of an older goodtrace, whose names had no tag):
# removed once it is this old, its process unknowable from here
LEFTOVER_AGE_S = 86_400.0
DIGEST_HEAD = 4096
DIGEST_TAIL = 65536
STARTS_ROW_GROUP = 8_192  # rows of a chunk's span starts in a Parquet row group (a few steps' worth)


def leftover_gone(folder: str, name: str) -> bool:
    """Whether the file ``name`` in ``folder``, of a chunk with no index (:data:`CHUNK_NAME`), was
    left by a writer that is gone: of this host (its tag) and its process ended, or not touched
    for :data:`LEFTOVER_AGE_S` (another host's, whose process cannot be asked: two hosts that
    share the cache never remove each other's work in progress)."""
    found = CHUNK_NAME.match(name)
    if found is None:
        return False
    if found.group(3) == HOST_TAG and not pid_alive(int(found.group(2))):
        return True
    try:
        return time.time() - os.stat(os.path.join(folder, name)).st_mtime > LEFTOVER_AGE_S
    except OSError:
        return False


def prefix_digest(path: str, size: int) -> str | None:
    """A digest of the first ``size`` bytes of a file, as a prefix entry keeps it: of its first
    4 KiB and of the 64 KiB before ``size`` (None when the file is shorter or unreadable). With
    the path, inode and main thread, it tells that a growing file still begins with the bytes
    a prefix entry reduced."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(min(size, DIGEST_HEAD))
            start = max(0, size - DIGEST_TAIL)
            handle.seek(start)
            tail = handle.read(size - start)
    except OSError:
        return None
    if len(tail) != size - start:
        return None
    return hashlib.sha256(b"%d:" % size + head + tail).hexdigest()[:32]


def prefix_of(entry: Mapping[str, Any]) -> int | None:
    """The bytes a prefix entry covers (None for an entry of a whole file)."""
    n = entry.get("prefix")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 and isinstance(entry.get("digest"), str) \
        else None


@dataclasses.dataclass(frozen=True)
class FileIdentity:
    """What a file's cached rows are valid for: its path in the run, size, modification time
    (ns), inode (None where the filesystem has none, or for a file read from the compacted
    copy) and the main thread its session's header names."""

    path: str
    size: int
    mtime_ns: int
    inode: int | None
    main_tid: int | None

    def matches(self, entry: Mapping[str, Any]) -> bool:
        inode = entry.get("inode")
        return (entry.get("path") == self.path and entry.get("size") == self.size
                and entry.get("mtime_ns") == self.mtime_ns and entry.get("main_tid") == self.main_tid
                and (inode is None or self.inode is None or inode == self.inode))

    def entry(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "mtime_ns": self.mtime_ns, "inode": self.inode,
                "main_tid": self.main_tid}


def identity_of(root: str, path: str, main_tid: int | None) -> FileIdentity | None:
    info = stat_or_none(path)
    return identity_from(root, path, info, main_tid) if info is not None else None


def identity_from(root: str, path: str, info: os.stat_result, main_tid: int | None) -> FileIdentity:
    """The identity of ``path`` as ``info`` (its stat) says."""
    return FileIdentity(os.path.relpath(path, root).replace(os.sep, "/"), info.st_size, info.st_mtime_ns,
                        info.st_ino or None, main_tid)


def write_chunk(
    con: Any, folder: str, kind: str, tables: Iterable[str], files: Mapping[int, FileIdentity],
    skipped: Mapping[int, dict[str, int]], *, prefix: str = "", index_file: bool = True,
    prefixes: Mapping[int, tuple[int, str]] | None = None,
) -> dict[str, Any]:
    """Write the rows of ``files`` in ``con``'s ``tables`` as a chunk in ``folder`` (files
    ``<prefix><chunk>-<table>.parquet``, each renamed into place once written; then, with
    ``index_file``, the index ``<chunk>.json``: without it the caller keeps the index, as
    ``goodtrace compact`` does in its manifest); returns the index. Raises OSError or
    DuckDB's error, having removed what it wrote."""
    chunk = f"c{os.getpid()}-{HOST_TAG}{uuid.uuid4().hex[:8]}"
    fids = ", ".join(str(fid) for fid in sorted(files))
    names: dict[str, str] = {}
    written: list[str] = []
    # On a network filesystem DuckDB's many small writes and stats of a Parquet file are a
    # round trip each: the tables are written in a local folder, then copied over whole.
    local = tempfile.mkdtemp(prefix="goodtrace-chunk-") if on_network_filesystem(folder) else None
    try:
        for table in tables:
            name = f"{prefix}{chunk}-{table}.parquet"
            target = os.path.join(folder, name)
            written.append(target + ".partial")
            first = os.path.join(local, name) if local is not None else target + ".partial"
            # the span starts in small row groups, in order of step: a report reads only its
            # sample's steps of them (duckdb_sql.sampled_starts; DuckDB skips a row group by its
            # steps' range, which the fold's and a merge's parallel inserts leave interleaved)
            starts = table == "seg_starts"
            groups = f", ROW_GROUP_SIZE {STARTS_ROW_GROUP}" if starts else ""
            order = " ORDER BY fid, step" if starts else ""
            con.execute(f"COPY (SELECT * EXCLUDE (sid) FROM {table} WHERE fid IN ({fids}){order}) TO "
                        f"{duckdb_sql.sql_str(first)} (FORMAT parquet, COMPRESSION zstd{groups})")
            if local is not None:
                shutil.copyfile(first, target + ".partial")
                os.remove(first)
            os.replace(target + ".partial", target)
            written[-1] = target
            names[table] = name
        entries = [dict(ident.entry(), number=fid, skipped=dict(skipped.get(fid, {})))
                   for fid, ident in sorted(files.items())]
        for entry in entries:
            if prefixes and entry["number"] in prefixes:
                entry["prefix"], entry["digest"] = prefixes[entry["number"]]
        index = {"format": CACHE_FORMAT, "version": duckdb_sql.RUN_MODEL_VERSION, "chunk": chunk, "kind": kind,
                 "tables": names, "files": entries}
        if index_file:
            write_index(os.path.join(folder, chunk + INDEX_SUFFIX), index)
    except BaseException:
        for path in written:
            with contextlib.suppress(OSError):
                os.remove(path)
        raise
    finally:
        if local is not None:
            shutil.rmtree(local, ignore_errors=True)
    return index


def read_index(path: str) -> dict[str, Any] | None:
    """A chunk's index, None when it is unreadable, torn or of another layout."""
    try:
        with open(path, encoding="utf-8") as handle:
            index = json.load(handle)
    except (OSError, ValueError):
        return None
    return index if index_ok(index) else None


def index_ok(index: object) -> bool:
    """Whether ``index`` is a chunk's index of this layout."""
    if not isinstance(index, dict) or index.get("format") != CACHE_FORMAT or not isinstance(index.get("files"), list) \
            or not isinstance(index.get("chunk"), str):
        return False
    return all(isinstance(entry, dict) and isinstance(entry.get("number"), int) and isinstance(entry.get("path"), str)
               for entry in index["files"])


def write_index(path: str, index: dict[str, Any]) -> None:
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump(index, handle)
    os.replace(partial, path)
