"""The reference sessions' step detail read into the ``det_*`` tables (tags, metric values,
span time per step and name, FLOPs, events): of each file, from the segment cache, its
compacted copy or its JSON lines (of a file still being written, the prefix the cache holds
and the bytes after it), and what is kept as columns of closed files
(:mod:`goodtrace.read.detail_columns`) left out; the load's part that
:func:`goodtrace.read.timelines.load_timelines` then fetches and combines."""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Sequence
from typing import Any

from goodtrace.read.cache_keep import KeptDetail, kept_detail, store_closed, store_prefixes
from goodtrace.read.chunk_files import FileIdentity, identity_of
from goodtrace.read.file_skips import SHORTEN_TO, FileSkips, range_copy
from goodtrace.read.long_lines import shortened_copy
from goodtrace.read.segment_cache import OPEN_KINDS, Hit, SegmentCache
from goodtrace.read.timelines import DETAIL_NAMES, create_detail_tables, extract_details

__all__ = ["Growing", "read_details"]


@dataclasses.dataclass(frozen=True)
class Growing:
    """The files still being written, as the fold read them: the bytes read of each
    (``ranges``), how much of each the cache may keep (``ends``), and a folder for copies."""

    ranges: dict[str, tuple[int, int]]
    ends: dict[str, tuple[int, dict[str, int]]]
    folder: str


def read_details(
    con: Any, root: str, cache: SegmentCache | None, references: Sequence[int], drafts: Sequence[Any], fid_of: dict[str, int],
    identities: dict[str, FileIdentity], closed: set[str], skips: FileSkips,
    parquet_ok: dict[str, dict[str, Any]], path_of: dict[int, str], growing: Growing, names: Sequence[str], *,
    use_kept: bool = True,
) -> KeptDetail:
    """The reference sessions' detail into the ``det_*`` tables: from the cache, or read from
    their files (JSON, or the compacted copy) and kept when closed; of a file still being
    written, the prefix the cache holds and the bytes the fold read after it. The files whose
    detail is kept as columns (:func:`kept_detail`; none with ``use_kept`` false) are left out;
    returns what to combine."""
    create_detail_tables(con)
    kept, covered = kept_detail(cache, references, drafts, names, identities, closed, use_kept=use_kept)
    wanted = {fid_of[p]: (sid, p) for sid in sorted(set(references)) for p in drafts[sid].files
              if p not in covered.get(sid, ())}
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
                copy = range_copy(p, (hit.prefix or 0) if hit is not None else 0,
                                             growing.ranges[p][1], growing.folder)
            except OSError:  # gone since the fold: DuckDB says so, and the run is read again
                copy = p
            if p in skips.long_ranges:
                found = shortened_copy(copy, SHORTEN_TO)
                copy = found[0] if found is not None else copy
            json_rows.append((copy, sid, fid))
        else:
            json_rows.append((skips.substitutes.get(p, p), sid, fid))
    try:
        extract_details(con, json_rows, parquet_rows)
    finally:
        shutil.rmtree(growing.folder, ignore_errors=True)
    if cache is not None:
        store_closed(cache, con, root, "detail", DETAIL_NAMES,
               {fid: identities[p] for fid, (_, p) in wanted.items() if p in closed and p in identities}, hits, skips,
               path_of)
        store_prefixes(cache, con, kind, DETAIL_NAMES,
                        {p: end for fid, (_, p) in wanted.items() if fid not in hits and (end := growing.ends.get(p))},
                        open_hits, closed, identities, fid_of)
    if kept.folder is not None:  # the closed files not yet in the kept columns join them
        for sid in sorted(set(references)):
            closable = [p for p in drafts[sid].files if p in closed and p in identities
                        and p not in skips.substitutes and "too_long" not in skips.by_file.get(p, {})
                        and (p in covered.get(sid, ()) or not os.path.exists(p)
                             or identity_of(root, p, identities[p].main_tid) == identities[p])]
            joining = [fid_of[p] for p in closable if p not in covered.get(sid, ())]
            if joining:
                kept.closing[sid] = joining
                kept.files[sid] = [identities[p] for p in closable]
    return kept
