"""The analytical reader: a run directory -> a ``LoadedRun`` (plain dataclasses), via DuckDB.

DuckDB parses every rank's JSON-lines segments (or reads the Parquet copy that
``compact_run`` writes) straight into per-session aggregates, so memory stays bounded for any
number of ranks and steps; full per-record timelines are loaded only for the ranks the
analysis needs (rank 0, or the lowest rank present, plus a sample for the per-rank spread).
Torn lines, missing ranks, missing finish records and older schema versions are tolerated and
reported in ``LoadedRun.warnings``; a path that holds no records raises ``NotARunError``.
``duckdb`` is imported only when a run is loaded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from goodtrace import schema
from goodtrace._storage import is_url, local_path
from goodtrace.reader import NotARunError

__all__ = [
    "COMPACT_DIR",
    "LoadError",
    "LoadedRun",
    "NotARunError",
    "RankSummary",
    "SessionInfo",
    "SessionTimeline",
    "compact_run",
    "load_run",
]

SEGMENT_SUFFIX = ".jsonl"
COMPACT_DIR = "compact"  # RUN/compact/{records.parquet, manifest.json}
COMPACT_MANIFEST = "manifest.json"
COMPACT_RECORDS = "records.parquet"
COMPACT_FORMAT = 1
DEFAULT_DETAIL_RANKS = 16  # ranks loaded record by record for the per-rank spread

Progress = Callable[[str, int, int], None]  # (what, done, total)

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


class LoadError(RuntimeError):
    """The records exist but cannot be read (the message says which and why)."""


@dataclasses.dataclass(frozen=True)
class SessionInfo:
    """One process of one rank (all its segments), summarised. Times are that process's
    monotonic ns; ``wall()`` converts them with the header's (wall, mono) anchor."""

    index: int
    session: str
    rank: int
    world: int
    host: str
    pid: int
    restart: int | None
    proc_start: int
    init: int
    submit_wall: int | None
    wall_anchor: int
    mono_anchor: int
    last_seen: int
    finish_completed: bool | None = None
    finish_t: int | None = None
    finish_reason: str | None = None
    has_finish: bool = False
    main_tid: int | None = None
    overhead_categories: frozenset[str] = frozenset()
    lag: int = 1
    dropped: int = 0
    schema_version: int = schema.SCHEMA_VERSION
    first_step: int | None = None
    last_step: int | None = None
    step_count: int = 0
    sync_count: int = 0
    preempt_events: int = 0

    def wall(self, mono: int) -> int:
        """This session's monotonic ns -> wall-clock ns (the header anchor)."""
        return self.wall_anchor + (mono - self.mono_anchor)

    @property
    def start_wall(self) -> int:
        return self.wall(self.proc_start)

    @property
    def last_seen_wall(self) -> int:
        return self.wall(self.last_seen)


@dataclasses.dataclass
class SessionTimeline:
    """Every record of one session, as tuples sorted by time (loaded for detail ranks only)."""

    steps: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)  # step, t0, t1
    syncs: list[tuple[int, int, str]] = dataclasses.field(default_factory=list)  # step, t, how
    # name, category, t0, t1, step (or None), thread id (or None), error
    spans: list[tuple[str, str, int, int, int | None, int | None, bool]] = dataclasses.field(
        default_factory=list
    )
    tags: list[tuple[int | None, str, int]] = dataclasses.field(default_factory=list)  # step, name, t
    events: list[tuple[str, int, int | None]] = dataclasses.field(default_factory=list)  # name, t, step
    # name, step, value, reduce
    metrics: list[tuple[str, int | None, float | None, str]] = dataclasses.field(default_factory=list)
    clock_offset: int = 0  # latest measured offset of this rank's clock to rank 0 (ns)
    model: dict[str, Any] = dataclasses.field(default_factory=dict)  # attrs of the last "model" event


@dataclasses.dataclass(frozen=True)
class RankSummary:
    """Per-session figures computed in SQL for every rank (bounded memory at any scale)."""

    index: int  # session index
    step_time_median_ns: float | None
    step_time_p90_ns: float | None
    compute_median_ns: float | None
    lateness_median_ns: float | None  # arrival at sync points vs the earliest rank, same attempt
    late_fraction: float | None  # share of sync points where this rank was the last to arrive
    records: int


@dataclasses.dataclass
class LoadedRun:
    """What the analysis reads: sessions of every rank, timelines of the detail ranks."""

    path: str
    sessions: list[SessionInfo]
    timelines: dict[int, SessionTimeline]
    rank_summaries: dict[int, RankSummary] = dataclasses.field(default_factory=dict)
    warnings: list[str] = dataclasses.field(default_factory=list)
    form: str = "jsonl"  # "jsonl", "parquet" or "parquet+jsonl"
    records: int = 0


# ----------------------------------------------------------------------------------------------
# Files and headers (plain Python: one line per file)
# ----------------------------------------------------------------------------------------------
def _list_segments(root: str) -> list[str]:
    if not os.path.isdir(root):
        raise NotARunError(f"{root!r} is not a directory")
    found: list[str] = []
    for entry in sorted(os.listdir(root)):
        rank_dir = os.path.join(root, entry)
        if entry.startswith("rank-") and os.path.isdir(rank_dir):
            found.extend(
                os.path.join(rank_dir, name)
                for name in sorted(os.listdir(rank_dir))
                if name.endswith(SEGMENT_SUFFIX)
            )
    return found


def _read_header(path: str) -> dict[str, Any] | None:
    with open(path, "rb") as handle:
        line = handle.readline(4 * 1024 * 1024)
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if isinstance(record, dict) and record.get(schema.F_KIND) == schema.HEADER:
        return record
    return None


def _ends_torn(path: str) -> bool:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        if handle.tell() == 0:
            return False
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) != b"\n"


def _int_or_none(value: object) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclasses.dataclass
class _SessionDraft:
    header: dict[str, Any]
    files: list[str]
    where: str


def _collect_sessions(
    files: Sequence[tuple[str, dict[str, Any] | None]], warnings: list[str]
) -> dict[str, _SessionDraft]:
    sessions: dict[str, _SessionDraft] = {}
    skipped_versions: dict[object, int] = {}
    older: dict[object, int] = {}
    for path, header in files:
        where = os.path.join(os.path.basename(os.path.dirname(path)), os.path.basename(path))
        if header is None:
            warnings.append(f"{where}: does not start with a goodtrace header line; skipped")
            continue
        version = header.get(schema.H_SCHEMA)
        if not isinstance(version, int) or version > schema.SCHEMA_VERSION:
            skipped_versions[version] = skipped_versions.get(version, 0) + 1
            continue
        if version not in schema.READABLE_VERSIONS:
            older[version] = older.get(version, 0) + 1
        if not isinstance(header.get(schema.H_RANK), int) or not isinstance(header.get(schema.F_MONO), int):
            warnings.append(f"{where}: header has no rank or clock anchor; skipped")
            continue
        session_id = str(header.get(schema.H_SESSION) or path)
        draft = sessions.get(session_id)
        if draft is None:
            sessions[session_id] = _SessionDraft(header, [path], where)
        else:
            draft.files.append(path)
            if header.get(schema.H_SEGMENT, 0) == 0:
                draft.header = header
    for version, count in skipped_versions.items():
        warnings.append(
            f"{count} segment file(s) have schema version {version!r}, newer than this goodtrace reads "
            f"({schema.SCHEMA_VERSION}); skipped — upgrade goodtrace to read them"
        )
    for version, count in older.items():
        warnings.append(
            f"{count} segment file(s) have the older schema version {version!r}; read as best effort "
            "(fields they lack, such as the OS process start, fall back to the init time)"
        )
    return sessions


def _session_info(index: int, draft: _SessionDraft, summary: dict[str, Any]) -> SessionInfo:
    header = draft.header
    mono = int(header[schema.F_MONO])
    init = _int_or_none(header.get(schema.H_INIT))
    proc_start = _int_or_none(header.get(schema.H_PROC_START))
    if proc_start is None:
        proc_start = init if init is not None else mono
    config = header.get(schema.H_CONFIG) if isinstance(header.get(schema.H_CONFIG), dict) else {}
    assert isinstance(config, dict)
    overhead = header.get("overhead_categories") or config.get("overhead_categories") or []
    last_seen = max(
        v for v in (mono, proc_start, summary.get("last_seen"), summary.get("finish_t")) if isinstance(v, int)
    )
    lag = config.get("lag", 1)
    return SessionInfo(
        index=index,
        session=str(header.get(schema.H_SESSION) or draft.where),
        rank=int(header[schema.H_RANK]),
        world=max(1, _int_or_none(header.get(schema.H_WORLD)) or 1),
        host=str(header.get(schema.H_HOST) or "?"),
        pid=_int_or_none(header.get(schema.H_PID)) or 0,
        restart=_int_or_none(header.get(schema.H_RESTART)),
        proc_start=proc_start,
        init=init if init is not None else mono,
        submit_wall=_int_or_none(header.get(schema.H_SUBMIT_WALL)),
        wall_anchor=_int_or_none(header.get(schema.F_WALL)) or 0,
        mono_anchor=mono,
        last_seen=last_seen,
        finish_completed=summary.get("finish_completed"),
        finish_t=summary.get("finish_t"),
        finish_reason=summary.get("finish_reason"),
        has_finish=bool(summary.get("has_finish")),
        main_tid=_int_or_none(header.get("main_tid")),
        overhead_categories=frozenset(str(c) for c in overhead if isinstance(c, str)),
        lag=int(lag) if isinstance(lag, int) else 1,
        dropped=int(summary.get("dropped") or 0),
        schema_version=_int_or_none(header.get(schema.H_SCHEMA)) or 0,
        first_step=summary.get("first_step"),
        last_step=summary.get("last_step"),
        step_count=int(summary.get("step_count") or 0),
        sync_count=int(summary.get("sync_count") or 0),
        preempt_events=int(summary.get("preempt_events") or 0),
    )


# ----------------------------------------------------------------------------------------------
# DuckDB
# ----------------------------------------------------------------------------------------------
def _insert_rows(con: Any, table: str, rows: Sequence[Sequence[Any]]) -> None:
    """Insert many rows in one statement (``executemany`` runs one statement per row)."""
    if not rows:
        return
    columns = list(zip(*rows, strict=True))
    select = ", ".join(f"unnest(${i + 1}) AS c{i}" for i in range(len(columns)))
    con.execute(f"INSERT INTO {table} SELECT {select}", [list(c) for c in columns])


def _sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _read_json_sql(paths: Sequence[str]) -> str:
    columns = "{" + ", ".join(f"'{k}': '{v}'" for k, v in (*_COLUMNS.items(), (schema.F_ATTRS, "JSON"))) + "}"
    files = "[" + ", ".join(_sql_str(p) for p in paths) + "]"
    return (
        f"read_json({files}, columns={columns}, format='newline_delimited', ignore_errors=true, "
        "filename=true, maximum_object_size=16777216)"
    )


def _connect(tmpdir: str) -> Any:
    import duckdb

    con = duckdb.connect(os.path.join(tmpdir, "run.duckdb"))
    con.execute(f"SET temp_directory={_sql_str(os.path.join(tmpdir, 'spill'))}")
    con.execute("SET memory_limit='1GB'")
    con.execute("SET preserve_insertion_order=false")
    return con


def _create_records_table(con: Any, table: str = "records") -> None:
    cols = ", ".join(f"{name} {kind}" for name, kind in _COLUMNS.items())
    con.execute(f"CREATE TABLE {table} (sid INTEGER, {cols}, attrs VARCHAR)")


def _insert_json(
    con: Any, paths: Sequence[str], sid_of_file: dict[str, int], progress: Progress | None, done: int,
    total: int, table: str = "records",
) -> int:
    batch = 32
    names = ", ".join(f"r.{name}" for name in _COLUMNS)
    for start in range(0, len(paths), batch):
        chunk = list(paths[start:start + batch])
        con.execute("DELETE FROM files_batch")
        _insert_rows(con, "files_batch", [(p, sid_of_file[p]) for p in chunk])
        source = _read_json_sql(chunk)
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
_AGGREGATE_TABLES = (
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


def _fold_parquet(con: Any) -> None:
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


def _fold_json(
    con: Any, files_by_sid: dict[int, list[str]], progress: Progress | None, done: int, total: int
) -> int:
    """Parse the JSON files, about 32 at a time, straight into ``part``."""
    paths = [p for sid in sorted(files_by_sid) for p in files_by_sid[sid]]
    if paths:
        _insert_rows(con, "keymap", [(p, sid) for sid in files_by_sid for p in files_by_sid[sid]])
    for start in range(0, len(paths), 32):
        chunk = paths[start:start + 32]
        _fold(con, "filename", _read_json_sql(chunk))
        done += len(chunk)
        if progress is not None:
            progress("reading rank files", done, total)
    return done


def _distribute(con: Any) -> None:
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


def _session_summaries(con: Any) -> dict[int, dict[str, Any]]:
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


def _rank_summaries(
    con: Any, sessions: Sequence[SessionInfo], attempts: Sequence[int], counts: dict[int, int]
) -> dict[int, RankSummary]:
    # Sync points go onto one clock per attempt: measured offsets to the reference rank
    # (reference = local + offset_ns, see goodtrace.clocksync) where recorded, else anchors.
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
    _insert_rows(con, "sess", rows)
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


def _load_timelines(
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
        _insert_rows(con, "files_batch", [(p, s) for s in wanted for p in json_files.get(s, [])])
        parts = [
            f"SELECT f.sid, {', '.join('r.' + c.strip() for c in columns.split(','))} FROM {_read_json_sql(paths)} r "
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


def _pick_detail_sessions(
    sessions: Sequence[SessionInfo], summaries: dict[int, RankSummary], limit: int
) -> list[int]:
    """Every session of the lowest rank (rank 0), plus sessions of up to ``limit`` ranks: all
    ranks when there are few, else the slowest and fastest by median step/compute time and an
    even sample of the rest."""
    ranks = sorted({s.rank for s in sessions})
    if not ranks:
        return []
    chosen: list[int] = [ranks[0]]
    if len(ranks) <= limit:
        chosen = ranks
    else:
        by_rank: dict[int, float] = {}
        for s in sessions:
            summary = summaries.get(s.index)
            value = None if summary is None else (summary.compute_median_ns or summary.step_time_median_ns)
            if value is not None:
                by_rank[s.rank] = max(by_rank.get(s.rank, 0.0), value)
        ordered = sorted(by_rank, key=lambda r: by_rank[r])
        extremes = ordered[-(limit // 4):] + ordered[: limit // 8]
        for r in extremes:
            if r not in chosen:
                chosen.append(r)
        stride = max(1, len(ranks) // max(1, limit - len(chosen)))
        for r in ranks[::stride] + ranks:
            if len(chosen) >= limit:
                break
            if r not in chosen:
                chosen.append(r)
    wanted = set(chosen)
    return [s.index for s in sessions if s.rank in wanted]


# ----------------------------------------------------------------------------------------------
# Compacted form
# ----------------------------------------------------------------------------------------------
def _compact_manifest(root: str) -> dict[str, Any] | None:
    path = os.path.join(root, COMPACT_DIR, COMPACT_MANIFEST)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            manifest = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != COMPACT_FORMAT:
        return None
    if not os.path.exists(os.path.join(root, COMPACT_DIR, COMPACT_RECORDS)):
        return None
    return manifest


def load_run(
    run_dir: str | os.PathLike[str],
    *,
    detail_ranks: int = DEFAULT_DETAIL_RANKS,
    progress: Progress | None = None,
    use_compact: bool = True,
) -> LoadedRun:
    """Read a run directory (JSON lines, and its compacted Parquet form when present).

    Raises ``NotARunError`` when the path holds no readable records, ``LoadError`` when DuckDB
    cannot read them (a damaged compacted copy is skipped in favour of the JSON lines first).
    """
    import duckdb

    try:
        return _load_run(run_dir, detail_ranks=detail_ranks, progress=progress, use_compact=use_compact)
    except duckdb.Error as exc:
        if not use_compact:
            raise LoadError(f"cannot read the records of {os.fspath(run_dir)!r}: {exc}") from None
        first = str(exc).splitlines()[0]
    try:
        loaded = _load_run(run_dir, detail_ranks=detail_ranks, progress=progress, use_compact=False)
    except duckdb.Error as exc:
        raise LoadError(f"cannot read the records of {os.fspath(run_dir)!r}: {exc}") from None
    loaded.warnings.insert(0, f"the compacted copy could not be read ({first}); read the JSON lines instead")
    return loaded


def mirror_run(url: str, *, cache_dir: str | None = None, progress: Progress | None = None) -> str:
    """Copy a run on object storage (any fsspec URL: s3://, gs://, ...) into a local cache and
    return that directory. Only segments that are new or whose size changed since the last
    mirror are fetched (rotated segments never change), so re-reading a live run is cheap.

    The cache is ``$GOODTRACE_CACHE_DIR`` (default ``~/.cache/goodtrace/runs``), one folder per
    URL. DuckDB then reads it like any local run."""
    try:
        import fsspec
    except ImportError:
        raise NotARunError(f"{url!r}: reading a run from a URL needs fsspec (pip install 'goodtrace[remote]')") from None
    try:
        fs, root = fsspec.core.url_to_fs(url)
        listing = fs.glob(root.rstrip("/") + "/rank-*/*" + SEGMENT_SUFFIX, detail=True)
    except Exception as exc:  # unknown protocol, missing credentials, network errors
        raise NotARunError(f"{url!r}: cannot list the run ({type(exc).__name__}: {exc})") from None
    remote: dict[str, tuple[str, int | None]] = {}
    for path, info in sorted(listing.items()):
        rank_dir, name = path.rsplit("/", 2)[-2:]
        if not rank_dir.startswith("rank-") or name.startswith(".") or os.sep in name:
            continue
        remote[os.path.join(rank_dir, name)] = (path, info.get("size"))
    if not remote:
        raise NotARunError(f"{url!r} holds no goodtrace records (no rank-*/*{SEGMENT_SUFFIX} files)")
    base = cache_dir or os.environ.get("GOODTRACE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "goodtrace", "runs"
    )
    local = os.path.join(base, hashlib.sha256(url.encode()).hexdigest()[:16])
    os.makedirs(local, exist_ok=True)
    with open(os.path.join(local, "SOURCE"), "w", encoding="utf-8") as handle:
        handle.write(url + "\n")
    for done, (relative, (path, size)) in enumerate(remote.items()):
        dest = os.path.join(local, relative)
        if size is None or not os.path.exists(dest) or os.path.getsize(dest) != size:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            try:
                fs.get_file(path, dest + ".part")
            except Exception as exc:
                raise NotARunError(f"{url!r}: cannot fetch {path!r} ({type(exc).__name__}: {exc})") from None
            os.replace(dest + ".part", dest)
        if progress is not None:
            progress("fetching rank files", done + 1, len(remote))
    for stale in _list_segments(local):  # a segment gone from the source goes from the mirror
        if os.path.relpath(stale, local) not in remote:
            os.remove(stale)
    return local


def _load_run(
    run_dir: str | os.PathLike[str],
    *,
    detail_ranks: int,
    progress: Progress | None,
    use_compact: bool,
) -> LoadedRun:
    path = os.fspath(run_dir)
    warnings: list[str] = []
    if is_url(path):
        path = mirror_run(path, progress=progress)
        warnings.append(f"read from a local mirror of {os.fspath(run_dir)!r}: {path}")
    root = local_path(path)
    manifest = _compact_manifest(root) if use_compact else None
    segment_paths = _list_segments(root)
    compacted: dict[str, dict[str, Any]] = {}
    if manifest is not None:
        for entry in manifest.get("files", []):
            full = os.path.join(root, entry["path"])
            compacted[full] = entry
    # A compacted file is used from Parquet unless it has changed since (then re-read as JSON).
    json_paths: list[str] = []
    parquet_ok: dict[str, dict[str, Any]] = {}
    for p in segment_paths:
        entry = compacted.get(p)
        if entry is not None and os.path.getsize(p) == entry["size"]:
            parquet_ok[p] = entry
        else:
            json_paths.append(p)
    for p, entry in compacted.items():
        if p not in parquet_ok and not os.path.exists(p):
            parquet_ok[p] = entry  # JSON deleted after compaction: the Parquet copy is the record
    if not json_paths and not parquet_ok:
        raise NotARunError(f"{path!r} holds no goodtrace records (no rank-*/*{SEGMENT_SUFFIX} files)")
    files: list[tuple[str, dict[str, Any] | None]] = []
    for p, entry in parquet_ok.items():
        files.append((p, entry.get("header")))
    torn = 0
    for p in json_paths:
        try:
            files.append((p, _read_header(p)))
            torn += _ends_torn(p)
        except OSError as exc:
            warnings.append(f"{p}: cannot be read ({exc}); skipped")
    if torn:
        warnings.append(
            f"{torn} segment file(s) end in a torn line (a process killed mid-write); the torn line is ignored"
        )
    drafts = _collect_sessions(files, warnings)
    if not drafts:
        raise NotARunError(f"{path!r} holds no readable goodtrace records")
    sid_of_file: dict[str, int] = {}
    for index, draft in enumerate(drafts.values()):
        for f in draft.files:
            sid_of_file[f] = index
    tmpdir = tempfile.mkdtemp(prefix="goodtrace-load-")
    try:
        con = _connect(tmpdir)
        try:
            _create_records_table(con, "records_json")  # empty: the column layout of a record
            con.execute("CREATE TEMP TABLE files_batch (path VARCHAR, sid INTEGER)")
            con.execute("CREATE TEMP TABLE fidmap (fid INTEGER, sid INTEGER)")
            con.execute("CREATE TEMP TABLE sessmain (sid INTEGER, main_tid UBIGINT)")
            _insert_rows(
                con, "sessmain", [(i, _int_or_none(d.header.get("main_tid"))) for i, d in enumerate(drafts.values())]
            )
            for statement in _AGGREGATE_TABLES:
                con.execute(statement)
            json_by_sid: dict[int, list[str]] = {}
            for p in json_paths:
                if p in sid_of_file:
                    json_by_sid.setdefault(sid_of_file[p], []).append(p)
            total = len(json_paths) + (1 if parquet_ok else 0)
            parquet_fids: dict[int, list[int]] = {}
            done = 0
            if parquet_ok:
                fid_to_sid = {
                    int(entry["fid"]): sid_of_file[p] for p, entry in parquet_ok.items() if p in sid_of_file
                }
                for fid, sid in fid_to_sid.items():
                    parquet_fids.setdefault(sid, []).append(fid)
                _insert_rows(con, "fidmap", list(fid_to_sid.items()))
                parquet = os.path.join(root, COMPACT_DIR, COMPACT_RECORDS)
                # A view, not a copy: each query reads only the Parquet columns it needs.
                con.execute(f"CREATE TEMP VIEW parquet_records AS SELECT * FROM read_parquet({_sql_str(parquet)})")
                _insert_rows(con, "keymap", [(f"fid:{f}", sid) for f, sid in fid_to_sid.items()])
                _fold_parquet(con)
                done += 1
                if progress is not None:
                    progress("reading compacted records", done, total)
            done = _fold_json(con, json_by_sid, progress, done, total)
            _distribute(con)
            if progress is not None:
                progress("summarising", total, total)
            summaries = _session_summaries(con)
            sessions = [
                _session_info(i, draft, summaries.get(i, {})) for i, draft in enumerate(drafts.values())
            ]
            record_count = sum(int(s.get("records") or 0) for s in summaries.values())
            from goodtrace.analysis.attempts import assign_attempts

            attempts = assign_attempts(sessions)
            counts = {sid: int(v.get("records") or 0) for sid, v in summaries.items()}
            rank_summaries = _rank_summaries(con, sessions, attempts, counts)
            detail = _pick_detail_sessions(sessions, rank_summaries, detail_ranks)
            timelines = _load_timelines(con, detail, parquet_fids, json_by_sid)
        finally:
            con.close()
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    form = "jsonl" if not parquet_ok else ("parquet" if not json_paths else "parquet+jsonl")
    _warn_about_gaps(sessions, warnings)
    return LoadedRun(
        path=path, sessions=sessions, timelines=timelines, rank_summaries=rank_summaries,
        warnings=warnings, form=form, records=record_count,
    )


def _warn_about_gaps(sessions: Sequence[SessionInfo], warnings: list[str]) -> None:
    world = max((s.world for s in sessions), default=1)
    present = {s.rank for s in sessions}
    missing = [r for r in range(world) if r not in present]
    if missing:
        shown = ", ".join(str(r) for r in missing[:10]) + (" ..." if len(missing) > 10 else "")
        warnings.append(f"{len(missing)} of {world} ranks have no records (ranks {shown})")
    dropped = sum(s.dropped for s in sessions)
    if dropped:
        warnings.append(f"the recorder dropped {dropped} records (storage could not keep up)")


# ----------------------------------------------------------------------------------------------
# goodtrace compact
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class CompactResult:
    path: str
    files: int
    records: int
    json_bytes: int
    parquet_bytes: int


def compact_run(run_dir: str | os.PathLike[str], *, progress: Progress | None = None) -> CompactResult:
    """Write RUN/compact/records.parquet (every record of every segment, with its file id) and
    a manifest of the segments it covers (path, size, header). The JSON files are left as they
    are; segments that grow after compaction are read from JSON again."""
    path = os.fspath(run_dir)
    if is_url(path):
        raise NotARunError(f"{path!r}: compact works on local run directories")
    root = local_path(path)
    segments = _list_segments(root)
    if not segments:
        raise NotARunError(f"{path!r} holds no goodtrace records (no rank-*/*{SEGMENT_SUFFIX} files)")
    entries: list[dict[str, Any]] = []
    for fid, p in enumerate(segments):
        header = _read_header(p)
        entries.append(
            {"fid": fid, "path": os.path.relpath(p, root), "size": os.path.getsize(p), "header": header}
        )
    out_dir = os.path.join(root, COMPACT_DIR)
    os.makedirs(out_dir, exist_ok=True)
    target = os.path.join(out_dir, COMPACT_RECORDS)
    partial = target + ".partial"
    tmpdir = tempfile.mkdtemp(prefix="goodtrace-compact-")
    import duckdb

    try:
        con = _connect(tmpdir)
        try:
            _create_records_table(con)
            con.execute("ALTER TABLE records RENAME COLUMN sid TO fid")
            con.execute("CREATE TEMP TABLE files_batch (path VARCHAR, sid INTEGER)")
            _insert_json(con, segments, {p: i for i, p in enumerate(segments)}, progress, 0, len(segments))
            records = int(con.execute("SELECT count(*) FROM records").fetchone()[0])
            if progress is not None:
                progress("writing Parquet", len(segments), len(segments))
            con.execute(
                # Sorted by kind, then file: queries of one kind (sync points, spans) and of a
                # few files (the detail ranks) skip the other row groups.
                f"COPY (SELECT * FROM records ORDER BY kind, fid) TO {_sql_str(partial)} "
                "(FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 122880)"
            )
        finally:
            con.close()
    except duckdb.Error as exc:
        raise LoadError(f"cannot compact {path!r}: {exc}") from None
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    os.replace(partial, target)
    manifest = {"format": COMPACT_FORMAT, "files": entries}
    with open(os.path.join(out_dir, COMPACT_MANIFEST + ".partial"), "w", encoding="utf-8") as handle:
        json.dump(manifest, handle)
    os.replace(os.path.join(out_dir, COMPACT_MANIFEST + ".partial"), os.path.join(out_dir, COMPACT_MANIFEST))
    return CompactResult(
        path=out_dir,
        files=len(segments),
        records=records,
        json_bytes=sum(e["size"] for e in entries),
        parquet_bytes=os.path.getsize(target),
    )
