"""What the segment cache keeps of a load (:mod:`goodtrace.read.segment_cache` stores it):
which files are closed and kept whole, which are still being written and how much of each is
kept as a prefix (whole lines, a partial last line counted as torn), and each file's identity;
which sessions' columns kept beside the chunks a load uses, and which it keeps anew.
:mod:`goodtrace.read.load` decides with these what to read and what to keep."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from goodtrace import schema
from goodtrace.read import duckdb_sql
from goodtrace.read.chunk_files import FileIdentity, identity_from, identity_of, prefix_digest
from goodtrace.read.compact import COMPACT_DIR
from goodtrace.read.detail_columns import DetailColumns, load_kept
from goodtrace.read.discovery import last_newline
from goodtrace.read.file_skips import FileSkips
from goodtrace.read.io_pool import io_map, stat_or_none
from goodtrace.read.segment_cache import Hit, SegmentCache, open_cache, rank_chunks
from goodtrace.read.session_columns import KeptColumns, find_kept
from goodtrace.read.validate import MAX_LINE_BYTES

__all__ = ["KEEP_MIN_STEPS", "LONG_TABLES", "PREFIX_STEP_BYTES", "KeptDetail", "closed_files", "closing_columns",
           "file_identities", "kept_columns", "kept_detail", "last_segments", "open_run_cache", "prefix_ends",
           "store_closed", "store_prefixes"]

# A file still being written is kept in the cache again (as a longer prefix) once this many
# bytes, or a quarter of the prefix kept, were read after the prefix: a re-report reads at most
# that much twice, and writes the file's reduction again that seldom.
PREFIX_STEP_BYTES = 1 << 20


def file_identities(
    root: str, drafts: dict[str, Any], main_tids: dict[int, int | None], parquet_ok: dict[str, dict[str, Any]],
    known: Mapping[str, os.stat_result] | None = None,
) -> dict[str, FileIdentity]:
    """Each file's identity for the segment cache: as it is on disk (``known``: the stats the
    listing took, the others taken here), or (its JSON gone, read from the compacted copy) as
    the compaction's manifest recorded it."""
    known = known or {}
    wanted = [p for draft in drafts.values() for p in draft.files if p not in known]
    stats = dict(known) | {p: info for p, info in zip(wanted, io_map(stat_or_none, wanted, root), strict=True) if info is not None}
    out: dict[str, FileIdentity] = {}
    for sid, draft in enumerate(drafts.values()):
        for p in draft.files:
            info = stats.get(p)
            ident = identity_from(root, p, info, main_tids.get(sid)) if info is not None else None
            entry = parquet_ok.get(p)
            if ident is None and entry is not None and isinstance(entry.get("size"), int) \
                    and isinstance(entry.get("mtime_ns"), int):
                ident = FileIdentity(os.path.relpath(p, root).replace(os.sep, "/"), entry["size"], entry["mtime_ns"],
                                     None, main_tids.get(sid))
            if ident is not None:
                out[p] = ident
    return out


def open_run_cache(root: str, manifest: dict[str, Any] | None, use_cache: bool) -> SegmentCache | None:
    """The run's segment cache, with the reduction a compaction stored (one more chunk)."""
    if not use_cache:
        return None
    stored = manifest.get("model") if manifest is not None else None
    extra = [(os.path.join(root, COMPACT_DIR), stored)] if isinstance(stored, dict) else []
    return open_cache(root, extra + rank_chunks(root))


def _segment_number(header: object) -> int:
    value = header.get(schema.H_SEGMENT) if isinstance(header, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def closed_files(con: Any, drafts: dict[str, Any], files: list[tuple[str, object]]) -> set[str]:
    """The files no writer will append to: every file of a finished session, and every file
    of a session but its last segment (the writer rotated away from it)."""
    finished = {int(row[0]) for row in con.execute("SELECT DISTINCT sid FROM seg_summ WHERE has_finish > 0").fetchall()}
    number = {p: _segment_number(header) for p, header in files}
    closed: set[str] = set()
    for sid, draft in enumerate(drafts.values()):
        last = max(number.get(p, 0) for p in draft.files)
        closed.update(p for p in draft.files if sid in finished or number.get(p, 0) < last)
    return closed


def last_segments(drafts: dict[str, Any], files: list[tuple[str, object]]) -> list[str]:
    """Each session's last segment: the file a writer may still be appending to."""
    number = {p: _segment_number(header) for p, header in files}
    return [max(draft.files, key=lambda p: number.get(p, 0)) for draft in drafts.values()]


def _whole_lines(path: str, end: int) -> int | None:
    """Where the last whole line of a file's first ``end`` bytes ends (None: none found within
    two record lengths, or the file cannot be read)."""
    try:
        with open(path, "rb") as handle:
            start = last_newline(handle, end, 2 * MAX_LINE_BYTES)
    except OSError:
        return None
    return start or None  # 0: no newline at all


def prefix_ends(ranges: dict[str, tuple[int, int]], skips: FileSkips) -> dict[str, tuple[int, dict[str, int]]]:
    """Of the files read up to a point (``ranges``), how much the cache may keep as a prefix and
    the lines skipped in it: up to the last whole line read, when a partial line after it
    (a write in progress) was counted as torn, not read as a record. A file with a line too
    long to read is not kept (as a closed one is not)."""
    out: dict[str, tuple[int, dict[str, int]]] = {}
    # read whole (to wherever it ended then), or with lines too long to read: not kept, as a
    # closed file is not
    kept = [(path, end) for path, (_, end) in ranges.items()
            if path not in skips.unranged and path not in skips.long_ranges and "too_long" not in skips.by_file.get(path, {})]
    # each file's last line found by reading back from the end: many files at once
    for (path, end), n in zip(kept, io_map(lambda found: _whole_lines(*found) if found[1] > 0 else None, kept,
                                                 next(iter(ranges), "")),
                              strict=True):
        counts = dict(skips.by_file.get(path, {}))
        if n is None:
            continue
        if n < end:
            if counts.get("torn_last_line", 0) < 1:
                continue  # the partial line read as a record: the next report could not start after it
            counts["torn_last_line"] -= 1
            if not counts["torn_last_line"]:
                del counts["torn_last_line"]
        out[path] = (n, counts)
    return out


def store_prefixes(
    cache: SegmentCache, con: Any, kind: str, tables: Sequence[str], ends: dict[str, tuple[int, dict[str, int]]],
    hits: dict[int, Hit], closed: set[str], identities: dict[str, FileIdentity], fid_of: dict[str, int],
) -> None:
    """Keep the rows of the files still being written as prefixes (``ends``: how much of each,
    :func:`prefix_ends`), where enough was read after the prefix the cache held (``hits``).
    When the folder holds many chunks of ``kind`` (files that grew at different times), the
    new one holds every file of ``ends`` and replaces them."""
    replace = cache.merging(kind)
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


def store_closed(
    cache: SegmentCache, con: Any, root: str, kind: str, tables: Sequence[str], closed: dict[int, FileIdentity],
    hits: dict[int, Hit], skips: FileSkips, path_of: dict[int, str],
) -> None:
    """Keep the rows of the closed files just read (``closed``: every closed file, ``hits``: those
    read from the cache), unless a file changed while it was read or had lines too long to read
    (the views that read its records again need the copy). The files of the chunks it merges
    (:meth:`SegmentCache.merging`) are kept in the new one too, which replaces them."""
    replace = cache.merging(kind)
    files = {fid: ident for fid, ident in closed.items() if fid not in hits or hits[fid].chunk in replace}
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


LONG_TABLES = frozenset(("seg_steps", "seg_syncs", "seg_spans", "seg_compute"))  # the tables of session_columns.TABLES
KEEP_MIN_STEPS = 10_000  # a session's columns are kept once its closed files hold this many executions


def kept_columns(
    cache: SegmentCache, hits: dict[int, Hit], drafts: dict[str, Any], fid_of: dict[str, int],
    identities: dict[str, FileIdentity],
) -> KeptColumns | None:
    """The sessions whose long columns are kept of files the cache holds as they are now: those
    files' chunks are loaded without their long tables. Not where one of those chunks is
    about to be merged into a new one (it must hold every table of its files)."""
    if cache.folder is None:
        return None
    names = dict(enumerate(drafts))
    kept = KeptColumns(cache.folder, duckdb_sql.RUN_MODEL_VERSION, names)
    files_of = {sid: [(fid_of[p], identities[p]) for p in draft.files if p in identities]
                for sid, draft in enumerate(drafts.values())}
    merging = cache.merging("model")
    for sid, found in find_kept(cache.folder, kept.version, names, files_of).items():
        fids = found.fids.tolist()
        if all(fid in hits and hits[fid].chunk not in merging for fid in fids):
            kept.sessions[sid] = found
    return kept


def closing_columns(
    con: Any, kept: KeptColumns, root: str, drafts: dict[str, Any], sessions: Sequence[Any], fid_of: dict[str, int],
    identities: dict[str, FileIdentity], closed: set[str], skips: FileSkips,
) -> None:
    """The sessions whose closed files not yet kept join their kept columns in this load
    (``kept.closing``): of :data:`KEEP_MIN_STEPS` executions or more, numbered by the recorder,
    the files as they were listed (a file that changed while it was read is read again)."""
    # every execution numbered by the recorder: finish_model then keeps seg_steps as the view
    # m_steps reads (else it numbers them into a table and drops it, and nothing is kept)
    if not con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'seg_steps'").fetchone()[0]:
        return
    for sid, draft in enumerate(drafts.values()):
        if sessions[sid].step_count < KEEP_MIN_STEPS:
            continue
        mine = kept.sessions.get(sid)
        covered = set(mine.fids.tolist()) if mine is not None else set()
        closable = [p for p in draft.files if p in closed and p in identities
                    and p not in skips.substitutes and "too_long" not in skips.by_file.get(p, {})
                    and (fid_of[p] in covered or not os.path.exists(p)
                         or identity_of(root, p, identities[p].main_tid) == identities[p])]
        joining = [fid_of[p] for p in closable if fid_of[p] not in covered]
        if joining and covered <= {fid_of[p] for p in closable}:
            kept.closing[sid] = (joining, [identities[p] for p in closable])


@dataclasses.dataclass
class KeptDetail:
    """The reference sessions' detail kept as columns (:mod:`goodtrace.read.detail_columns`):
    per session, the columns kept of its closed files (``columns``; those files are not in the
    ``det_*`` tables), the files whose rows join them this time (``closing``, by ``fid``) and
    the files the new columns will be of (``files``)."""

    folder: str | None = None
    columns: dict[int, DetailColumns] = dataclasses.field(default_factory=dict)
    closing: dict[int, list[int]] = dataclasses.field(default_factory=dict)
    files: dict[int, list[FileIdentity]] = dataclasses.field(default_factory=dict)


def kept_detail(
    cache: SegmentCache | None, references: Sequence[int], drafts: Sequence[Any], names: Sequence[str],
    identities: dict[str, FileIdentity], closed: set[str], *, use_kept: bool = True,
) -> tuple[KeptDetail, dict[int, set[str]]]:
    """The columns kept of each reference session's closed files, where every file they are of
    is as it was (and closed); with the files they cover, per session. ``use_kept`` false: none
    (they are kept anew)."""
    kept = KeptDetail(cache.folder if cache is not None else None)
    covered: dict[int, set[str]] = {}
    if kept.folder is None or not use_kept:
        return kept, covered
    for sid in sorted(set(references)):
        found = load_kept(kept.folder, names[sid], duckdb_sql.RUN_MODEL_VERSION)
        if found is None:
            continue
        entries, columns = found
        by_path = {identities[p].path: p for p in drafts[sid].files if p in identities}
        paths = [by_path.get(str(entry.get("path"))) for entry in entries]
        if (len(set(paths)) == len(paths) and all(p is not None and p in closed and identities[p].matches(entry)
                                                  for p, entry in zip(paths, entries, strict=True))):
            kept.columns[sid] = columns
            covered[sid] = {p for p in paths if p is not None}
    return kept, covered
