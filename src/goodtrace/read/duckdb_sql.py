"""The DuckDB side of the analytical reader: record files -> per-session columns in SQL.

DuckDB parses every rank's JSON-lines segments (a batch of whole sessions at a time,
materialised once and queried several times) or reads the compacted Parquet copy, and keeps
only what the run model needs of every session: a summary (last sign of life, finish, counts),
step and sync records, main-thread overhead spans, the outermost compute time of each
execution, device metrics, clock samples, a sample of span starts and events. Memory stays
bounded for any number of ranks and steps; :func:`load_timelines` reads every record of the
few sessions the analysis needs in full.

Every line is checked where it enters (:func:`goodtrace.read.validate.invalid_sql`: a line
that is not a record reads as a row whose kind is NULL): only valid records reach the run
model, and the others are counted per file by reason (:class:`FileSkips`). A line longer than
DuckDB's read buffer makes it refuse the whole batch; its files are then read from copies
without those lines (:mod:`goodtrace.read.long_lines`), which are counted too.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from goodtrace import schema
from goodtrace.read.discovery import torn_tail, where_of
from goodtrace.read.loaded import NO_TIME, Progress, SessionRecords, SessionTimeline
from goodtrace.read.long_lines import shortened_copy
from goodtrace.read.validate import MAX_LINE_BYTES, invalid_sql, json_object

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
    schema.F_RTT: "BIGINT",
    schema.F_SEQ: "BIGINT",
    schema.F_READY_AFTER: "BIGINT",
    schema.F_EXCEPTION: "VARCHAR",
}
_MAX_EVENT_ATTRS = 4096  # event attributes longer than this (as JSON text) are not kept
# Span starts are sampled for arrival lateness: about 32 steps of each session's step range
# (every step of a short run); goodtrace.analysis.ranks samples sync points by the same rule.
SAMPLE_STEPS = 32
_DEVICE_METRICS = ", ".join(f"'{m}'" for m in schema.DEVICE_METRICS)


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
        f"filename=true, maximum_object_size={DUCKDB_OBJECT_BYTES})"
    )


# DuckDB reads lines through a buffer twice this size and refuses a batch of files with a line
# that does not fit (~32 MiB, validate.MAX_LINE_BYTES); those files are read from copies without
# the lines longer than SHORTEN_TO (a little under it, so that the retry always fits).
DUCKDB_OBJECT_BYTES = MAX_LINE_BYTES // 2
SHORTEN_TO = MAX_LINE_BYTES - 65536

# Valid records of a relation of read_json rows (``r.``) / of a table with a ``bad`` column.
VALID_JSON = f"({invalid_sql('r.')}) IS NULL"
INVALID = f"({invalid_sql()})"


class FileSkips:
    """Lines skipped in each file, by reason (validate.SKIP_REASONS), and the warnings that
    name them; ``substitutes`` maps a file to the copy read instead (its long lines left out)."""

    def __init__(self) -> None:
        self.by_file: dict[str, dict[str, int]] = {}
        self.substitutes: dict[str, str] = {}
        self.notes: list[str] = []

    def add(self, path: str, reason: str, count: int) -> None:
        if count:
            counts = self.by_file.setdefault(path, {})
            counts[reason] = counts.get(reason, 0) + count

    def add_rows(self, path: str, rows: dict[str, int], torn: bool) -> None:
        """What DuckDB found in one file: rows by reason (its first line is the header the
        session came from, not an extra one; an unreadable row that is the file's torn tail is a
        torn last line)."""
        rows = dict(rows)
        if rows.get("extra_header"):
            rows["extra_header"] -= 1
        elif rows.get("unreadable"):  # the header line itself, which DuckDB could not decode
            rows["unreadable"] -= 1
        if torn and rows.get("unreadable"):
            rows["unreadable"] -= 1
            rows["torn_last_line"] = rows.get("torn_last_line", 0) + 1
        for reason, count in rows.items():
            self.add(path, reason, count)

    def shorten(self, paths: Sequence[str]) -> dict[str, str]:
        """Copies of the files among ``paths`` that have lines over the limit (DuckDB refused
        their batch); the long lines are counted and named."""
        done: dict[str, str] = {}
        for path in paths:
            original = self.original(path)
            if path != original:
                continue
            found = shortened_copy(path, SHORTEN_TO)
            if found is None:
                continue
            copy, left_out = found
            done[path] = self.substitutes[path] = copy
            self.add(path, "too_long", left_out.too_long)
            self.add(path, "torn_last_line", 1 if left_out.torn else 0)
            shown = ", ".join(str(n) for n in left_out.numbers[:5]) + (" ..." if len(left_out.numbers) > 5 else "")
            self.notes.append(f"{where_of(path)}: line(s) {shown} longer than {MAX_LINE_BYTES // 2**20} MiB; "
                              "skipped (the rest of the file is read)")
        return done

    def original(self, path: str) -> str:
        for original, copy in self.substitutes.items():
            if copy == path:
                return original
        return path


def _is_too_long(exc: Exception) -> bool:
    return "maximum_object_size" in str(exc)


def connect(tmpdir: str) -> Any:
    import duckdb

    con = duckdb.connect(os.path.join(tmpdir, "run.duckdb"))
    con.execute(f"SET temp_directory={sql_str(os.path.join(tmpdir, 'spill'))}")
    con.execute("SET memory_limit='1GB'")
    con.execute("SET preserve_insertion_order=false")
    return con


def create_records_table(con: Any, table: str = "records") -> None:
    """Every line of some files: ``sid`` (or a file id), the record columns, the attributes of
    events, and ``bad``: why the line is no valid record (NULL for a valid one)."""
    cols = ", ".join(f"{name} {kind}" for name, kind in _COLUMNS.items())
    con.execute(f"CREATE TABLE {table} (sid INTEGER, {cols}, attrs VARCHAR, bad VARCHAR)")


R = TypeVar("R", bound=tuple[Any, ...])


def _read_batch(con: Any, rows: list[R], sql: str, skips: FileSkips) -> list[R]:
    """Run ``sql`` (its ``{source}``: read_json joined to ``files_batch`` as ``r`` and ``f``)
    over the files of ``rows`` (rows of ``files_batch``: a path, then ids); when DuckDB refuses
    a line that is too long, again over copies without the long lines. Returns the rows as
    read (copies in place of their files)."""
    import duckdb

    for attempt in range(2):
        con.execute("DELETE FROM files_batch")
        insert_rows(con, "files_batch", rows)
        source = f"{read_json_sql([row[0] for row in rows])} r JOIN files_batch f ON r.filename = f.path"
        try:
            con.execute(sql.format(source=source))
            return rows
        except duckdb.InvalidInputException as exc:
            if attempt or not _is_too_long(exc):
                raise
            copies = skips.shorten([row[0] for row in rows])
            if not copies:
                raise
            rows = [(copies.get(row[0], row[0]), *row[1:]) for row in rows]  # type: ignore[misc]
    return rows


def count_skips(con: Any, table: str, rows: Sequence[tuple[str, int]], skips: FileSkips) -> None:
    """Count the rows of ``table`` (columns ``fid``, ``bad``) that are no valid record, per file
    (``rows``: the (path read, fid) pairs of the batch)."""
    counts: dict[int, dict[str, int]] = {}
    for fid, bad, count in con.execute(f"SELECT fid, bad, count(*) FROM {table} WHERE bad IS NOT NULL GROUP BY ALL").fetchall():
        counts.setdefault(int(fid), {})[str(bad)] = int(count)
    for path, fid in rows:
        found = counts.get(fid)
        if found:
            skips.add_rows(skips.original(path), found, found.get("unreadable", 0) > 0 and torn_tail(path))


def insert_json(
    con: Any, paths: Sequence[str], fid_of_file: dict[str, int], progress: Progress | None, done: int,
    total: int, skips: FileSkips, table: str = "records",
) -> int:
    """Every line of ``paths`` into ``table`` (see :func:`create_records_table`) with its file
    id and why it is no valid record (``bad``, NULL for a valid one): ``goodtrace compact``.
    The skipped lines are counted in ``skips``."""
    batch = 32
    names = ", ".join(f"r.{name}" for name in _COLUMNS)
    read: list[tuple[str, int]] = []
    for start in range(0, len(paths), batch):
        chunk = [(p, fid_of_file[p]) for p in paths[start:start + batch]]
        read += _read_batch(
            con, chunk,
            # attributes are kept for events only (spans' attributes are not analysed)
            f"INSERT INTO {table} SELECT f.sid, {names}, CASE WHEN r.kind = '{schema.EVENT}' THEN r.attrs END, "
            f"{invalid_sql('r.')} FROM {{source}}", skips,
        )
        done += len(chunk)
        if progress is not None:
            progress("reading rank files", done, total)
    count_skips(con, f"(SELECT fid, bad FROM {table})", read, skips)
    return done


# ---------------------------------------------------------------------------------- the fold
_SCRATCH_TABLES = (
    "CREATE TEMP TABLE files_batch (path VARCHAR, sid INTEGER, fid INTEGER)",
    "CREATE TEMP TABLE fidmap (fid INTEGER, sid INTEGER)",  # every file of the compacted copy read
    "CREATE TEMP TABLE foldmap (fid INTEGER, sid INTEGER)",  # ... of those, the ones to extract from
    "CREATE TEMP TABLE csidmap (csid INTEGER, sid INTEGER)",  # sessions taken from the stored model
    "CREATE TEMP TABLE sessmain (sid INTEGER, main_tid UBIGINT)",
)
# What the run model keeps of every session (see _extract); ``goodtrace compact`` stores these
# tables beside the Parquet copy, so that a report on it skips the extraction.
_RUN_MODEL_TABLES = (
    "CREATE TABLE summ (sid INTEGER, last_seen BIGINT, dropped BIGINT, first_step BIGINT, last_step BIGINT, "
    "step_count BIGINT, sync_count BIGINT, has_finish BIGINT, finish_completed BOOLEAN, finish_t BIGINT, "
    "finish_reason VARCHAR, finish_exception VARCHAR, preempt_events BIGINT, records BIGINT, heartbeat BIGINT)",
    "CREATE TABLE m_steps (sid INTEGER, seq BIGINT, step BIGINT, t0 BIGINT, t1 BIGINT)",
    "CREATE TABLE m_syncs (sid INTEGER, seq BIGINT, step BIGINT, t BIGINT, how VARCHAR, after BIGINT)",
    "CREATE TABLE m_spans (sid INTEGER, cat VARCHAR, t0 BIGINT, t1 BIGINT, step BIGINT)",
    "CREATE TABLE m_compute (sid INTEGER, seq BIGINT, ns BIGINT)",
    "CREATE TABLE m_device (sid INTEGER, name VARCHAR, step BIGINT, value DOUBLE)",
    "CREATE TABLE m_clock (sid INTEGER, t BIGINT, offset_ns BIGINT, rtt_ns BIGINT)",
    "CREATE TABLE m_starts (sid INTEGER, step BIGINT, name VARCHAR, t0 BIGINT)",
    "CREATE TABLE m_events (sid INTEGER, name VARCHAR, t BIGINT, step BIGINT)",
    "CREATE TABLE m_model (sid INTEGER, name VARCHAR, value DOUBLE, attrs VARCHAR, t BIGINT)",
)
MODEL_TABLES = _SCRATCH_TABLES + _RUN_MODEL_TABLES
RUN_MODEL_NAMES = tuple(statement.split()[2] for statement in _RUN_MODEL_TABLES)
# Bumped whenever _extract or the tables above change: a stored model of another version is
# not used (the records are extracted again from the Parquet copy).
RUN_MODEL_VERSION = 1

_MAIN = "(m.main_tid IS NULL OR b.tid IS NULL OR b.tid = m.main_tid)"


def _extract(con: Any, source: str) -> None:
    """What the run model needs of the records in ``source`` (a relation with a ``sid`` column
    holding whole sessions), into the ``summ`` and ``m_*`` tables."""
    k = schema
    con.execute(
        f"""
        INSERT INTO summ SELECT sid,
               max(greatest(coalesce(t, 0), coalesce(t1, 0), coalesce(mono, 0))),
               max(dropped),
               min(step) FILTER (WHERE kind = '{k.STEP}'),
               max(step) FILTER (WHERE kind = '{k.STEP}'),
               count(*) FILTER (WHERE kind = '{k.STEP}'),
               count(*) FILTER (WHERE kind = '{k.SYNC}'),
               count(*) FILTER (WHERE kind = '{k.FINISH}'),
               arg_max(completed, t) FILTER (WHERE kind = '{k.FINISH}'),
               max(t) FILTER (WHERE kind = '{k.FINISH}'),
               arg_max(reason, t) FILTER (WHERE kind = '{k.FINISH}'),
               arg_max(exception, t) FILTER (WHERE kind = '{k.FINISH}'),
               count(*) FILTER (WHERE kind = '{k.EVENT}' AND lower(name) LIKE '%preempt%'),
               count(*),
               max(mono) FILTER (WHERE kind = '{k.HEARTBEAT}')
        FROM {source} WHERE kind IS NOT NULL GROUP BY sid
        """
    )
    # Executions: the recorder numbers them (seq); older files are numbered by entry order.
    con.execute(
        f"""
        INSERT INTO m_steps SELECT sid, coalesce(seq, row_number() OVER (PARTITION BY sid ORDER BY t0) - 1),
               step, t0, greatest(t0, t1)
        FROM {source} WHERE kind = '{k.STEP}' AND step IS NOT NULL AND t0 IS NOT NULL AND t1 IS NOT NULL
        """
    )
    con.execute(
        f"""
        INSERT INTO m_syncs SELECT sid, coalesce(seq, -1), step, t, coalesce(how, ''), after
        FROM {source} WHERE kind = '{k.SYNC}' AND step IS NOT NULL AND t IS NOT NULL
        """
    )
    con.execute(
        f"""
        INSERT INTO m_spans SELECT b.sid, b.cat, b.t0, b.t1, b.step
        FROM {source} b JOIN sessmain m USING (sid)
        WHERE b.kind = '{k.SPAN}' AND b.cat IS NOT NULL AND b.cat <> '{k.COMPUTE}' AND b.t0 IS NOT NULL
          AND b.t1 > b.t0 AND {_MAIN}
        """
    )
    # Outermost main-thread compute time per execution: a span nested in an earlier one adds
    # nothing, a partial overlap adds its uncovered tail; each part belongs to the execution of
    # its step (the span's ambient step) entered last before it began (without a step: to the
    # execution entered last); a part of a step that never finished belongs to none.
    con.execute(
        f"""
        INSERT INTO m_compute
        WITH c AS (
            SELECT b.sid, b.t0, b.t1, b.step,
                   max(b.t1) OVER (PARTITION BY b.sid ORDER BY b.t0, b.t1 DESC
                                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
            FROM {source} b JOIN sessmain m USING (sid)
            WHERE b.kind = '{k.SPAN}' AND b.cat = '{k.COMPUTE}' AND b.t0 IS NOT NULL AND b.t1 > b.t0 AND {_MAIN}),
        o AS (SELECT sid, step, greatest(t0, coalesce(reach, t0)) AS a, t1 AS z FROM c
              WHERE reach IS NULL OR t1 > reach),
        e AS (SELECT sid, step, coalesce(seq, row_number() OVER (PARTITION BY sid ORDER BY t0) - 1) AS seq, t0
              FROM {source} WHERE kind = '{k.STEP}' AND step IS NOT NULL AND t0 IS NOT NULL AND t1 IS NOT NULL)
        SELECT o.sid, e.seq, sum(o.z - o.a) FROM o ASOF JOIN e ON o.sid = e.sid AND o.step = e.step AND o.a >= e.t0
        WHERE o.step IS NOT NULL GROUP BY ALL
        UNION ALL
        SELECT o.sid, e.seq, sum(o.z - o.a) FROM o ASOF JOIN e ON o.sid = e.sid AND o.a >= e.t0
        WHERE o.step IS NULL GROUP BY ALL
        """
    )
    con.execute(
        f"""
        INSERT INTO m_device SELECT sid, name, step, value FROM {source}
        WHERE kind = '{k.METRIC}' AND name IN ({_DEVICE_METRICS}) AND step IS NOT NULL AND value IS NOT NULL
        """
    )
    con.execute(
        f"""
        INSERT INTO m_clock SELECT sid, t, offset_ns, coalesce(rtt_ns, 0) FROM {source}
        WHERE kind = '{k.CLOCK}' AND t IS NOT NULL AND offset_ns IS NOT NULL
        """
    )
    con.execute(
        f"""
        INSERT INTO m_starts
        WITH r AS (SELECT sid, min(step) AS lo, max(step) AS hi FROM {source}
                   WHERE kind = '{k.STEP}' AND step IS NOT NULL GROUP BY sid)
        SELECT b.sid, b.step, b.name, min(b.t0)
        FROM {source} b JOIN sessmain m USING (sid) JOIN r USING (sid)
        WHERE b.kind = '{k.SPAN}' AND b.step IS NOT NULL AND b.name IS NOT NULL AND b.t0 IS NOT NULL
          AND (b.step - r.lo) % greatest(1, (r.hi - r.lo) // {SAMPLE_STEPS}) = 0 AND {_MAIN}
        GROUP BY ALL
        """
    )
    con.execute(
        f"""
        INSERT INTO m_events SELECT sid, coalesce(name, '?'), t, step FROM {source}
        WHERE kind = '{k.EVENT}' AND t IS NOT NULL
        """
    )
    con.execute(
        f"""
        INSERT INTO m_model SELECT sid, name, value,
               CASE WHEN kind = '{k.EVENT}' AND length(CAST(attrs AS VARCHAR)) <= {_MAX_EVENT_ATTRS}
                    THEN CAST(attrs AS VARCHAR) END, t
        FROM {source}
        WHERE (kind = '{k.METRIC}' AND name IN ('flops_per_step', 'model_flops_per_step', 'tokens_per_step'))
           OR (kind = '{k.EVENT}' AND name = 'model')
        """
    )


def fold_json(
    con: Any, files_by_sid: dict[int, list[str]], progress: Progress | None, done: int, total: int,
    skips: FileSkips,
) -> int:
    """Parse the JSON files, whole sessions of about 32 files at a time: each batch is parsed
    once into a table (every line, with why it is no valid record) that the extraction queries
    then read for its valid records. Skipped lines are counted in ``skips``; a file read from a
    copy without its long lines is replaced by the copy in ``files_by_sid``."""
    batches: list[list[tuple[str, int, int]]] = [[]]
    fid = 0
    for sid in sorted(files_by_sid):
        if batches[-1] and len(batches[-1]) + len(files_by_sid[sid]) > 32:
            batches.append([])
        for p in files_by_sid[sid]:
            batches[-1].append((p, sid, fid))
            fid += 1
    names = ", ".join(f"r.{name}" for name in _COLUMNS)
    for batch in batches:
        if not batch:
            continue
        read = _read_batch(
            con, batch,
            f"CREATE OR REPLACE TEMP TABLE batch AS SELECT f.sid, f.fid, {names}, "
            f"CASE WHEN r.kind = '{schema.EVENT}' THEN r.attrs END AS attrs FROM {{source}}", skips,
        )
        for (path, sid, _), (copy, _, _) in zip(batch, read, strict=True):
            if copy != path:
                files_by_sid[sid][files_by_sid[sid].index(path)] = copy
        # The lines that are no valid record (a few), checked once the batch is a table (the
        # check inside the JSON scan slowed the scan), counted, then deleted from the batch.
        con.execute(f"CREATE OR REPLACE TEMP TABLE batch_bad AS SELECT * FROM (SELECT rowid AS row, fid, {INVALID} "
                    "AS bad FROM batch) WHERE bad IS NOT NULL")
        count_skips(con, "batch_bad", [(p, f) for p, _, f in read], skips)
        con.execute("DELETE FROM batch WHERE rowid IN (SELECT row FROM batch_bad)")
        _extract(con, "batch")
        con.execute("DROP TABLE batch_bad")
        con.execute("DROP TABLE batch")
        done += len(batch)
        if progress is not None:
            progress("reading rank files", done, total)
    return done


def fold_parquet(con: Any) -> None:
    """The compacted copy (``parquet_records``, sessions mapped through ``foldmap``): its valid
    records (the lines it holds that are none were counted when it was written)."""
    con.execute(
        "CREATE OR REPLACE TEMP VIEW parquet_sid AS SELECT m.sid, p.* EXCLUDE (fid, bad) "
        "FROM parquet_records p JOIN foldmap m USING (fid) WHERE p.bad IS NULL"
    )
    _extract(con, "parquet_sid")


def write_run_model(con: Any, records: str, out_dir: str, tag: str) -> dict[str, str]:
    """``goodtrace compact``: extract the run model from ``records`` (a table of valid records
    with a ``sid`` column: the compacted copy's session numbers, ``sessmain`` filled) and store
    each of its tables as ``out_dir/model-<tag>-<table>.parquet``; returns table -> file name."""
    for statement in _RUN_MODEL_TABLES:
        con.execute(statement)
    _extract(con, records)
    names = {}
    for table in RUN_MODEL_NAMES:
        names[table] = f"model-{tag}-{table}.parquet"
        con.execute(
            f"COPY (SELECT * FROM {table} ORDER BY sid) TO {sql_str(os.path.join(out_dir, names[table]))} "
            "(FORMAT parquet, COMPRESSION zstd)"
        )
    return names


def read_run_model(con: Any, out_dir: str, names: dict[str, str]) -> None:
    """The stored run model of the sessions in ``csidmap`` (stored number -> this load's) into
    the model tables, as if extracted here."""
    for table in RUN_MODEL_NAMES:
        path = sql_str(os.path.join(out_dir, names[table]))
        con.execute(
            f"INSERT INTO {table} SELECT c.sid, p.* EXCLUDE (sid) FROM read_parquet({path}) p "
            "JOIN csidmap c ON p.sid = c.csid"
        )


def session_summaries(con: Any) -> dict[int, dict[str, Any]]:
    """Per session, its figures over all its files (a session read in parts is combined)."""
    rows = con.execute(
        """
        SELECT sid, max(last_seen), max(dropped), min(first_step), max(last_step), sum(step_count),
               sum(sync_count), sum(has_finish), arg_max(finish_completed, finish_t), max(finish_t),
               arg_max(finish_reason, finish_t), arg_max(finish_exception, finish_t), sum(preempt_events),
               sum(records), max(heartbeat)
        FROM summ GROUP BY sid
        """
    ).fetchall()
    keys = ("last_seen", "dropped", "first_step", "last_step", "step_count", "sync_count", "has_finish",
            "finish_completed", "finish_t", "finish_reason", "finish_exception", "preempt_events", "records",
            "heartbeat")
    return {int(row[0]): dict(zip(keys, row[1:], strict=True)) for row in rows}


_STRINGS: dict[str, str] = {}


def _interned(value: object) -> str:
    """One string object per distinct category or how (millions of them otherwise)."""
    text = str(value)
    return _STRINGS.setdefault(text, text) if len(_STRINGS) < 10_000 else text


def _by_session(con: Any, sql: str) -> Iterable[tuple[int, dict[str, Any]]]:
    """``(sid, {column: numpy array})`` per session of a query ordered by sid (its first
    column): the columns come out of DuckDB as arrays in one go, then are cut per session."""
    import numpy as np

    columns = con.execute(sql).fetchnumpy()
    sid = columns.pop("sid")
    if len(sid) == 0:
        return
    cuts = np.flatnonzero(np.diff(sid)) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [len(sid)]))
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        yield int(sid[a]), {name: values[a:b] for name, values in columns.items()}


def _ints(values: Any) -> array[int]:
    """A numpy integer column (masked where NULL) as an array of int64, NULL as NO_TIME."""
    import numpy as np

    filled = values.filled(NO_TIME) if isinstance(values, np.ma.MaskedArray) else values
    return array("q", np.asarray(filled, dtype=np.int64).tobytes())


SESSION_BATCH = 1024  # sessions whose model rows are fetched together (bounds the columns in flight)


def _vocab(con: Any, table: str, column: str) -> Any:
    """The distinct strings of a low-cardinality ``column`` (categories, how a sync was taken,
    span names) as one shared Python object each, numbered in table ``vocab_<column>``: queries
    join it and hand out codes, millions of integers instead of millions of strings."""
    import numpy as np

    values = [row[0] for row in con.execute(f"SELECT DISTINCT {column} FROM {table}").fetchall()]
    vocab = np.empty(len(values), dtype=object)
    vocab[:] = [_interned(v) for v in values]
    con.execute(f"CREATE OR REPLACE TEMP TABLE vocab_{column} ({column} VARCHAR, code INTEGER)")
    insert_rows(con, f"vocab_{column}", [(v, i) for i, v in enumerate(values)])
    return vocab


def _sid_ranges(sids: Sequence[int], size: int) -> Iterable[tuple[int, int]]:
    for i in range(0, len(sids), size):
        yield sids[i], sids[min(i + size, len(sids)) - 1]


def session_records(con: Any, sids: Iterable[int]) -> dict[int, SessionRecords]:
    """Every session's :class:`SessionRecords`, as compact columns, fetched for
    :data:`SESSION_BATCH` sessions at a time."""
    out = {sid: SessionRecords() for sid in sids}
    how, cat, name = _vocab(con, "m_syncs", "how"), _vocab(con, "m_spans", "cat"), _vocab(con, "m_starts", "name")
    for lo, hi in _sid_ranges(sorted(out), SESSION_BATCH):
        where = f"sid BETWEEN {int(lo)} AND {int(hi)}"
        for sid, c in _by_session(con, f"SELECT sid, seq, step, t0, t1 FROM m_steps WHERE {where} ORDER BY sid, seq, t0"):
            r = out[sid]
            r.step_seq, r.step_number, r.step_t0, r.step_t1 = _ints(c["seq"]), _ints(c["step"]), _ints(c["t0"]), _ints(c["t1"])
        for sid, c in _by_session(
            con, f"SELECT t.sid, t.seq, t.step, t.t, t.after, v.code AS how FROM m_syncs t JOIN vocab_how v "
                 f"ON t.how IS NOT DISTINCT FROM v.how WHERE t.{where} ORDER BY t.sid, t.t, t.seq"
        ):
            r = out[sid]
            r.sync_seq, r.sync_step, r.sync_t, r.sync_after = _ints(c["seq"]), _ints(c["step"]), _ints(c["t"]), _ints(c["after"])
            r.sync_how = how[c["how"]].tolist()
        for sid, c in _by_session(
            con, f"SELECT t.sid, v.code AS cat, t.t0, t.t1, t.step FROM m_spans t JOIN vocab_cat v "
                 f"ON t.cat IS NOT DISTINCT FROM v.cat WHERE t.{where} ORDER BY t.sid, t.t0, t.t1 DESC"
        ):
            r = out[sid]
            r.span_category = cat[c["cat"]].tolist()
            r.span_t0, r.span_t1, r.span_step = _ints(c["t0"]), _ints(c["t1"]), _ints(c["step"])
        for sid, c in _by_session(
            con, f"SELECT sid, seq, sum(ns)::BIGINT AS ns FROM m_compute WHERE {where} GROUP BY ALL ORDER BY sid"
        ):
            out[sid].compute_seq, out[sid].compute_ns = _ints(c["seq"]), _ints(c["ns"])
        for sid, c in _by_session(
            con, f"SELECT t.sid, t.step, v.code AS name, t.t0 FROM (SELECT sid, step, name, min(t0) AS t0 "
                 f"FROM m_starts WHERE {where} GROUP BY ALL) t JOIN vocab_name v ON t.name IS NOT DISTINCT FROM v.name "
                 "ORDER BY t.sid, t.step, t.name"
        ):
            r = out[sid]
            r.starts_step, r.starts_name, r.starts_t0 = _ints(c["step"]), name[c["name"]].tolist(), _ints(c["t0"])
    for sid, name_, step, value in con.execute("SELECT sid, name, step, last(value) FROM m_device GROUP BY ALL").fetchall():
        out[sid].device.setdefault(str(name_), {})[int(step)] = float(value)
    for sid, t, offset, rtt in con.execute("SELECT sid, t, offset_ns, rtt_ns FROM m_clock ORDER BY sid, t").fetchall():
        out[sid].clock.append((int(t), int(offset), int(rtt)))
    for sid, name_, t, step in con.execute("SELECT sid, name, t, step FROM m_events ORDER BY sid, t").fetchall():
        out[sid].events.append((str(name_), int(t), None if step is None else int(step)))
    return out


def model_figures(con: Any) -> dict[int, dict[str, Any]]:
    """Per session, what the framework integration recorded about the model: its latest
    ``flops_per_step``/``tokens_per_step`` metrics and ``model`` event attributes."""
    out: dict[int, dict[str, Any]] = {}
    for sid, name, value, attrs in con.execute(
        "SELECT sid, name, arg_max(value, t), arg_max(attrs, t) FROM m_model GROUP BY sid, name"
    ).fetchall():
        entry = out.setdefault(int(sid), {})
        if name == "model":
            entry["model"] = _json_object(attrs)
        elif value is not None:
            entry[str(name)] = float(value)
    return out


# ---------------------------------------------------------------------------------- full timelines
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
    columns = "kind, name, cat, t0, t1, t, step, tid, err, how, value, reduce, attrs"
    create_records_table(con, "records_none")
    parts = [f"SELECT sid, {columns} FROM records_none WHERE false"]
    paths = [f for s in wanted for f in json_files.get(s, [])]
    if paths:
        con.execute("DELETE FROM files_batch")
        insert_rows(con, "files_batch", [(p, s, 0) for s in wanted for p in json_files.get(s, [])])
        parts = [
            f"SELECT f.sid, {', '.join('r.' + c.strip() for c in columns.split(','))} FROM {read_json_sql(paths)} r "
            f"JOIN files_batch f ON r.filename = f.path WHERE {VALID_JSON}"
        ]
    fids = [f for s in wanted for f in parquet_fids.get(s, [])]
    if fids:
        fid_list = ", ".join(str(f) for f in sorted(fids))
        parts.append(
            f"SELECT m.sid, {', '.join('p.' + c.strip() for c in columns.split(','))} FROM parquet_records p "
            f"JOIN fidmap m ON p.fid = m.fid WHERE p.fid IN ({fid_list}) AND p.bad IS NULL"
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
        f"SELECT sid, coalesce(name, '?'), t, step, CASE WHEN length(CAST(attrs AS VARCHAR)) <= {_MAX_EVENT_ATTRS} "
        f"THEN CAST(attrs AS VARCHAR) END FROM detail WHERE kind = '{schema.EVENT}' AND t IS NOT NULL ORDER BY sid, t"
    )
    metrics = grouped(
        f"SELECT sid, coalesce(name, '?'), step, value, coalesce(reduce, 'mean') FROM detail "
        f"WHERE kind = '{schema.METRIC}' ORDER BY sid, t"
    )
    for sid, tl in timelines.items():
        tl.spans = spans.get(sid, [])
        tl.steps = steps.get(sid, [])
        tl.syncs = syncs.get(sid, [])
        tl.tags = tags.get(sid, [])
        tl.events = [(n, t, s, _json_object(a) or None) for n, t, s, a in events.get(sid, [])]
        tl.metrics = metrics.get(sid, [])
        models = [attrs for name, _, _, attrs in tl.events if name == "model" and attrs]
        tl.model = models[-1] if models else {}
    con.execute("DROP TABLE detail")
    con.execute("DROP TABLE records_none")
    return timelines


def _json_object(text: object) -> dict[str, Any]:
    return json_object(text) or {}
