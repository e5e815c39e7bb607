"""The reference sessions' step detail: what the step table needs of each of their files (tags,
metric values, each span name's time per step and name, FLOPs metrics, events), read into the
``det_*`` tables (:func:`read_details`: of each file from the segment cache, its compacted copy
or its JSON lines; of a file still being written, the prefix the cache holds and the bytes after
it), then, with the columns kept of closed files (:mod:`goodtrace.read.detail_columns`), fetched
and combined into each session's :class:`~goodtrace.read.loaded.SessionDetail`
(:func:`load_details`)."""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
from array import array
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from typing import Any

from goodtrace import schema
from goodtrace.columns import array_of
from goodtrace.read import fold_batches
from goodtrace.read.cache_keep import KeptDetail, kept_detail, store_closed, store_prefixes
from goodtrace.read.chunk_files import FileIdentity, identity_of
from goodtrace.read.detail_columns import DetailColumns, combine, fetch_detail, take, vocabulary
from goodtrace.read.duckdb_sql import (
    MAX_EVENT_ATTRS,
    VALID_JSON,
    create_records_table,
    execute_all,
    insert_rows,
    read_json_sql,
)
from goodtrace.read.file_skips import SHORTEN_TO, FileSkips, range_copy, shortened_copy
from goodtrace.read.loaded import EventRecord, SessionDetail
from goodtrace.read.model_fetch import int_column
from goodtrace.read.segment_cache import OPEN_KINDS, Hit, SegmentCache
from goodtrace.read.validate import json_object

__all__ = ["DETAIL_NAMES", "Growing", "create_detail_tables", "extract_details", "load_details", "read_details"]


# What the step table needs of each file of the reference sessions (tags, metric values, each
# span name's time per step, FLOPs metrics, events): rows, or sums and minima that merge
# across a session's files; the segment cache keeps them for closed files (kind "detail").
_DETAIL_TABLES = (
    "CREATE TABLE det_tags (sid INTEGER, fid INTEGER, step BIGINT, name VARCHAR, t BIGINT)",
    "CREATE TABLE det_metrics (sid INTEGER, fid INTEGER, step BIGINT, name VARCHAR, value DOUBLE, t BIGINT)",
    "CREATE TABLE det_flops (sid INTEGER, fid INTEGER, value DOUBLE, t BIGINT)",
    "CREATE TABLE det_spans (sid INTEGER, fid INTEGER, step BIGINT, name VARCHAR, ns BIGINT, first BIGINT)",
    "CREATE TABLE det_events (sid INTEGER, fid INTEGER, name VARCHAR, t BIGINT, step BIGINT, attrs VARCHAR)",
)
DETAIL_NAMES = tuple(statement.split()[2] for statement in _DETAIL_TABLES)


def create_detail_tables(con: Any) -> None:
    execute_all(con, _DETAIL_TABLES)


def extract_details(con: Any, json_rows: Sequence[tuple[str, int, int]], parquet_rows: Sequence[tuple[int, int, int]]) -> None:
    """The detail of some files into the ``det_*`` tables: ``json_rows`` (path read, session,
    file number) read as JSON lines, ``parquet_rows`` (number in the compacted copy, session,
    file number) from the copy's rows (filtered on ``fid``, so DuckDB skips other row groups);
    the JSON files in the parts a fold batch holds (:func:`fold_batches.batch_parts`, the fold's
    one rule: by files and bytes), the copy's rows :data:`~fold_batches.FOLD_BATCH_FILES` files
    at a time (their bytes are not known here): a long session's detail read whole (a session of
    10 M steps, 7 GB of lines) was one table whose spans DuckDB could not group within its
    memory. Each file's rows are grouped on their own (by file), so the tables are the same."""
    sizes = fold_batches.fold_sizes({0: [path for path, _, _ in json_rows]}, None)
    step = fold_batches.FOLD_BATCH_FILES
    parquet_parts = [parquet_rows[k:k + step] for k in range(0, len(parquet_rows), step)]
    for json_part, parquet_part in itertools.zip_longest(fold_batches.batch_parts(list(json_rows), sizes), parquet_parts,
                                                         fillvalue=()):
        _extract_part(con, json_part, parquet_part)


def _extract_part(con: Any, json_rows: Sequence[tuple[str, int, int]], parquet_rows: Sequence[tuple[int, int, int]]) -> None:
    columns = "kind, name, t0, t1, t, step, value, attrs"
    create_records_table(con, "records_none")
    parts = [f"SELECT sid, 0 AS fid, {columns} FROM records_none WHERE false"]
    if json_rows:
        con.execute("DELETE FROM files_batch")
        insert_rows(con, "files_batch", list(json_rows))
        parts = [
            f"SELECT f.sid, f.fid, {', '.join('r.' + c.strip() for c in columns.split(','))} "
            f"FROM {read_json_sql([p for p, _, _ in json_rows])} r JOIN files_batch f ON r.filename = f.path WHERE {VALID_JSON}"
        ]
    if parquet_rows:
        con.execute("CREATE OR REPLACE TEMP TABLE detailmap (cfid INTEGER, sid INTEGER, fid INTEGER)")
        insert_rows(con, "detailmap", list(parquet_rows))
        fid_list = ", ".join(str(f) for f, _, _ in sorted(parquet_rows))
        parts.append(
            f"SELECT m.sid, m.fid, {', '.join('p.' + c.strip() for c in columns.split(','))} FROM parquet_records p "
            f"JOIN detailmap m ON p.fid = m.cfid WHERE p.fid IN ({fid_list}) AND p.bad IS NULL"
        )
    con.execute(f"CREATE OR REPLACE TEMP TABLE detail AS {' UNION ALL '.join(parts)}")
    con.execute(f"INSERT INTO det_tags SELECT sid, fid, step, coalesce(name, '?'), t FROM detail "
                f"WHERE kind = '{schema.TAG}' AND t IS NOT NULL AND step IS NOT NULL")
    con.execute(f"INSERT INTO det_metrics SELECT sid, fid, step, coalesce(name, '?'), value, t FROM detail "
                f"WHERE kind = '{schema.METRIC}' AND step IS NOT NULL AND value IS NOT NULL")
    con.execute(f"INSERT INTO det_flops SELECT sid, fid, value, t FROM detail WHERE kind = '{schema.METRIC}' "
                "AND value IS NOT NULL AND name IN ('model_flops_per_step', 'flops_per_step')")
    con.execute("INSERT INTO det_spans SELECT sid, fid, step, coalesce(name, '?'), sum(greatest(t0, t1) - t0)::BIGINT, "
                f"min(t0) FROM detail WHERE kind = '{schema.SPAN}' AND t0 IS NOT NULL AND t1 IS NOT NULL "
                "AND step IS NOT NULL GROUP BY ALL")
    con.execute(f"INSERT INTO det_events SELECT sid, fid, coalesce(name, '?'), t, step, "
                f"CASE WHEN length(CAST(attrs AS VARCHAR)) <= {MAX_EVENT_ATTRS} THEN CAST(attrs AS VARCHAR) END "
                f"FROM detail WHERE kind = '{schema.EVENT}' AND t IS NOT NULL")
    con.execute("DROP TABLE detail")
    con.execute("DROP TABLE records_none")


def load_details(
    con: Any, sids: Iterable[int], kept: MutableMapping[int, DetailColumns] | None = None,
    closing: Mapping[int, Iterable[int]] | None = None, keep: Callable[[int, DetailColumns], None] | None = None,
) -> dict[int, SessionDetail]:
    """What the step table needs of the wanted sessions, per step and as columns (see
    :class:`SessionDetail`), from the ``det_*`` tables and, per session, the columns kept of
    files not in them (``kept``, taken from it as used; :mod:`goodtrace.read.detail_columns`),
    combined in one place (:func:`~goodtrace.read.detail_columns.combine`). ``closing``: per
    session, the files (their ``fid``) whose rows join what is kept; ``keep`` is handed those
    new columns. A session at a time, each part released as soon as it is combined."""
    import numpy as np

    wanted = sorted(set(sids))
    kept = kept if kept is not None else {}
    closing = closing or {}
    fetched = fetch_detail(con, wanted)
    names = vocabulary([columns for columns, _ in fetched.values()] + [kept[sid] for sid in wanted if sid in kept])
    details: dict[int, SessionDetail] = {}
    for sid in wanted:
        rows, fids = fetched.pop(sid)
        parts = [kept.pop(sid)] if sid in kept else []
        if sid in closing and keep is not None:
            ending = np.array(sorted(set(closing[sid])), dtype=np.int64)
            joining = {table: np.isin(fid, ending) for table, fid in fids.items()}
            parts.append(take(rows, joining))
            rest = take(rows, {table: ~mask for table, mask in joining.items()})
            del rows, fids, joining
            columns = combine(parts, names, consume=True)
            keep(sid, columns)
            parts = [columns, rest]
            del columns, rest
        else:
            parts.append(rows)
            del rows, fids
        details[sid] = _session_detail(combine(parts, names, consume=True))
        del parts
    return details


def _session_detail(detail: DetailColumns) -> SessionDetail:
    """A :class:`SessionDetail` of a session's combined detail."""
    import numpy as np

    tl = SessionDetail()
    tl.names = detail.names
    tags, metrics, spans = detail.tables.pop("tags"), detail.tables.pop("metrics"), detail.tables.pop("spans")

    def codes(values: Any) -> array[int]:
        return array_of(np.asarray(values, dtype=np.int32), "i")

    tl.tag_step, tl.tag_name, tl.tag_t = int_column(tags["step"]), codes(tags["name"]), int_column(tags["t"])
    del tags
    tl.metric_step, tl.metric_name = int_column(metrics["step"]), codes(metrics["name"])
    tl.metric_value = array_of(np.asarray(metrics["value"], dtype=np.float64), "d")
    del metrics
    tl.span_step, tl.span_ns, tl.span_name = int_column(spans.pop("step")), int_column(spans.pop("ns")), codes(spans["name"])
    tl.span_first = int_column(spans["first"])
    # in order of first appearance in time, then of the name (codes sort as names): each name's
    # earliest start, from a pass over the rows, not a sort of them (millions: a row per step)
    first = np.full(len(detail.names), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, spans["name"], spans["first"])
    present = np.flatnonzero(np.bincount(spans["name"], minlength=len(detail.names)))
    tl.span_names = tuple(detail.names[code] for code in present[np.lexsort((present, first[present]))].tolist())
    tl.flops = [float(v) for v in detail.tables["flops"]["value"].tolist()]
    events = detail.tables["events"]
    tl.events = [EventRecord(n, t, None if nostep else s, json_object(a) or None) for t, s, nostep, n, a in zip(
        events["t"].tolist(), events["step"].tolist(), events["nostep"].tolist(), events["name"].tolist(),
        events["attrs"].tolist(), strict=True)]
    return tl

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
