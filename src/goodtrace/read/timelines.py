"""The reference sessions' step detail: what the step table needs of each of their files (tags,
metric values, each span name's time per step, FLOPs metrics, events) reduced into the
``det_*`` tables (read from the files, or the segment cache's chunks of kind ``detail``), and
those tables, with the columns kept of closed files (:mod:`goodtrace.read.detail_columns`),
turned into each session's :class:`~goodtrace.read.loaded.SessionTimeline`."""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from typing import Any

from goodtrace import schema
from goodtrace.columns import array_of
from goodtrace.read import fold_batches
from goodtrace.read.detail_columns import DetailColumns, combine, fetch_detail, take, vocabulary
from goodtrace.read.duckdb_connection import execute_all, insert_rows
from goodtrace.read.duckdb_sql import MAX_EVENT_ATTRS, VALID_JSON, create_records_table, read_json_sql
from goodtrace.read.loaded import EventRecord, SessionTimeline
from goodtrace.read.model_fetch import int_column
from goodtrace.read.validate import json_object

__all__ = ["DETAIL_NAMES", "create_detail_tables", "extract_details", "load_timelines"]


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


def load_timelines(
    con: Any, sids: Iterable[int], kept: MutableMapping[int, DetailColumns] | None = None,
    closing: Mapping[int, Iterable[int]] | None = None, keep: Callable[[int, DetailColumns], None] | None = None,
) -> dict[int, SessionTimeline]:
    """What the step table needs of the wanted sessions, per step and as columns (see
    :class:`SessionTimeline`), from the ``det_*`` tables and, per session, the columns kept of
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
    timelines: dict[int, SessionTimeline] = {}
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
        timelines[sid] = _timeline(combine(parts, names, consume=True))
        del parts
    return timelines


def _timeline(detail: DetailColumns) -> SessionTimeline:
    """A :class:`SessionTimeline` of a session's combined detail."""
    import numpy as np

    tl = SessionTimeline()
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
