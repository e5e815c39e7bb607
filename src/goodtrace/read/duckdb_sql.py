"""The DuckDB side of the analytical reader: record files -> per-session aggregates in SQL.

DuckDB parses every rank's JSON-lines segments (or reads the compacted Parquet copy) straight
into per-session aggregates (``part`` -> summaries, sync points, compute medians, clock
offsets), so memory stays bounded for any number of ranks and steps; :func:`load_timelines`
reads every record of the few sessions the analysis needs in full.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

from goodtrace import schema
from goodtrace.read.loaded import Progress, RankSummary, SessionInfo, SessionTimeline

# Columns read from every record line. Fields a record kind does not have are NULL.
_COLUMNS: dict[str, str] = {
    schema.F_KIND: "VARCHAR",
    schema.F_NAME: "VARCHAR",
    schema.F_CATEGORY: "VARCHAR",
    schema.F_T0: "BIGINT",
    schema.F_T1: "BIGINT",
    schema.F_T: "BIGINT",
    schema.F_STEP: "BIGINT",
    schema.F_THREAD: "UBIGINT",
    schema.F_ERROR: "BOOLEAN",
    schema.F_HOW: "VARCHAR",
    schema.F_VALUE: "DOUBLE",
    schema.F_REDUCE: "VARCHAR",
    schema.F_MONO: "BIGINT",
    schema.F_DROPPED: "BIGINT",
    schema.F_COMPLETED: "BOOLEAN",
    schema.F_REASON: "VARCHAR",
    schema.F_OFFSET: "BIGINT",
}
_RECORD_COLUMNS = ("sid", *_COLUMNS)  # sid: index of the session in LoadedRun.sessions


def insert_rows(con: Any, table: str, rows: Sequence[Sequence[Any]]) -> None:
    """Insert many rows in one statement (``executemany`` runs one statement per row)."""
    if not rows:
        return
    columns = list(zip(*rows, strict=True))
    select = ", ".join(f"unnest(${i + 1}) AS c{i}" for i in range(len(columns)))
    con.execute(f"INSERT INTO {table} SELECT {select}", [list(c) for c in columns])


def sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def read_json_sql(paths: Sequence[str]) -> str:
    columns = "{" + ", ".join(f"'{k}': '{v}'" for k, v in (*_COLUMNS.items(), (schema.F_ATTRS, "JSON"))) + "}"
    files = "[" + ", ".join(sql_str(p) for p in paths) + "]"
    return (
        f"read_json({files}, columns={columns}, format='newline_delimited', ignore_errors=true, "
        "filename=true, maximum_object_size=16777216)"
    )


def connect(tmpdir: str) -> Any:
    import duckdb

    con = duckdb.connect(os.path.join(tmpdir, "run.duckdb"))
    con.execute(f"SET temp_directory={sql_str(os.path.join(tmpdir, 'spill'))}")
    con.execute("SET memory_limit='1GB'")
    con.execute("SET preserve_insertion_order=false")
    return con


def create_records_table(con: Any, table: str = "records") -> None:
    cols = ", ".join(f"{name} {kind}" for name, kind in _COLUMNS.items())
    con.execute(f"CREATE TABLE {table} (sid INTEGER, {cols}, attrs VARCHAR)")


def insert_json(
    con: Any, paths: Sequence[str], sid_of_file: dict[str, int], progress: Progress | None, done: int,
    total: int, table: str = "records",
) -> int:
    batch = 32
    names = ", ".join(f"r.{name}" for name in _COLUMNS)
    for start in range(0, len(paths), batch):
        chunk = list(paths[start:start + batch])
        con.execute("DELETE FROM files_batch")
        insert_rows(con, "files_batch", [(p, sid_of_file[p]) for p in chunk])
        source = read_json_sql(chunk)
        con.execute(
            # attributes are kept for events only (spans' attributes are not analysed)
            f"INSERT INTO {table} SELECT f.sid, {names}, CASE WHEN r.kind = '{schema.EVENT}' THEN r.attrs END "
            f"FROM {source} r "
            "JOIN files_batch f ON r.filename = f.path "
            f"WHERE r.kind IS NOT NULL AND r.kind <> '{schema.HEADER}'"
        )
        done += len(chunk)
        if progress is not None:
            progress("reading rank files", done, total)
    return done


_PART_TABLE = (
    "CREATE OR REPLACE TEMP TABLE part (key VARCHAR, sync_step BIGINT, compute_tid UBIGINT, "
    "sync_t BIGINT, last_seen BIGINT, dropped BIGINT, first_step BIGINT, last_step BIGINT, step_count BIGINT, "
    "sync_count BIGINT, has_finish BIGINT, finish_completed BOOLEAN, finish_t BIGINT, finish_reason VARCHAR, "
    "preempt_events BIGINT, records BIGINT, compute_median DOUBLE, compute_n BIGINT, clock_offset BIGINT, "
    "clock_t BIGINT)"
)
AGGREGATE_TABLES = (
    _PART_TABLE,
    "CREATE OR REPLACE TEMP TABLE keymap (key VARCHAR, sid INTEGER)",
    "CREATE TABLE summ_part (sid INTEGER, last_seen BIGINT, dropped BIGINT, first_step BIGINT, last_step BIGINT, "
    "step_count BIGINT, sync_count BIGINT, has_finish BIGINT, finish_completed BOOLEAN, finish_t BIGINT, "
    "finish_reason VARCHAR, preempt_events BIGINT, records BIGINT)",
    "CREATE TABLE syncs (sid INTEGER, step BIGINT, t BIGINT)",
    "CREATE TABLE compute_part (sid INTEGER, median DOUBLE, n BIGINT)",
    "CREATE TABLE clock_part (sid INTEGER, offset_ns BIGINT, t BIGINT)",
)


# The per-file aggregates that both the JSON-lines and the Parquet folds compute (columns of
# ``part`` after the key, sync step, compute thread and last sync point).
_SESSION_COLUMNS = f"""max(greatest(coalesce(t, 0), coalesce(t1, 0), coalesce(mono, 0))),
               max(dropped),
               min(step) FILTER (WHERE kind = '{schema.STEP}'),
               max(step) FILTER (WHERE kind = '{schema.STEP}'),
               count(*) FILTER (WHERE kind = '{schema.STEP}'),
               count(*) FILTER (WHERE kind = '{schema.SYNC}'),
               count(*) FILTER (WHERE kind = '{schema.FINISH}'),
               arg_max(completed, t) FILTER (WHERE kind = '{schema.FINISH}'),
               max(t) FILTER (WHERE kind = '{schema.FINISH}'),
               arg_max(reason, t) FILTER (WHERE kind = '{schema.FINISH}'),
               count(*) FILTER (WHERE kind = '{schema.EVENT}' AND lower(name) LIKE '%preempt%'),
               count(*)"""
# The latest measured clock offset of the file and when it was taken.
_CLOCK_COLUMNS = f"""arg_max(offset_ns, t) FILTER (WHERE kind = '{schema.CLOCK}' AND offset_ns IS NOT NULL),
               max(t) FILTER (WHERE kind = '{schema.CLOCK}' AND offset_ns IS NOT NULL)"""


def _fold(con: Any, key: str, source: str) -> None:
    """One pass over ``source`` (records of one or more files; ``key`` names the file) into
    the ``part`` table. Grouping by the file, the step of a sync record and the thread of a
    compute span keeps every sync point as its own row and the main thread's compute median
    separable, so the records themselves are never stored."""
    con.execute(
        f"""
        INSERT INTO part SELECT {key} AS key,
               CASE WHEN kind = '{schema.SYNC}' THEN step END AS sync_step,
               CASE WHEN kind = '{schema.SPAN}' AND cat = '{schema.COMPUTE}' THEN tid END AS compute_tid,
               max(t) FILTER (WHERE kind = '{schema.SYNC}'),
               {_SESSION_COLUMNS},
               median(t1 - t0) FILTER (WHERE kind = '{schema.SPAN}' AND cat = '{schema.COMPUTE}'),
               count(*) FILTER (WHERE kind = '{schema.SPAN}' AND cat = '{schema.COMPUTE}'),
               {_CLOCK_COLUMNS}
        FROM {source}
        WHERE kind IS NOT NULL AND kind <> '{schema.HEADER}'
        GROUP BY ALL
        """
    )


def fold_parquet(con: Any) -> None:
    """The compacted copy into ``part`` in three targeted queries: the Parquet file is sorted by
    record kind, so the sync-point and compute-span queries read only those row groups."""
    key = "'fid:' || fid"
    con.execute(
        f"""
        INSERT INTO part SELECT {key}, NULL, NULL, NULL,
               {_SESSION_COLUMNS}, NULL, 0,
               {_CLOCK_COLUMNS}
        FROM parquet_records WHERE kind IS NOT NULL GROUP BY fid
        """
    )
    con.execute(
        f"""
        INSERT INTO part (key, sync_step, sync_t, records)
        SELECT {key}, step, max(t), 0 FROM parquet_records
        WHERE kind = '{schema.SYNC}' AND step IS NOT NULL GROUP BY fid, step
        """
    )
    con.execute(
        f"""
        INSERT INTO part (key, compute_tid, compute_median, compute_n, records)
        SELECT {key}, tid, median(t1 - t0), count(*), 0 FROM parquet_records
        WHERE kind = '{schema.SPAN}' AND cat = '{schema.COMPUTE}' AND tid IS NOT NULL GROUP BY fid, tid
        """
    )


def fold_json(
    con: Any, files_by_sid: dict[int, list[str]], progress: Progress | None, done: int, total: int
) -> int:
    """Parse the JSON files, about 32 at a time, straight into ``part``."""
    paths = [p for sid in sorted(files_by_sid) for p in files_by_sid[sid]]
    if paths:
        insert_rows(con, "keymap", [(p, sid) for sid in files_by_sid for p in files_by_sid[sid]])
    for start in range(0, len(paths), 32):
        chunk = paths[start:start + 32]
        _fold(con, "filename", read_json_sql(chunk))
        done += len(chunk)
        if progress is not None:
            progress("reading rank files", done, total)
    return done


def distribute(con: Any) -> None:
    """``part`` rows -> per-session summaries, sync points, compute medians, clock offsets."""
    con.execute("CREATE OR REPLACE TEMP VIEW part_rows AS SELECT k.sid, p.* FROM part p JOIN keymap k USING (key)")
    con.execute(
        """
        INSERT INTO summ_part SELECT sid, max(last_seen), max(dropped), min(first_step), max(last_step),
               sum(step_count), sum(sync_count), sum(has_finish), arg_max(finish_completed, finish_t),
               max(finish_t), arg_max(finish_reason, finish_t), sum(preempt_events), sum(records)
        FROM part_rows GROUP BY sid
        """
    )
    con.execute(
        "INSERT INTO syncs SELECT sid, sync_step, max(sync_t) FROM part_rows WHERE sync_step IS NOT NULL "
        "GROUP BY sid, sync_step"
    )
    con.execute(
        """
        INSERT INTO compute_part SELECT r.sid, r.compute_median, r.compute_n FROM part_rows r
        JOIN sessmain m ON r.sid = m.sid
        WHERE r.compute_tid IS NOT NULL AND r.compute_n > 0 AND (m.main_tid IS NULL OR r.compute_tid = m.main_tid)
        """
    )
    con.execute("INSERT INTO clock_part SELECT sid, clock_offset, clock_t FROM part_rows WHERE clock_offset IS NOT NULL")


def session_summaries(con: Any) -> dict[int, dict[str, Any]]:
    rows = con.execute(
        """
        SELECT sid, max(last_seen), max(dropped), min(first_step), max(last_step), sum(step_count),
               sum(sync_count), sum(has_finish), arg_max(finish_completed, finish_t), max(finish_t),
               arg_max(finish_reason, finish_t), sum(preempt_events), sum(records)
        FROM summ_part GROUP BY sid
        """
    ).fetchall()
    keys = ("last_seen", "dropped", "first_step", "last_step", "step_count", "sync_count", "has_finish",
            "finish_completed", "finish_t", "finish_reason", "preempt_events", "records")
    return {int(row[0]): dict(zip(keys, row[1:], strict=True)) for row in rows}


def rank_summaries(
    con: Any, sessions: Sequence[SessionInfo], attempts: Sequence[int], counts: dict[int, int]
) -> dict[int, RankSummary]:
    # Sync points go onto one clock per attempt: measured offsets to the reference rank
    # (reference = local + offset_ns, see goodtrace.record.clocksync) where recorded, else anchors.
    offsets = dict(con.execute("SELECT sid, arg_max(offset_ns, t) FROM clock_part GROUP BY sid").fetchall())
    reference: dict[int, SessionInfo] = {}
    for s in sorted(sessions, key=lambda s: s.rank):
        reference.setdefault(attempts[s.index], s)
    rows = []
    for s in sessions:
        ref = reference[attempts[s.index]]
        offset = offsets.get(s.index)
        delta = (
            int(offset) + ref.wall_anchor - ref.mono_anchor
            if offset is not None and ref is not s else s.wall_anchor - s.mono_anchor
        )
        rows.append((s.index, attempts[s.index], delta, s.main_tid))
    con.execute("CREATE OR REPLACE TEMP TABLE sess (sid INTEGER, attempt INTEGER, delta BIGINT, main_tid UBIGINT)")
    insert_rows(con, "sess", rows)
    step_times = con.execute(
        """
        WITH s AS (SELECT sid, t - lag(t) OVER (PARTITION BY sid ORDER BY t) AS dt FROM syncs)
        SELECT sid, median(dt), quantile_cont(dt, 0.9) FROM s WHERE dt IS NOT NULL GROUP BY sid
        """
    ).fetchall()
    # a session read in several parts (rare: part compacted, part grown since) gets the
    # count-weighted mean of its parts' medians
    compute = con.execute("SELECT sid, sum(median * n) / sum(n) FROM compute_part GROUP BY sid").fetchall()
    lateness = con.execute(
        """
        WITH a AS (
            SELECT r.sid, sess.attempt, r.step, max(r.t + sess.delta) AS w
            FROM syncs r JOIN sess USING (sid)
            GROUP BY r.sid, sess.attempt, r.step),
        b AS (
            SELECT sid, w - min(w) OVER (PARTITION BY attempt, step) AS late,
                   w = max(w) OVER (PARTITION BY attempt, step) AS last,
                   count(*) OVER (PARTITION BY attempt, step) AS n
            FROM a)
        SELECT sid, median(late), avg(CASE WHEN last AND n > 1 THEN 1.0 ELSE 0.0 END) FROM b GROUP BY sid
        """
    ).fetchall()
    st = {int(r[0]): (r[1], r[2]) for r in step_times}
    cm = {int(r[0]): r[1] for r in compute}
    lt = {int(r[0]): (r[1], r[2]) for r in lateness}
    out: dict[int, RankSummary] = {}
    for s in sessions:
        a, b = st.get(s.index, (None, None))
        c, d = lt.get(s.index, (None, None))
        out[s.index] = RankSummary(
            index=s.index,
            step_time_median_ns=_float(a),
            step_time_p90_ns=_float(b),
            compute_median_ns=_float(cm.get(s.index)),
            lateness_median_ns=_float(c),
            late_fraction=_float(d),
            records=int(counts.get(s.index, 0)),
        )
    return out


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def load_timelines(
    con: Any, sids: Iterable[int], parquet_fids: dict[int, list[int]], json_files: dict[int, list[str]]
) -> dict[int, SessionTimeline]:
    """Every record of the wanted sessions: their JSON files read again (a few of many), and
    their rows of the Parquet copy (filtered on ``fid``, so DuckDB skips other row groups).
    One query per record kind, rows fetched as ready-made tuples."""
    wanted = sorted(set(sids))
    timelines = {sid: SessionTimeline() for sid in wanted}
    if not wanted:
        return timelines
    columns = "kind, name, cat, t0, t1, t, step, tid, err, how, value, reduce, offset_ns, attrs"
    paths = [f for s in wanted for f in json_files.get(s, [])]
    parts = [f"SELECT sid, {columns} FROM records_json WHERE false"]
    if paths:
        con.execute("DELETE FROM files_batch")
        insert_rows(con, "files_batch", [(p, s) for s in wanted for p in json_files.get(s, [])])
        parts = [
            f"SELECT f.sid, {', '.join('r.' + c.strip() for c in columns.split(','))} FROM {read_json_sql(paths)} r "
            f"JOIN files_batch f ON r.filename = f.path WHERE r.kind IS NOT NULL AND r.kind <> '{schema.HEADER}'"
        ]
    fids = [f for s in wanted for f in parquet_fids.get(s, [])]
    if fids:
        fid_list = ", ".join(str(f) for f in sorted(fids))
        parts.append(
            f"SELECT m.sid, {', '.join('p.' + c.strip() for c in columns.split(','))} FROM parquet_records p "
            f"JOIN fidmap m ON p.fid = m.fid WHERE p.fid IN ({fid_list})"
        )
    con.execute(f"CREATE OR REPLACE TEMP TABLE detail AS {' UNION ALL '.join(parts)}")

    def grouped(sql: str) -> dict[int, list[Any]]:
        out: dict[int, list[Any]] = {}
        for row in con.execute(sql).fetchall():
            out.setdefault(row[0], []).append(row[1:])
        return out

    spans = grouped(
        f"SELECT sid, coalesce(name, '?'), coalesce(cat, '{schema.COMPUTE}'), t0, greatest(t0, t1), step, tid, "
        f"coalesce(err, false) FROM detail WHERE kind = '{schema.SPAN}' AND t0 IS NOT NULL AND t1 IS NOT NULL "
        "ORDER BY sid, t0"
    )
    steps = grouped(
        f"SELECT sid, step, t0, greatest(t0, t1) FROM detail WHERE kind = '{schema.STEP}' AND step IS NOT NULL "
        "AND t0 IS NOT NULL AND t1 IS NOT NULL ORDER BY sid, t0"
    )
    syncs = grouped(
        f"SELECT sid, step, t, coalesce(how, '') FROM detail WHERE kind = '{schema.SYNC}' AND step IS NOT NULL "
        "AND t IS NOT NULL ORDER BY sid, t"
    )
    tags = grouped(
        f"SELECT sid, step, coalesce(name, '?'), t FROM detail WHERE kind = '{schema.TAG}' AND t IS NOT NULL "
        "ORDER BY sid, t"
    )
    events = grouped(
        f"SELECT sid, coalesce(name, '?'), t, step FROM detail WHERE kind = '{schema.EVENT}' AND t IS NOT NULL "
        "ORDER BY sid, t"
    )
    metrics = grouped(
        f"SELECT sid, coalesce(name, '?'), step, value, coalesce(reduce, 'mean') FROM detail "
        f"WHERE kind = '{schema.METRIC}' ORDER BY sid, t"
    )
    offsets = dict(
        con.execute(
            f"SELECT sid, arg_max(offset_ns, t) FROM detail WHERE kind = '{schema.CLOCK}' "
            "AND offset_ns IS NOT NULL GROUP BY sid"
        ).fetchall()
    )
    models = dict(
        con.execute(
            f"SELECT sid, arg_max(attrs, t) FROM detail WHERE kind = '{schema.EVENT}' AND name = 'model' "
            "AND attrs IS NOT NULL GROUP BY sid"
        ).fetchall()
    )
    for sid, tl in timelines.items():
        tl.model = _json_object(models.get(sid))
        tl.spans = spans.get(sid, [])
        tl.steps = steps.get(sid, [])
        tl.syncs = syncs.get(sid, [])
        tl.tags = tags.get(sid, [])
        tl.events = events.get(sid, [])
        tl.metrics = metrics.get(sid, [])
        tl.clock_offset = int(offsets.get(sid) or 0)
    con.execute("DROP TABLE detail")
    return timelines


def _json_object(text: object) -> dict[str, Any]:
    if not isinstance(text, str):
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
