"""The run model's DuckDB tables into Python: per-session summaries, each session's
:class:`~goodtrace.read.loaded.SessionRecords` as compact columns (numpy from DuckDB, a batch of
sessions at a time, low-cardinality strings as codes into one shared object each), what the
integrations recorded about the model, and the step detail of the few sessions the analysis
needs step by step. :mod:`goodtrace.read.duckdb_sql` fills the tables."""

from __future__ import annotations

import bisect
import weakref
from array import array
from collections.abc import Callable, Iterable, Iterator, MutableMapping, Sequence
from typing import Any

from goodtrace.columns import array_of, order_of, per_session
from goodtrace.read.duckdb_sql import NO_FIRST_T, insert_rows, release_buffers
from goodtrace.read.loaded import NO_TIME, EventColumns, FileRange, Labels, SessionRecords
from goodtrace.read.outermost import adds_to, by_seq, kept_outer, outermost_compute
from goodtrace.read.session_columns import (
    ORDER,
    TABLES,
    KeptColumns,
    KeptSession,
    dtype_of,
    read_kept,
    write_kept,
)
from goodtrace.read.validate import json_object


def by_session(con: Any, sql: str, order: Sequence[str] = ()) -> Iterable[tuple[int, dict[str, Any]]]:
    """``(sid, {column: numpy array})`` per session of a query ordered by sid (its first
    column): the columns come out of DuckDB as arrays in one go, then are cut per session.
    ``order``: the query has no ORDER BY, and its rows are put in the order of these integer
    columns here (``sid`` first; ``-name``: descending; NULL last, as DuckDB orders), the
    rows fetched as they lie (nearly in order: a session's records are), since DuckDB's sort
    of a million rows costs several times their fetch (see :func:`goodtrace.columns.order_of`)."""
    columns = con.execute(sql).fetchnumpy()
    if order:
        import numpy as np

        keys: list[Any] = []
        for spec in order:
            values = columns[spec.lstrip("-")]
            if isinstance(values, np.ma.MaskedArray):
                keys.append(np.ma.getmaskarray(values))  # NULL last
                values = values.filled(0)
            keys.append(~values if spec.startswith("-") else values)  # ~x: x descending, never overflowing
        rows = order_of(*keys)
        del keys
        for name in list(columns):  # one column's two copies at a time, not every column's
            columns[name] = columns[name][rows]
    yield from per_session(columns)


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


def file_ranges(con: Any) -> dict[int, FileRange]:
    """Per file (its number), the earliest and the latest time of its records, on its session's
    clock (``first_t``, ``last_seen``), and the lowest and highest step of its tags, events and
    metrics (:class:`FileRange`): files without a timed record are left out."""
    rows = con.execute(
        "SELECT fid, min(first_t), max(last_seen), min(first_mark_step), max(last_mark_step) FROM summ "
        f"GROUP BY fid HAVING min(first_t) < {NO_FIRST_T}"
    ).fetchall()
    return {int(fid): FileRange(int(first), int(last), lo, hi) for fid, first, last, lo, hi in rows}


_STRINGS: dict[str, str] = {}


def _interned(value: object) -> str:
    """One string object per distinct category or how (millions of them otherwise)."""
    text = str(value)
    return _STRINGS.setdefault(text, text) if len(_STRINGS) < 10_000 else text


def int_column(values: Any) -> array[int]:
    """A numpy integer column (masked where NULL) as an array of int64, NULL as NO_TIME."""
    import numpy as np

    filled = values.filled(NO_TIME) if isinstance(values, np.ma.MaskedArray) else values
    return array_of(filled, "q")


def labels_column(codes: Any, names: Sequence[str]) -> Labels:
    """Codes into ``names`` (a numpy integer column) as :class:`Labels`."""
    import numpy as np

    return Labels(array_of(np.asarray(codes, dtype=np.intc), "i"), names)


SESSION_BATCH = 1024  # sessions whose model rows are fetched together (bounds the columns in flight)


def _vocab(con: Any, table: str, column: str, into: str | None = None, extra: Iterable[str] = ()) -> Any:
    """The distinct strings of a low-cardinality ``column`` (categories, how a sync was taken,
    span names), and ``extra`` ones (those of the kept columns), as one shared Python object
    each, numbered in table ``vocab_<column>`` in their sorted order: queries join it and hand
    out codes, millions of integers instead of millions of strings, and order by a code where
    they would order by the string."""
    import numpy as np

    found = {row[0] for row in con.execute(f"SELECT DISTINCT {column} FROM {table}").fetchall()} | set(extra)
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

    def __init__(self, con: Any, count: int, rows: Sequence[int], cleanup: Callable[[], None],
                 vocab: tuple[Any, Any, Any], kept: KeptColumns | None = None) -> None:
        self._con: Any = con
        self._count = count
        self._cleanup = cleanup
        self._finalizer = weakref.finalize(self, _close_connection, con, cleanup)
        self._set: dict[int, SessionRecords] = {}
        self._block: dict[int, SessionRecords] = {}
        self._fetched = -1  # the last block fetched whole
        self._next = -1  # the session after the last ones fetched
        self._vocab = vocab
        self._kept = kept
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
            # sessions last): it alone is fetched, not its block again; but revisits that walk
            # the sessions in order (a view cutting every rank again, a second analysis) fetch
            # the rest of the block once the walk is seen (one query a session made 1,600 ranks
            # take 30 s)
            if k > self._fetched:
                lo = self._starts[k]
            else:
                lo, hi = sid, (hi if sid == self._next else sid + 1)
            self._fetched = max(self._fetched, k)
            self._next = hi
            self._block = {}  # the previous block's columns go first
            self._block = _fetch_records(self._con, range(lo, hi), self._vocab, self._kept)
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


def model_vocab(con: Any, kept: KeptColumns | None = None) -> tuple[Any, Any, Any]:
    """The codes of how a sync was taken, of span categories and of span names (with the values
    of the kept columns), numbered in DuckDB's ``vocab_*`` tables for the fetch to join."""
    return (_vocab(con, "m_syncs", "how", extra=kept.vocab("how") if kept else ()),
            _vocab(con, "m_spans", "cat", extra=kept.vocab("cat") if kept else ()),
            _vocab(con, "m_starts", "name"))


def fill_compute(con: Any, rows: Sequence[int], vocab: tuple[Any, Any, Any], kept: KeptColumns | None = None) -> None:
    """Table ``m_compute`` (sid, seq, ns): each session's outermost compute per execution
    (:func:`outermost_compute`), from its compute spans (``seg_compute``, dropped after) and
    its executions, a block of sessions at a time (:func:`session_blocks`; ``rows``: each
    session's executions), before the analysis holds anything. With ``kept``: each session's
    kept columns joined to its rows in DuckDB, and those of its files closed since written
    into the new kept file (``kept.closing``: :func:`_keep_closing`); a session whose kept
    outermost compute the new spans add to (:func:`adds_to`) has only what they add put aside
    (``kept.compute_added``), joined to the kept result when it is fetched (:func:`_kept_compute`),
    not its million rows put into DuckDB and fetched back."""
    import numpy as np

    con.execute("CREATE OR REPLACE TABLE m_compute (sid INTEGER, seq BIGINT, ns BIGINT)")
    starts = session_blocks(len(rows), rows)
    for k, lo in enumerate(starts):
        hi = starts[k + 1] - 1 if k + 1 < len(starts) else len(rows) - 1
        where = f"sid BETWEEN {int(lo)} AND {int(hi)}"
        if kept is not None:
            _keep_closing(con, kept, [sid for sid in sorted(kept.closing) if lo <= sid <= hi], vocab)
        # the compute spans of the files kept columns are of: only where the kept outermost
        # compute cannot be used (below)
        tables = _block_tables(con, where, ("steps", "compute"), range(lo, hi + 1), vocab, kept, join=("steps",))
        sids, seqs, totals = [], [], []
        for sid in range(lo, hi + 1):
            mine = tables.pop(sid, None)
            if mine is None:
                continue
            e, c = mine["steps"], mine["compute"]
            held = kept.sessions.get(sid) if kept is not None else None
            outer = read_kept(held, {"outer": ("bounds",)}, {})["outer"] if held is not None else None
            if outer is not None and not adds_to(outer["bounds"], e["t0"], c["t0"]):
                c = read_kept(held, {"compute": TABLES["compute"]}, {}, then=mine)["compute"]  # type: ignore[arg-type]
                outer = None
            if not len(c["t0"]) and outer is None:
                continue
            seq, ns = outermost_compute(c["t0"], c["t1"], np.ma.MaskedArray(c["step"], mask=c["nostep"]),
                                        e["seq"], e["step"], e["t0"],
                                        reach=int(outer["bounds"][0]) if outer is not None else None)
            del mine, e, c
            if outer is not None and kept is not None:  # the kept ones are joined when the session is fetched
                kept.compute_added[sid] = (seq, ns)
                continue
            del outer
            if not len(seq):
                continue
            sids.append(np.full(len(seq), sid, dtype=np.int32))
            seqs.append(seq)
            totals.append(ns)
        del tables
        if sids:  # the block's rows in one insert (a wide run has thousands of short sessions)
            con.register("compute_part", {"sid": np.concatenate(sids), "seq": np.concatenate(seqs),
                                          "ns": np.concatenate(totals)})
            con.execute("INSERT INTO m_compute SELECT sid, seq, ns FROM compute_part")
            con.unregister("compute_part")
    con.execute("DROP TABLE seg_compute")


_BLOCK_SQL = {
    "steps": "SELECT sid, seq, step, t0, t1 FROM m_steps WHERE {where}",
    "syncs": "SELECT t.sid, t.seq, t.step, t.t, v.code AS how FROM m_syncs t JOIN vocab_how v "
             "ON t.how IS NOT DISTINCT FROM v.how WHERE t.{where}",
    "spans": "SELECT t.sid, v.code AS cat, t.t0, t.t1, t.step FROM m_spans t JOIN vocab_cat v "
             "ON t.cat IS NOT DISTINCT FROM v.cat WHERE t.{where}",
    "compute": "SELECT sid, t0, t1, step FROM seg_compute WHERE {where}",
}


def _block_tables(
    con: Any, where: str, tables: Sequence[str], sids: Iterable[int], vocab: tuple[Any, Any, Any],
    kept: KeptColumns | None, *, join: Sequence[str] | None = None,
) -> dict[int, dict[str, dict[str, Any]]]:
    """Per session of ``sids`` (those of ``where``) with rows, the long ``tables`` (of
    :data:`~goodtrace.read.session_columns.TABLES`) as plain columns in their order (NULL as
    NO_TIME; a compute span's missing step in ``nostep``): the session's kept columns, then the
    rows DuckDB holds of its other files (``join``: the tables given so, None every one; the
    others only the rows DuckDB holds)."""
    import numpy as np

    wanted = list(sids)
    out: dict[int, dict[str, dict[str, Any]]] = {sid: {} for sid in wanted}
    codes = {"how": [str(v) for v in vocab[0].tolist()], "cat": [str(v) for v in vocab[1].tolist()]}
    covered = sorted({fid for sid in wanted if kept is not None and (mine := kept.sessions.get(sid)) is not None
                      for fid in mine.fids.tolist()})
    if covered:  # the rows of the files kept columns are of (DuckDB holds them in the load that keeps them)
        where = f"{where} AND fid NOT IN ({', '.join(str(fid) for fid in covered)})"
    for table in tables:
        columns = TABLES[table]
        # the fetch's order: a compute span's step NULL last, as ``nostep`` then ``step`` order
        order = ["sid", *(spec for spec in ORDER[table] if spec != "nostep")]
        for sid, c in by_session(con, _BLOCK_SQL[table].format(where=where), order):
            if sid not in out:
                continue
            cols = {}
            for column in columns:
                if column == "nostep":
                    cols[column] = np.ma.getmaskarray(c["step"])
                    continue
                values = c[column]
                if isinstance(values, np.ma.MaskedArray):
                    values = values.filled(0 if table == "compute" else NO_TIME)
                cols[column] = np.asarray(values, dtype=dtype_of(column))
            out[sid][table] = cols
        for sid in wanted:
            if table not in out[sid]:
                out[sid][table] = {column: np.zeros(0, dtype=dtype_of(column)) for column in columns}
    if kept is not None:
        for sid in wanted:
            mine = kept.sessions.get(sid)
            if mine is None:
                continue
            for table in tables if join is None else join:  # a table at a time: its kept columns joined to the fetched ones
                out[sid][table] = read_kept(mine, {table: TABLES[table]}, codes, then=out[sid])[table]
    return {sid: mine_ for sid, mine_ in out.items() if any(len(cols[TABLES[t][0]]) for t, cols in mine_.items())}


def _keep_closing(con: Any, kept: KeptColumns, sids: Sequence[int], vocab: tuple[Any, Any, Any]) -> None:
    """For each of ``sids`` (sessions in ``kept.closing``): its kept columns with the rows of
    its files closed since, written as its new kept file, which the rest of the load uses, with
    the outermost compute of its executions there (:func:`kept_outer`). A session and a table
    at a time: its rows of those files fetched, joined to its kept ones, written, released."""
    import numpy as np

    codes = {"how": [str(v) for v in vocab[0].tolist()], "cat": [str(v) for v in vocab[1].tolist()]}
    for sid in sids:
        joining, files = kept.closing.pop(sid)
        ending = np.array(sorted(joining), dtype=np.int64)
        previous = kept.sessions.get(sid)
        where = f"sid = {int(sid)} AND fid IN ({', '.join(str(f) for f in ending.tolist())})"

        def tables(sid: int = sid, where: str = where, previous: KeptSession | None = previous) -> Iterator[tuple[str, Any]]:
            steps: dict[str, Any] = {}
            for table in TABLES:
                closing = _block_tables(con, where, (table,), [sid], vocab, None).get(sid, {}).get(table)
                if closing is None:
                    closing = {column: np.zeros(0, dtype=dtype_of(column)) for column in TABLES[table]}
                joined = (closing if previous is None else
                          read_kept(previous, {table: TABLES[table]}, codes, then={table: closing})[table])
                del closing
                yield table, joined
                if table == "steps":  # what the outermost compute of the kept executions reads
                    steps = {column: joined[column] for column in ("seq", "step", "t0")}
                elif table == "compute":
                    outer = kept_outer(steps, joined)
                    del steps, joined
                    yield "outer", outer

        path = write_kept(kept.folder, kept.names[sid], kept.version, files, codes, tables())
        if path is None:
            continue
        covered = ending if previous is None else np.union1d(previous.fids, ending)
        kept.sessions[sid] = KeptSession(path, [f.entry() for f in files], covered,
                                         {k: tuple(v) for k, v in codes.items()})


def _close_connection(con: Any, cleanup: Callable[[], None]) -> None:
    con.close()
    cleanup()


BLOCK_ROWS = 500_000  # step executions whose columns are fetched together (a longer session alone)


def session_records(con: Any, sids: Iterable[int]) -> dict[int, SessionRecords]:
    """Every session's :class:`SessionRecords`, as compact columns, fetched for
    :data:`SESSION_BATCH` sessions at a time."""
    return _fetch_records(con, sids, model_vocab(con))


def _fetch_records(con: Any, sids: Iterable[int], vocab: tuple[Any, Any, Any],
                   kept: KeptColumns | None = None) -> dict[int, SessionRecords]:
    out = {sid: SessionRecords() for sid in sids}
    how, cat, name = vocab
    how_names, cat_names = how.tolist(), cat.tolist()
    for lo, hi in _sid_ranges(sorted(out), SESSION_BATCH):
        where = f"sid BETWEEN {int(lo)} AND {int(hi)}"
        for table in ("steps", "syncs", "spans"):  # a table at a time: its columns, then their compact copies
            tables = _block_tables(con, where, (table,), range(lo, hi + 1), vocab, kept)
            for sid in range(lo, hi + 1):
                mine = tables.pop(sid, None)
                if mine is None or sid not in out:
                    continue
                r, c = out[sid], mine[table]
                if table == "steps":
                    r.step_seq, r.step_number = int_column(c["seq"]), int_column(c["step"])
                    r.step_t0, r.step_t1 = int_column(c["t0"]), int_column(c["t1"])
                elif table == "syncs":
                    r.sync_seq, r.sync_step, r.sync_t = int_column(c["seq"]), int_column(c["step"]), int_column(c["t"])
                    r.sync_how = labels_column(c["how"], how_names)
                else:
                    r.span_category = labels_column(c["cat"], cat_names)
                    r.span_t0, r.span_t1, r.span_step = int_column(c["t0"]), int_column(c["t1"]), int_column(c["step"])
                del mine, c
            del tables
        for sid, c in by_session(con, f"SELECT sid, seq, ns FROM m_compute WHERE {where}", ("sid", "seq")):
            out[sid].compute_seq, out[sid].compute_ns = int_column(c["seq"]), int_column(c["ns"])
        if kept is not None:
            for sid in range(lo, hi + 1):
                if sid in out and sid in kept.compute_added:
                    out[sid].compute_seq, out[sid].compute_ns = _kept_compute(kept, sid)
        for sid, c in by_session(
            con, f"SELECT t.sid, t.step, v.code AS name, t.t0 FROM (SELECT sid, step, name, min(t0) AS t0 "
                 f"FROM m_starts WHERE {where} GROUP BY ALL) t JOIN vocab_name v ON t.name IS NOT DISTINCT FROM v.name "
                 "ORDER BY t.sid, t.step, t.name"
        ):
            r = out[sid]
            r.starts_step, r.starts_name, r.starts_t0 = int_column(c["step"]), name[c["name"]].tolist(), int_column(c["t0"])
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


def _kept_compute(kept: KeptColumns, sid: int) -> tuple[array[int], array[int]]:
    """Session ``sid``'s outermost compute: its kept executions' (read from its kept file) and
    what the new files' spans add (``kept.compute_added``), summed by seq."""
    seq, ns = kept.compute_added[sid]
    c = read_kept(kept.sessions[sid], {"outer": ("seq", "ns")}, {}, then={"outer": {"seq": seq, "ns": ns}})["outer"]
    joined_seq, joined_ns = by_seq(c["seq"], c["ns"])  # summed where a kept execution gains compute
    return int_column(joined_seq), int_column(joined_ns)


def model_events(con: Any) -> dict[int, dict[str, Any]]:
    """Per session, the attributes of the last ``model`` event the framework integration
    recorded (the one fetch of it: ``SessionDetail.model``)."""
    return {int(sid): _json_object(attrs) for sid, attrs in con.execute(
        "SELECT sid, arg_max(attrs, (t, coalesce(attrs, ''))) FROM m_model WHERE name = 'model' GROUP BY sid"
    ).fetchall()}


def _json_object(text: object) -> dict[str, Any]:
    return json_object(text) or {}
