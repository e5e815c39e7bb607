"""The run model's DuckDB tables into Python: per-session summaries, each session's
:class:`~goodtrace.read.loaded.SessionRecords` as compact columns (numpy from DuckDB, a batch of
sessions at a time, low-cardinality strings as codes into one shared object each), what the
integrations recorded about the model, and the full timelines of the few sessions the analysis
needs record by record. :mod:`goodtrace.read.duckdb_sql` fills the tables."""

from __future__ import annotations

import bisect
import weakref
from array import array
from collections.abc import Callable, Iterable, Iterator, MutableMapping, Sequence
from typing import Any

from goodtrace import schema
from goodtrace.read.duckdb_connection import execute_all, insert_rows, release_buffers
from goodtrace.read.duckdb_sql import (
    MAX_EVENT_ATTRS,
    VALID_JSON,
    create_records_table,
    read_json_sql,
)
from goodtrace.read.fetch_order import by_session, order_of, per_session
from goodtrace.read.loaded import NO_TIME, EventColumns, EventRecord, SessionRecords, SessionTimeline
from goodtrace.read.validate import json_object


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


def _ints(values: Any) -> array[int]:
    """A numpy integer column (masked where NULL) as an array of int64, NULL as NO_TIME."""
    import numpy as np

    filled = values.filled(NO_TIME) if isinstance(values, np.ma.MaskedArray) else values
    out = array("q")
    out.frombytes(np.ascontiguousarray(filled, dtype=np.int64).data.cast("B"))  # one copy, not two
    return out


SESSION_BATCH = 1024  # sessions whose model rows are fetched together (bounds the columns in flight)


def _vocab(con: Any, table: str, column: str, into: str | None = None) -> Any:
    """The distinct strings of a low-cardinality ``column`` (categories, how a sync was taken,
    span names) as one shared Python object each, numbered in table ``vocab_<column>`` in their
    sorted order: queries join it and hand out codes, millions of integers instead of millions
    of strings, and order by a code where they would order by the string."""
    import numpy as np

    found = [row[0] for row in con.execute(f"SELECT DISTINCT {column} FROM {table}").fetchall()]
    values = sorted(found, key=lambda v: (v is not None, "" if v is None else str(v)))  # sorted here: a few values
    vocab = np.empty(len(values), dtype=object)
    vocab[:] = [_interned(v) for v in values]
    into = into or f"vocab_{column}"
    con.execute(f"CREATE OR REPLACE TEMP TABLE {into} ({column} VARCHAR, code INTEGER)")
    insert_rows(con, into, [(v, i) for i, v in enumerate(values)])
    return vocab


def _sid_ranges(sids: Sequence[int], size: int) -> Iterable[tuple[int, int]]:
    for i in range(0, len(sids), size):
        yield sids[i], sids[min(i + size, len(sids)) - 1]


class SessionRecordsSource(MutableMapping[int, SessionRecords]):
    """Each session's :class:`SessionRecords`, fetched from the run model's tables when asked
    for, a block of sessions at a time (at most :data:`SESSION_BATCH` sessions and about
    :data:`BLOCK_ROWS` step executions), so that the analysis holds the columns of one block
    at a time, however long the run. Entries the analysis sets (what it keeps of a session
    once cut) replace the fetched ones. It owns the DuckDB connection (and the directory of
    its database file) until :meth:`close`."""

    def __init__(self, con: Any, count: int, rows: Sequence[int], cleanup: Callable[[], None]) -> None:
        self._con: Any = con
        self._count = count
        self._cleanup = cleanup
        self._finalizer = weakref.finalize(self, _close_connection, con, cleanup)
        self._set: dict[int, SessionRecords] = {}
        self._block: dict[int, SessionRecords] = {}
        self._fetched = -1  # the last block fetched whole
        self._vocab: tuple[Any, Any, Any] | None = None
        self._starts = session_blocks(count, rows)

    def __getitem__(self, sid: int) -> SessionRecords:
        if sid in self._set:
            return self._set[sid]
        if not 0 <= sid < self._count:
            raise KeyError(sid)
        if sid not in self._block:
            if self._con is None:
                raise KeyError(f"session {sid}: the run model was closed")
            k = bisect.bisect_right(self._starts, sid) - 1
            hi = self._starts[k + 1] if k + 1 < len(self._starts) else self._count
            # a session of a block fetched before is a revisit (the analysis cuts the reference
            # sessions last): it alone is fetched, not its block again
            lo, hi = (sid, sid + 1) if k <= self._fetched else (self._starts[k], hi)
            self._fetched = max(self._fetched, k)
            self._block = {}  # the previous block's columns go first
            if self._vocab is None:
                self._vocab = _vocab(self._con, "m_syncs", "how"), _vocab(self._con, "m_spans", "cat"), \
                    _vocab(self._con, "m_starts", "name")
            self._block = _fetch_records(self._con, range(lo, hi), self._vocab)
            release_buffers(self._con)
        return self._block[sid]

    def __setitem__(self, sid: int, records: SessionRecords) -> None:
        self._set[sid] = records
        self._block.pop(sid, None)

    def __delitem__(self, sid: int) -> None:
        raise TypeError("sessions cannot be removed from a run")

    def __iter__(self) -> Iterator[int]:
        return iter(range(self._count))

    def __len__(self) -> int:
        return self._count

    def __contains__(self, sid: object) -> bool:
        return isinstance(sid, int) and 0 <= sid < self._count

    def close(self) -> None:
        """Close the connection and remove its files (entries set by the analysis stay)."""
        self._block = {}
        self._con = None
        self._finalizer()


def session_blocks(count: int, rows: Sequence[int]) -> list[int]:
    """The first session of each block of consecutive sessions fetched together: at most
    :data:`SESSION_BATCH` sessions and about :data:`BLOCK_ROWS` step executions (``rows``:
    each session's), a longer session alone."""
    starts = [0]
    held = 0
    for sid in range(count):
        held += rows[sid] if sid < len(rows) else 0
        if sid + 1 < count and (sid + 1 - starts[-1] >= SESSION_BATCH or held >= BLOCK_ROWS):
            starts.append(sid + 1)
            held = 0
    return starts


def fill_compute(con: Any, rows: Sequence[int]) -> None:
    """Table ``m_compute`` (sid, seq, ns): each session's outermost compute per execution
    (:func:`outermost_compute`), from its compute spans (``seg_compute``, dropped after) and
    its executions, a block of sessions at a time (:func:`session_blocks`; ``rows``: each
    session's executions), before the analysis holds anything."""
    import numpy as np

    con.execute("CREATE OR REPLACE TABLE m_compute (sid INTEGER, seq BIGINT, ns BIGINT)")
    starts = session_blocks(len(rows), rows)
    for k, lo in enumerate(starts):
        hi = starts[k + 1] - 1 if k + 1 < len(starts) else len(rows) - 1
        where = f"sid BETWEEN {int(lo)} AND {int(hi)}"
        executions = dict(by_session(con, f"SELECT sid, seq, step, t0 FROM m_steps WHERE {where}", ("sid", "seq", "t0")))
        sids, seqs, totals = [], [], []
        for sid, c in by_session(con, f"SELECT sid, t0, t1, step FROM seg_compute WHERE {where}",
                                     ("sid", "t0", "-t1", "step")):
            e = executions.pop(sid, None)
            if e is None:
                continue
            seq, ns = outermost_compute(c["t0"], c["t1"], c["step"], e["seq"], e["step"], e["t0"])
            del e
            sids.append(np.full(len(seq), sid, dtype=np.int32))
            seqs.append(seq)
            totals.append(ns)
        del executions
        if sids:  # the block's rows in one insert (a wide run has thousands of short sessions)
            con.register("compute_part", {"sid": np.concatenate(sids), "seq": np.concatenate(seqs),
                                          "ns": np.concatenate(totals)})
            con.execute("INSERT INTO m_compute SELECT sid, seq, ns FROM compute_part")
            con.unregister("compute_part")
    con.execute("DROP TABLE seg_compute")


def _close_connection(con: Any, cleanup: Callable[[], None]) -> None:
    con.close()
    cleanup()


BLOCK_ROWS = 500_000  # step executions whose columns are fetched together (a longer session alone)


def session_records(con: Any, sids: Iterable[int]) -> dict[int, SessionRecords]:
    """Every session's :class:`SessionRecords`, as compact columns, fetched for
    :data:`SESSION_BATCH` sessions at a time."""
    vocab = _vocab(con, "m_syncs", "how"), _vocab(con, "m_spans", "cat"), _vocab(con, "m_starts", "name")
    return _fetch_records(con, sids, vocab)


def _fetch_records(con: Any, sids: Iterable[int], vocab: tuple[Any, Any, Any]) -> dict[int, SessionRecords]:
    out = {sid: SessionRecords() for sid in sids}
    how, cat, name = vocab
    for lo, hi in _sid_ranges(sorted(out), SESSION_BATCH):
        where = f"sid BETWEEN {int(lo)} AND {int(hi)}"
        for sid, c in by_session(con, f"SELECT sid, seq, step, t0, t1 FROM m_steps WHERE {where}", ("sid", "seq", "t0")):
            r = out[sid]
            r.step_seq, r.step_number, r.step_t0, r.step_t1 = _ints(c["seq"]), _ints(c["step"]), _ints(c["t0"]), _ints(c["t1"])
        for sid, c in by_session(
            con, f"SELECT t.sid, t.seq, t.step, t.t, t.after, v.code AS how FROM m_syncs t JOIN vocab_how v "
                 f"ON t.how IS NOT DISTINCT FROM v.how WHERE t.{where}", ("sid", "t", "seq", "step")
        ):
            r = out[sid]
            r.sync_seq, r.sync_step, r.sync_t, r.sync_after = _ints(c["seq"]), _ints(c["step"]), _ints(c["t"]), _ints(c["after"])
            r.sync_how = how[c["how"]].tolist()
        for sid, c in by_session(
            con, f"SELECT t.sid, v.code AS cat, t.t0, t.t1, t.step FROM m_spans t JOIN vocab_cat v "
                 f"ON t.cat IS NOT DISTINCT FROM v.cat WHERE t.{where}", ("sid", "t0", "-t1", "cat")
        ):
            r = out[sid]
            r.span_category = cat[c["cat"]].tolist()
            r.span_t0, r.span_t1, r.span_step = _ints(c["t0"]), _ints(c["t1"]), _ints(c["step"])
        for sid, c in by_session(con, f"SELECT sid, seq, ns FROM m_compute WHERE {where}", ("sid", "seq")):
            out[sid].compute_seq, out[sid].compute_ns = _ints(c["seq"]), _ints(c["ns"])
        for sid, c in by_session(
            con, f"SELECT t.sid, t.step, v.code AS name, t.t0 FROM (SELECT sid, step, name, min(t0) AS t0 "
                 f"FROM m_starts WHERE {where} GROUP BY ALL) t JOIN vocab_name v ON t.name IS NOT DISTINCT FROM v.name "
                 "ORDER BY t.sid, t.step, t.name"
        ):
            r = out[sid]
            r.starts_step, r.starts_name, r.starts_t0 = _ints(c["step"]), name[c["name"]].tolist(), _ints(c["t0"])
        for sid, name_, step, value in con.execute(
            # a step measured twice (re-done in a rollback): the value recorded last
            f"SELECT sid, name, step, arg_max(value, (coalesce(t, 0), value)) FROM m_device WHERE {where} "
            "GROUP BY sid, name, step"
        ).fetchall():
            out[sid].device.setdefault(str(name_), {})[int(step)] = float(value)
        for sid, t, offset, rtt in con.execute(
            f"SELECT sid, t, offset_ns, rtt_ns FROM m_clock WHERE {where} ORDER BY sid, t, offset_ns, rtt_ns"
        ).fetchall():
            out[sid].clock.extend((int(t), int(offset), int(rtt)))
        events: dict[int, EventColumns] = {}
        for sid, name_, t, step in con.execute(
            f"SELECT sid, name, t, step FROM m_events WHERE {where} ORDER BY sid, t, name, step"
        ).fetchall():
            events.setdefault(sid, EventColumns()).append((_interned(name_), int(t), None if step is None else int(step)))
        for sid, columns in events.items():
            out[sid].events = columns
    return out


COMPUTE_CHUNK = 262_144  # compute spans handled at a time (bounds the temporaries, not the result)


def outermost_compute(t0: Any, t1: Any, step: Any, ex_seq: Any, ex_step: Any, ex_t0: Any) -> tuple[Any, Any]:
    """A session's outermost main-thread compute time per execution, from its compute spans
    (``t0``, ``t1``, ``step``: NULL, masked, where a span names no step) and its executions
    (``ex_*``): ``(seq, ns)``, the executions with compute time in ``seq`` order.

    A span nested in an earlier one (in start order, the longer first at equal starts) adds
    nothing, a partial overlap adds its uncovered tail; each part belongs to the execution of
    its step (the span's ambient step) entered last at or before the part began (without a
    step: to the execution entered last), the later-numbered one where two entered at the same
    time; a part of a step that never entered belongs to none. The spans are taken
    :data:`COMPUTE_CHUNK` at a time, in start order, the latest end so far carried across."""
    import numpy as np

    no_seq = np.zeros(0, dtype=np.int64)
    t0 = np.asarray(t0, dtype=np.int64)
    if not len(t0) or not len(ex_seq):
        return no_seq, no_seq
    t1 = np.asarray(t1, dtype=np.int64)
    nostep = np.ma.getmaskarray(step)
    step = np.asarray(np.ma.filled(step, 0) if isinstance(step, np.ma.MaskedArray) else step, dtype=np.int64)
    ex_seq, ex_step, ex_t0 = (np.frombuffer(values, dtype=np.int64) if isinstance(values, array)
                              else np.asarray(values, dtype=np.int64) for values in (ex_seq, ex_step, ex_t0))
    in_order = bool(((t0[1:] > t0[:-1]) | ((t0[1:] == t0[:-1]) & (t1[1:] <= t1[:-1]))).all())
    if not in_order:  # fill_compute's fetch sorts them: a copy only for other callers
        order = np.lexsort((-t1, t0))
        t0, t1, step, nostep = t0[order], t1[order], step[order], nostep[order]
        del order
    # executions by entry time (the later-numbered last at equal times): their order as given
    # when they entered one after another, as they do
    by_time = None if bool((ex_t0[1:] > ex_t0[:-1]).all()) else np.lexsort((ex_seq, ex_t0))
    entered_t0 = ex_t0 if by_time is None else ex_t0[by_time]
    per_execution = np.zeros(len(ex_seq), dtype=np.int64)  # ns, by index into ex_*
    reach = np.iinfo(np.int64).min  # the latest end of the spans before the chunk
    for lo in range(0, len(t0), COMPUTE_CHUNK):
        hi = min(lo + COMPUTE_CHUNK, len(t0))
        ends = t1[lo:hi]
        before = np.empty_like(ends)  # the latest end of the spans before each
        before[0] = reach
        np.maximum.accumulate(ends[:-1], out=before[1:])
        np.maximum(before, reach, out=before)
        reach = max(reach, int(ends.max()))
        keep = ends > before
        a = np.maximum(t0[lo:hi], before)[keep]
        ns = ends[keep] - a
        part_step, part_nostep = step[lo:hi][keep], nostep[lo:hi][keep]
        del before, keep
        # the execution entered last at or before each part began: the answer for a part
        # without a step, and for one of the step of that execution
        last = np.searchsorted(entered_t0, a, side="right") - 1
        entered = last >= 0
        if by_time is not None:
            last[entered] = by_time[last[entered]]
        same = entered & (part_nostep | (ex_step[np.maximum(last, 0)] == part_step))
        np.add.at(per_execution, last[same], ns[same])
        other = np.flatnonzero(entered & ~same)
        del last, entered, same
        if len(other):  # of another step than the last entered: by (step, time) among that step's executions
            mine = np.flatnonzero(np.isin(ex_step, part_step[other]))
            n = len(mine)
            kind = np.concatenate((np.zeros(n, dtype=np.int8), np.ones(len(other), dtype=np.int8)))
            keys_t = np.concatenate((ex_t0[mine], a[other]))
            keys_step = np.concatenate((ex_step[mine], part_step[other]))
            tie = np.concatenate((ex_seq[mine], np.zeros(len(other), dtype=np.int64)))
            merged = np.lexsort((tie, kind, keys_t, keys_step))  # an execution before a part at equal time
            del kind, keys_t, tie
            at = np.where(merged < n, np.arange(len(merged)), -1)
            np.maximum.accumulate(at, out=at)  # the last execution at or before each position
            parts = np.flatnonzero(merged >= n)
            prior = at[parts]
            found = prior >= 0
            found[found] = keys_step[merged[prior[found]]] == keys_step[merged[parts[found]]]
            np.add.at(per_execution, mine[merged[prior[found]]], ns[other[merged[parts[found]] - n]])
    having = np.flatnonzero(per_execution)  # every part is longer than 0
    seqs, totals = ex_seq[having], per_execution[having]
    if not bool((seqs[1:] > seqs[:-1]).all()):  # executions not given in seq order, or numbered twice
        order = np.argsort(seqs, kind="stable")
        seqs, totals = seqs[order], totals[order]
        starts = np.flatnonzero(np.concatenate(([True], seqs[1:] != seqs[:-1])))
        seqs, totals = seqs[starts], np.add.reduceat(totals, starts)
    return seqs, totals


def model_events(con: Any) -> dict[int, dict[str, Any]]:
    """Per session, the attributes of the last ``model`` event the framework integration
    recorded (the one fetch of it: ``SessionTimeline.model``)."""
    return {int(sid): _json_object(attrs) for sid, attrs in con.execute(
        "SELECT sid, arg_max(attrs, (t, coalesce(attrs, ''))) FROM m_model WHERE name = 'model' GROUP BY sid"
    ).fetchall()}


# ---------------------------------------------------------------------------------- full timelines
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
    file number) from the copy's rows (filtered on ``fid``, so DuckDB skips other row groups)."""
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


def load_timelines(con: Any, sids: Iterable[int]) -> dict[int, SessionTimeline]:
    """What the step table needs of the wanted sessions, per step and as columns (see
    :class:`SessionTimeline`), from the ``det_*`` tables (every file of each wanted session
    extracted or read from the cache)."""
    wanted = sorted(set(sids))
    timelines = {sid: SessionTimeline() for sid in wanted}
    if not wanted:
        return timelines

    import numpy as np

    by_sid: dict[int, list[Any]] = {}
    for row in con.execute("SELECT sid, name, t, step, attrs FROM det_events ORDER BY sid, t, name, step, attrs").fetchall():
        by_sid.setdefault(row[0], []).append(row[1:])
    flops: dict[int, list[float]] = {}
    for sid, value in con.execute("SELECT sid, value FROM det_flops ORDER BY sid, t, value").fetchall():
        flops.setdefault(int(sid), []).append(float(value))
    names = _vocab(con, "(SELECT name FROM det_tags UNION ALL SELECT name FROM det_metrics "
                        "UNION ALL SELECT name FROM det_spans)", "name", into="vocab_detail")
    vocabulary = tuple(names.tolist())

    def codes(values: Any) -> array[int]:
        return array("i", np.asarray(values, dtype=np.int32).tobytes())

    for sid, c in by_session(
        con, "SELECT d.sid, d.step, v.code AS name FROM det_tags d JOIN vocab_detail v ON d.name = v.name "
             "ORDER BY d.sid, d.t, v.code"
    ):
        timelines[sid].tag_step, timelines[sid].tag_name = _ints(c["step"]), codes(c["name"])
    for sid, c in by_session(
        con, "SELECT d.sid, d.step, v.code AS name, d.value FROM det_metrics d JOIN vocab_detail v "
             "ON d.name = v.name ORDER BY d.sid, d.t, v.code, d.value"
    ):
        tl = timelines[sid]
        tl.metric_step, tl.metric_name = _ints(c["step"]), codes(c["name"])
        tl.metric_value = array("d", np.asarray(c["value"], dtype=np.float64).tobytes())
    for sid, c in per_session(_span_totals(con)):
        tl = timelines[sid]
        tl.span_step, tl.span_ns = _ints(c["step"]), _ints(c["ns"])
        tl.span_name = codes(c["name"])
        first = np.asarray(c["first"], dtype=np.int64)
        order = np.lexsort((np.asarray(c["name"]), first))  # first appearance in time, then the name (codes sort as names)
        tl.span_names = tuple(vocabulary[code] for code in dict.fromkeys(np.asarray(c["name"])[order].tolist()))
    for sid, tl in timelines.items():
        tl.names = vocabulary
        tl.events = [EventRecord(n, t, s, _json_object(a) or None) for n, t, s, a in by_sid.get(sid, [])]
        tl.flops = flops.get(sid, [])
    return timelines


def _span_totals(con: Any) -> dict[str, Any]:
    """``det_spans`` summed per session, step and span name (a step's spans may lie in two
    files): columns ``sid``, ``step``, ``name`` (its code in ``vocab_detail``), ``ns`` (the
    sum), ``first`` (the earliest start), ordered by session, step and name. The rows are
    fetched as they lie and grouped and ordered here: a reference rank of a million steps has
    millions of rows (one per span name and step), which DuckDB's GROUP BY and ORDER BY took
    5x as long to group and order (1 s of a 2-rank, 1 M-step report)."""
    import duckdb
    import numpy as np

    c: dict[str, Any] = con.execute("SELECT d.sid, d.step, v.code AS name, d.ns, d.first FROM det_spans d "
                                    "JOIN vocab_detail v ON d.name = v.name").fetchnumpy()
    order = order_of(c["sid"], c["step"], c["name"])
    for key in list(c):  # one column's two copies at a time
        c[key] = np.asarray(c[key])[order]
    del order
    sid, step, name, ns = c["sid"], c["step"], c["name"], c["ns"]
    if len(sid) < 2:
        return c
    new = np.ones(len(sid), dtype=bool)
    new[1:] = (sid[1:] != sid[:-1]) | (step[1:] != step[:-1]) | (name[1:] != name[:-1])
    if new.all():
        return c
    starts = np.flatnonzero(new)
    del new
    sizes = np.diff(starts, append=len(sid))
    shared = sizes > 1  # the (session, step, name) rows of two files or more: summed
    rows = np.flatnonzero(np.repeat(shared, sizes))
    exact = np.add.reduceat(ns[rows].astype(np.float64), np.cumsum(sizes[shared]) - sizes[shared])
    if float(exact.max()) >= 2.0**63:  # as DuckDB's cast of the sum would say
        raise duckdb.ConversionException("a span time summed over a step is out of range for INT64")
    return {"sid": sid[starts], "step": step[starts], "name": name[starts], "ns": np.add.reduceat(ns, starts),
            "first": np.minimum.reduceat(c["first"], starts)}


def _json_object(text: object) -> dict[str, Any]:
    return json_object(text) or {}
