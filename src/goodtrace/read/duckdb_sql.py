"""The DuckDB side of the analytical reader: record files -> per-session columns in SQL.

DuckDB parses every rank's JSON-lines segments (a batch of whole sessions at a time,
materialised once and queried several times: :mod:`goodtrace.read.fold_batches` decides the
batches) or reads the compacted Parquet copy, and keeps
only what the run model needs of every segment file (:func:`extract_segments`: what the
segment cache keeps of a closed one), from which :func:`finish_model` makes each session's:
a summary (last sign of life, finish, counts), step and sync records, main-thread overhead
spans, the outermost compute time of each execution, device metrics, clock samples, a sample
of span starts and events. Memory stays bounded for any number of ranks and steps.

Every line is checked where it enters (:func:`goodtrace.read.validate.invalid_sql`: a line
that is not a record reads as a row whose kind is NULL): only valid records reach the run
model, and the others are counted per file by reason (:class:`FileSkips`). A line longer than
DuckDB's read buffer makes it refuse the whole batch; its files are then read from copies
without those lines (:mod:`goodtrace.read.file_skips`), which are counted too.

The connections too (:func:`connect`): how one is opened (in memory or in a database file,
its spill directory and memory limits), how its memory is handed back once the run model is
extracted and after each block of sessions is fetched (:func:`settle`), and the few statements
every reader module runs (many rows in one insert, a quoted string, a list of statements).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from goodtrace import schema
from goodtrace.read.discovery import torn_tail
from goodtrace.read.file_skips import FileSkips
from goodtrace.read.loaded import SAMPLE_STEPS as SAMPLE_STEPS
from goodtrace.read.loaded import Progress, sample_stride
from goodtrace.read.validate import MAX_LINE_BYTES, invalid_sql

__all__ = []

# Columns read from every record line. Fields a record kind does not have are NULL.
RECORD_COLUMNS: dict[str, str] = {
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
MAX_EVENT_ATTRS = 4096  # event attributes longer than this (as JSON text) are not kept
_DEVICE_METRICS = ", ".join(f"'{m}'" for m in schema.DEVICE_METRICS)


def read_json_sql(paths: Sequence[str]) -> str:
    columns = "{" + ", ".join(f"'{k}': '{v}'" for k, v in (*RECORD_COLUMNS.items(), (schema.F_ATTRS, "JSON"))) + "}"
    files = "[" + ", ".join(sql_str(p) for p in paths) + "]"
    return (
        f"read_json({files}, columns={columns}, format='newline_delimited', ignore_errors=true, "
        f"filename=true, maximum_object_size={DUCKDB_OBJECT_BYTES})"
    )


# DuckDB reads lines through a buffer twice this size and refuses a batch of files with a line
# that does not fit (~32 MiB, validate.MAX_LINE_BYTES); those files are read from copies without
# the lines longer than file_skips.SHORTEN_TO (a little under it, so that the retry always fits).
DUCKDB_OBJECT_BYTES = MAX_LINE_BYTES // 2

# Valid records of a relation of read_json rows (``r.``) / of a table with a ``bad`` column.
VALID_JSON = f"({invalid_sql('r.')}) IS NULL"
INVALID = f"({invalid_sql()})"


def _is_too_long(exc: Exception) -> bool:
    return "maximum_object_size" in str(exc)


def create_records_table(con: Any, table: str = "records") -> None:
    """Every line of some files: ``sid`` (or a file id), the record columns, the attributes of
    events, and ``bad``: why the line is no valid record (NULL for a valid one)."""
    cols = ", ".join(f"{name} {kind}" for name, kind in RECORD_COLUMNS.items())
    con.execute(f"CREATE TABLE {table} (sid INTEGER, {cols}, attrs VARCHAR, bad VARCHAR)")


R = TypeVar("R", bound=tuple[Any, ...])


def read_batch(con: Any, rows: list[R], sql: str, skips: FileSkips) -> list[R]:
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
    names = ", ".join(f"r.{name}" for name in RECORD_COLUMNS)
    read: list[tuple[str, int]] = []
    for start in range(0, len(paths), batch):
        chunk = [(p, fid_of_file[p]) for p in paths[start:start + batch]]
        read += read_batch(
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
    "CREATE TEMP TABLE foldmap (fid INTEGER, sid INTEGER, lfid INTEGER)",  # compacted-copy files to extract from
    "CREATE TEMP TABLE sessmain (sid INTEGER, main_tid UBIGINT)",
)
# The fold's map: what the run model needs of every *segment file* (``fid``: the file's number
# in this load), row by row or as partials that merge across a session's files. They are
# what the segment cache (goodtrace.read.segment_cache) keeps of a closed segment, and what a
# task of the engine returns; :func:`finish_model` turns them into the run model's tables.
_SEGMENT_TABLES = (
    "CREATE TABLE seg_summ (sid INTEGER, fid INTEGER, last_seen BIGINT, dropped BIGINT, first_step BIGINT, "
    "last_step BIGINT, step_count BIGINT, sync_count BIGINT, has_finish BIGINT, finish_completed BOOLEAN, "
    "finish_t BIGINT, finish_reason VARCHAR, finish_exception VARCHAR, preempt_events BIGINT, records BIGINT, "
    "heartbeat BIGINT, first_t BIGINT, first_mark_step BIGINT, last_mark_step BIGINT)",
    "CREATE TABLE seg_steps (sid INTEGER, fid INTEGER, seq BIGINT, step BIGINT, t0 BIGINT, t1 BIGINT)",
    "CREATE TABLE seg_syncs (sid INTEGER, fid INTEGER, seq BIGINT, step BIGINT, t BIGINT, how VARCHAR, after BIGINT)",
    "CREATE TABLE seg_spans (sid INTEGER, fid INTEGER, cat VARCHAR, t0 BIGINT, t1 BIGINT, step BIGINT)",
    "CREATE TABLE seg_compute (sid INTEGER, fid INTEGER, t0 BIGINT, t1 BIGINT, step BIGINT)",
    "CREATE TABLE seg_device (sid INTEGER, fid INTEGER, name VARCHAR, step BIGINT, value DOUBLE, t BIGINT)",
    "CREATE TABLE seg_clock (sid INTEGER, fid INTEGER, t BIGINT, offset_ns BIGINT, rtt_ns BIGINT)",
    "CREATE TABLE seg_starts (sid INTEGER, fid INTEGER, step BIGINT, name VARCHAR, t0 BIGINT)",
    "CREATE TABLE seg_events (sid INTEGER, fid INTEGER, name VARCHAR, t BIGINT, step BIGINT)",
    "CREATE TABLE seg_model (sid INTEGER, fid INTEGER, name VARCHAR, value DOUBLE, attrs VARCHAR, t BIGINT)",
)
SEGMENT_NAMES = tuple(statement.split()[2] for statement in _SEGMENT_TABLES)


def create_segment_tables(con: Any) -> None:
    execute_all(con, _SEGMENT_TABLES)


MODEL_TABLES = _SCRATCH_TABLES + _SEGMENT_TABLES


def _sources_digest(*names: str) -> str:
    """A digest of the source files that decide what a segment is reduced to: a cache written by
    other code (another release, a patched install) is never mistaken for this code's, whether or
    not somebody remembered to bump a number."""
    here = os.path.dirname(os.path.abspath(__file__))
    digest = hashlib.sha256()
    for name in names:
        try:
            with open(os.path.join(here, name), "rb") as handle:
                digest.update(handle.read())
        except OSError:  # no sources installed (a frozen build): the number alone keys it
            digest.update(name.encode())
    return digest.hexdigest()[:16]


# A cached segment of another version is not used (its file is read again): the number is bumped
# when the segment tables change, and the digest changes with any change of the code that fills
# them (this module, the line checks, the record format, the cache itself).
RUN_MODEL_VERSION = f"2-{_sources_digest('duckdb_sql.py', 'fold_batches.py', 'validate.py', 'segment_cache.py', 'chunk_files.py', '../schema.py')}"

_MAIN = "(m.main_tid IS NULL OR b.tid IS NULL OR b.tid = m.main_tid)"


# A file's first_t where none of its records has a time (first_t: the earliest time of its
# records; with last_seen, the clock range a view of a few steps reads the file for, and with
# first_mark_step and last_mark_step, the steps of its tags, events and metrics: raw)
NO_FIRST_T = 2**62
# a mark's step in first_mark_step / last_mark_step: a device metric without a step counts as
# any step (a view that reads a file for the marks of its steps takes it from every file)
_ANY_STEP = (f"CASE WHEN kind = '{schema.METRIC}' AND name IN ("
             + ", ".join(f"'{name}'" for name in schema.DEVICE_METRICS) + ") THEN {} END")


def extract_segments(con: Any, source: str) -> None:
    """What the run model needs of the records in ``source`` (a relation of valid records with
    ``sid`` and ``fid`` columns), per segment file, into the ``seg_*`` tables. Nothing here
    depends on another file of the session (but its main thread, from its header): a file's
    rows are the same whichever files share its batch, and can be kept once it is closed."""
    k = schema
    con.execute(
        f"""
        INSERT INTO seg_summ SELECT sid, fid,
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
               max(mono) FILTER (WHERE kind = '{k.HEARTBEAT}'),
               min(least(coalesce(t, {NO_FIRST_T}), coalesce(t0, {NO_FIRST_T}), coalesce(mono, {NO_FIRST_T}))),
               min(coalesce(step, {_ANY_STEP.format(-NO_FIRST_T)})) FILTER (WHERE kind IN ('{k.TAG}', '{k.EVENT}', '{k.METRIC}')),
               max(coalesce(step, {_ANY_STEP.format(NO_FIRST_T)})) FILTER (WHERE kind IN ('{k.TAG}', '{k.EVENT}', '{k.METRIC}'))
        FROM {source} WHERE kind IS NOT NULL GROUP BY sid, fid
        """
    )
    # Executions as recorded; finish_model numbers those of older files (no seq) by entry order.
    con.execute(
        f"""
        INSERT INTO seg_steps SELECT sid, fid, seq, step, t0, greatest(t0, t1)
        FROM {source} WHERE kind = '{k.STEP}' AND step IS NOT NULL AND t0 IS NOT NULL AND t1 IS NOT NULL
        """
    )
    con.execute(
        f"""
        INSERT INTO seg_syncs SELECT sid, fid, coalesce(seq, -1), step, t, coalesce(how, ''), after
        FROM {source} WHERE kind = '{k.SYNC}' AND step IS NOT NULL AND t IS NOT NULL
        """
    )
    con.execute(
        f"""
        INSERT INTO seg_spans SELECT b.sid, b.fid, b.cat, b.t0, b.t1, b.step
        FROM {source} b JOIN sessmain m USING (sid)
        WHERE b.kind = '{k.SPAN}' AND b.cat IS NOT NULL AND b.cat <> '{k.COMPUTE}' AND b.t0 IS NOT NULL
          AND b.t1 > b.t0 AND {_MAIN}
        """
    )
    # Main-thread compute spans as they are: which part of one is outermost depends on the
    # spans of the whole session (an outer span is written when it ends, maybe in a later file).
    con.execute(
        f"""
        INSERT INTO seg_compute SELECT b.sid, b.fid, b.t0, b.t1, b.step
        FROM {source} b JOIN sessmain m USING (sid)
        WHERE b.kind = '{k.SPAN}' AND b.cat = '{k.COMPUTE}' AND b.t0 IS NOT NULL AND b.t1 > b.t0 AND {_MAIN}
        """
    )
    con.execute(
        f"""
        INSERT INTO seg_device SELECT sid, fid, name, step, value, t FROM {source}
        WHERE kind = '{k.METRIC}' AND name IN ({_DEVICE_METRICS}) AND step IS NOT NULL AND value IS NOT NULL
        """
    )
    con.execute(
        f"""
        INSERT INTO seg_clock SELECT sid, fid, t, offset_ns, coalesce(rtt_ns, 0) FROM {source}
        WHERE kind = '{k.CLOCK}' AND t IS NOT NULL AND offset_ns IS NOT NULL
        """
    )
    # The first start of each span name in each step (finish_model samples the steps: the
    # sample depends on the session's step range)
    con.execute(
        f"""
        INSERT INTO seg_starts SELECT b.sid, b.fid, b.step, b.name, min(b.t0)
        FROM {source} b JOIN sessmain m USING (sid)
        WHERE b.kind = '{k.SPAN}' AND b.step IS NOT NULL AND b.name IS NOT NULL AND b.t0 IS NOT NULL AND {_MAIN}
        GROUP BY ALL
        """
    )
    con.execute(
        f"""
        INSERT INTO seg_events SELECT sid, fid, coalesce(name, '?'), t, step FROM {source}
        WHERE kind = '{k.EVENT}' AND t IS NOT NULL
        """
    )
    con.execute(
        f"""
        INSERT INTO seg_model SELECT sid, fid, name, value,
               CASE WHEN kind = '{k.EVENT}' AND length(CAST(attrs AS VARCHAR)) <= {MAX_EVENT_ATTRS}
                    THEN CAST(attrs AS VARCHAR) END, t
        FROM {source}
        WHERE (kind = '{k.METRIC}' AND name IN ('flops_per_step', 'model_flops_per_step', 'tokens_per_step'))
           OR (kind = '{k.EVENT}' AND name = 'model')
        """
    )


# The span starts finish_model keeps (the sample of each session's step range: the multiples
# of its stride, loaded.sample_stride, which hold the sample the analysis takes of the
# session's attempt, goodtrace.analysis.ranks), as a filter of
# rows ``p`` of seg_starts with their session in ``m``: the cache reads only those of a closed
# segment, once every file's summary is in seg_summ (and :func:`sample_ranges` has listed each
# session's range and stride in ``sample_r``).
def _in_sample(step: str) -> str:
    """Whether ``step`` (a column) is one of the sampled steps of its session's executed range
    ``r.lo`` to ``r.hi``: a multiple of the range's stride ``r.stride``."""
    return f"{step} BETWEEN r.lo AND r.hi AND {step} % r.stride = 0"


SAMPLED_STARTS = f"JOIN sample_r r ON r.sid = m.sid WHERE {_in_sample('p.step')}"


def sample_ranges(con: Any) -> list[tuple[int, int, int]]:
    """Each session's step range in seg_summ and its sample's stride (:func:`sample_stride`,
    the one rule: computed here, not again in SQL), as the table ``sample_r`` (sid, lo, hi,
    stride); returns its (lo, hi, stride) rows."""
    rows = [(int(sid), int(lo), int(hi), sample_stride(int(lo), int(hi))) for sid, lo, hi in con.execute(
        "SELECT sid, min(first_step), max(last_step) FROM seg_summ GROUP BY sid HAVING min(first_step) IS NOT NULL"
    ).fetchall()]
    con.execute("CREATE OR REPLACE TABLE sample_r (sid INTEGER, lo BIGINT, hi BIGINT, stride BIGINT)")
    insert_rows(con, "sample_r", rows)
    return [row[1:] for row in rows]


PRUNE_STEPS = 4_096  # sampled steps listed for the Parquet reader to skip the row groups without them


def sampled_starts(con: Any) -> str:
    """:data:`SAMPLED_STARTS` (its ``sample_r`` made now, :func:`sample_ranges`), with the
    sampled steps of every session listed too (where they are few; the same steps: the rule
    keeps none outside a session's range): a filter on the Parquet column itself, with which
    DuckDB skips the row groups that hold none of them (a closed file's span starts are a few
    rows a step, the sample about :data:`SAMPLE_STEPS` steps of a session's run: most of them,
    read and dropped before)."""
    steps: set[int] = set()
    for lo, hi, stride in sample_ranges(con):
        steps.update(range(lo + (-lo) % stride, hi + 1, stride))
        if len(steps) > PRUNE_STEPS:
            return SAMPLED_STARTS
    return f"{SAMPLED_STARTS} AND p.step IN ({', '.join(str(s) for s in sorted(steps))})" if steps else SAMPLED_STARTS


def delete_files(con: Any, fids: Iterable[int]) -> None:
    """Every row of some files from the segment tables."""
    listed = ", ".join(str(int(fid)) for fid in fids)
    if listed:
        for table in SEGMENT_NAMES:
            con.execute(f"DELETE FROM {table} WHERE fid IN ({listed})")


def finish_model(con: Any) -> None:
    """The run model's tables from the segment tables (every file of every session folded,
    read from the cache or from the compacted copy): views over the row-wise ones, and the
    two parts that need a whole session computed here. (The third, each execution's outermost
    compute, is computed in numpy per session from ``seg_compute`` and the executions:
    :func:`goodtrace.read.model_fetch.fill_compute`.)"""
    for table, segment in (("summ", "seg_summ"), ("m_syncs", "seg_syncs"), ("m_spans", "seg_spans"),
                           ("m_device", "seg_device"), ("m_clock", "seg_clock"), ("m_events", "seg_events"),
                           ("m_model", "seg_model")):
        con.execute(f"CREATE OR REPLACE VIEW {table} AS SELECT * FROM {segment}")
    # Executions: the recorder numbers them (seq); older files are numbered by entry order.
    if con.execute("SELECT count(*) = count(seq) FROM seg_steps").fetchone()[0]:
        con.execute("CREATE OR REPLACE VIEW m_steps AS SELECT * FROM seg_steps")
    else:
        con.execute(
            "CREATE OR REPLACE TABLE m_steps AS SELECT sid, fid, "
            "coalesce(seq, row_number() OVER (PARTITION BY sid ORDER BY t0, t1, step) - 1) AS seq, step, t0, t1 FROM seg_steps"
        )
        con.execute("DROP TABLE seg_steps")
    # Span starts of about SAMPLE_STEPS steps of each session's step range (of its executed
    # steps: a start of another step has no entry to be late against, and is not kept)
    sample_ranges(con)
    con.execute(
        f"""
        CREATE OR REPLACE TABLE m_starts AS
        SELECT s.sid, s.step, s.name, min(s.t0) AS t0 FROM seg_starts s JOIN sample_r r USING (sid)
        WHERE {_in_sample('s.step')}
        GROUP BY ALL
        """
    )
    con.execute("DROP TABLE seg_starts")
    con.execute("DROP TABLE sample_r")


def fold_parquet(con: Any) -> None:
    """The compacted copy (``parquet_records``, its files mapped through ``foldmap`` to this
    load's sessions and file numbers): its valid records (the lines it holds that are none were
    counted when it was written) into the segment tables."""
    con.execute(
        "CREATE OR REPLACE TEMP VIEW parquet_sid AS SELECT m.sid, m.lfid AS fid, p.* EXCLUDE (fid, bad) "
        "FROM parquet_records p JOIN foldmap m USING (fid) WHERE p.bad IS NULL"
    )
    extract_segments(con, "parquet_sid")


def insert_rows(con: Any, table: str, rows: Sequence[Sequence[Any]]) -> None:
    """Insert many rows in one statement (``executemany`` runs one statement per row)."""
    if not rows:
        return
    columns = list(zip(*rows, strict=True))
    select = ", ".join(f"unnest(${i + 1}) AS c{i}" for i in range(len(columns)))
    con.execute(f"INSERT INTO {table} SELECT {select}", [list(c) for c in columns])


def sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def execute_all(con: Any, statements: Iterable[str]) -> None:
    """Run each statement (``CREATE TABLE`` lists)."""
    for statement in statements:
        con.execute(statement)


# DuckDB's memory while it parses and reduces the records (it spills beyond it to the load's
# temporary directory), and once the run model is extracted.
FOLD_MEMORY = "256MB"
FETCH_MEMORY = "64MB"


def connect(tmpdir: str, *, in_memory: bool = False) -> Any:
    """A connection whose database lives in ``tmpdir`` (``in_memory``: only what exceeds the
    memory limit goes there: a worker's, whose tables are small and never checkpointed, and
    the analytical reader's where its run model is small: ``load.IN_MEMORY_BYTES``)."""
    import duckdb

    con = duckdb.connect(":memory:" if in_memory else os.path.join(tmpdir, "run.duckdb"))
    con.execute(f"SET temp_directory={sql_str(os.path.join(tmpdir, 'spill'))}")
    con.execute(f"SET memory_limit='{FOLD_MEMORY}'")
    con.execute("SET preserve_insertion_order=false")
    # DuckDB draws a progress bar on stdout (even when it is a pipe or a file) for a query of
    # more than 2 s: it would land in report --json's output, or in a pool worker's results
    con.execute("SET enable_progress_bar=false")
    return con


def is_in_memory(con: Any) -> bool:
    """Whether ``con``'s database is in memory (no database file)."""
    return con.execute("SELECT path IS NULL FROM duckdb_databases() WHERE database_name = current_database()"
                       ).fetchone()[0] is True


def settle(con: Any) -> None:
    """After the extraction: the run model's tables written to the database file (in memory:
    what exceeds the new limit goes to the spill directory) and DuckDB's memory cut to what
    fetching a block of sessions needs, so that its buffers do not sit beside the analysis."""
    if not is_in_memory(con):
        con.execute("CHECKPOINT")
    con.execute(f"SET memory_limit='{FETCH_MEMORY}'")
    # its allocator hands freed memory back after each statement, not past 128 MB only
    con.execute("SET allocator_flush_threshold='8MB'")
    con.execute("SET allocator_bulk_deallocation_flush_threshold='8MB'")


def release_buffers(con: Any) -> None:
    """After a block of sessions is fetched: DuckDB's cached pages of the run model (the next
    block reads others) and its allocator's free memory go back to the system, so that they do
    not sit beside the analysis's cut of the block. (In memory, the pages are the model itself:
    they stay, within the fetch's memory; evicting them would write them to the spill.)"""
    import duckdb

    if is_in_memory(con):
        return
    try:
        con.execute("SET memory_limit='1MB'")  # evicts every unpinned page
    except duckdb.Error:
        pass
    con.execute(f"SET memory_limit='{FETCH_MEMORY}'")
