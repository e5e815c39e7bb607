"""The reference sessions' step detail (tags, metric values, span time per step and name, FLOPs
metrics, events) as numpy columns, put in order and summed in one place (:func:`combine`),
and kept per session for its closed files beside the segment cache (:func:`load_kept`,
:func:`keep`), so that re-reporting a growing run fetches from DuckDB only the detail of the
files written since.

Why a session's columns and not only each file's rows: the segment cache keeps each closed
file's detail rows (kind ``detail``), but a re-report loaded all of them into DuckDB again,
fetched them out and ordered them: at 1 M steps, 4 M rows and about 2 s of a 6 s re-read. The
columns kept here are what :func:`combine` made of the closed files, so a re-report reads one
file of plain arrays and combines it with the new files' rows. :func:`combine` is associative
(its order is total on what it outputs; sums and minima are exact), so the columns of the closed
files combined again with the rest equal the combination of every file at once (a test holds a
re-report to the cold one, byte for byte)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from goodtrace.columns import empty, order_of, per_session
from goodtrace.read import session_columns
from goodtrace.read.chunk_files import FileIdentity
from goodtrace.read.duckdb_sql import insert_rows
from goodtrace.read.session_columns import KeptChanged
from goodtrace.record.errors import warn

__all__ = ["DetailColumns", "KeptFile", "combine", "fetch_detail", "keep", "load_kept", "prune_kept", "vocabulary"]

# each table's columns; ``name`` holds codes into the vocabulary (events: the name itself)
TABLES: dict[str, tuple[str, ...]] = {
    "tags": ("t", "step", "name"),
    "metrics": ("t", "step", "name", "value"),
    "spans": ("step", "name", "ns", "first"),
    "flops": ("t", "value"),
    "events": ("t", "step", "nostep", "name", "attrs"),
}
_DTYPES = {"t": "int64", "step": "int64", "name": "int32", "value": "float64", "ns": "int64", "first": "int64",
           "nostep": "bool", "attrs": "object"}
_OBJECTS = {("events", "name"), ("events", "attrs")}
KEPT_FORMAT = 1
PREFIX = "detail-"


def _dtype(table: str, column: str) -> Any:
    import numpy as np

    return np.dtype(object) if (table, column) in _OBJECTS else np.dtype(_DTYPES[column])


def _empty(table: str) -> dict[str, Any]:
    import numpy as np

    return {column: np.zeros(0, dtype=_dtype(table, column)) for column in TABLES[table]}


@dataclasses.dataclass
class DetailColumns:
    """One session's detail: per table (:data:`TABLES`), columns of equal length; ``names``:
    what the ``name`` codes of tags, metrics and spans stand for (sorted)."""

    names: tuple[str, ...] = ()
    tables: dict[str, dict[str, Any]] = dataclasses.field(default_factory=lambda: {t: _empty(t) for t in TABLES})
    combined: bool = False  # made by combine(): each table in its order, spans summed
    # columns kept in a file (:func:`load_kept`) and not read yet: :func:`combine` reads each
    # table's into the arrays it joins them in (``tables`` is then empty)
    unread: KeptFile | None = None

    def rows(self, table: str) -> int:
        if self.unread is not None:
            return self.unread.rows(table)
        return len(self.tables[table][TABLES[table][0]])


@dataclasses.dataclass(frozen=True)
class KeptFile:
    """A file of kept columns as :func:`load_kept` found it (its header checked, no array read)."""

    path: str
    head: dict[str, Any]
    names: tuple[str, ...]

    def rows(self, table: str) -> int:
        return int(self.head["arrays"][f"{table}.{TABLES[table][0]}"][2])

    def check(self) -> None:
        """Raises :class:`~goodtrace.read.session_columns.KeptChanged` when the file is not the
        one found any more (another report replaced it). :func:`combine` checks before it reads
        the tables and after: a file replaced between would not be the same at both ends."""
        try:
            if session_columns.read_head(self.path) != self.head:
                raise KeptChanged(self.path)
        except (OSError, ValueError) as exc:
            raise KeptChanged(f"{self.path}: {exc}") from None

    def read(self, table: str, names: tuple[str, ...], then: Mapping[str, Any] | None) -> dict[str, Any]:
        """``table``'s kept columns, codes into ``names`` (which holds the file's), each followed
        by ``then``'s column (the other parts' rows) in one array. Raises
        :class:`~goodtrace.read.session_columns.KeptChanged` when it cannot be read whole, or its
        codes are not the file's names (damaged): the run is then read without it."""
        import numpy as np

        wanted = [column for column in TABLES[table] if (table, column) not in _OBJECTS]
        after = {f"{table}.{column}": then[column] for column in wanted} if then is not None else None
        try:
            arrays = session_columns.read_arrays(self.path, self.head, [f"{table}.{c}" for c in wanted], after)
        except (OSError, ValueError, KeyError) as exc:
            raise KeptChanged(f"{self.path}: {exc}") from None
        out = {column: arrays.pop(f"{table}.{column}") for column in wanted}
        kept = self.rows(table)
        if "name" in out and table != "events" and kept:
            codes = out["name"][:kept]
            try:
                recoded = session_columns.recode(codes, self.names, names)
            except session_columns.ColumnFileError:
                warn(f"the kept step detail {self.path} cannot be read (a name code out of range); ignored (read again)")
                raise KeptChanged(f"{self.path}: a name code out of range") from None
            if recoded is not codes:
                codes[:] = recoded
        if table == "events":
            events = self.head["events"]
            for column, k in (("name", 0), ("attrs", 1)):
                objects = np.empty(kept + (len(then[column]) if then is not None else 0), dtype=object)
                objects[:kept] = [e[k] for e in events]
                if then is not None:
                    objects[kept:] = then[column]
                out[column] = objects
        return {column: out[column] for column in TABLES[table]}


def vocabulary(parts: Iterable[DetailColumns]) -> tuple[str, ...]:
    """Every name of ``parts``, sorted (codes then order as the names do)."""
    found: set[str] = set()
    for part in parts:
        found.update(part.names)
    return tuple(sorted(found))


def _sortable(values: Any) -> Any:
    """float64 values as int64 keys in the same order (NaN last, as DuckDB orders)."""
    import numpy as np

    bits = np.asarray(values, dtype=np.float64).view(np.int64)
    return bits ^ ((bits >> 63) & np.int64(0x7FFF_FFFF_FFFF_FFFF))


def combine(parts: Sequence[DetailColumns], names: tuple[str, ...], *, consume: bool = False) -> DetailColumns:
    """The detail of ``parts`` (of one session: its files' rows, or columns combined before)
    as one, its codes into ``names`` (which holds every part's): tags in the order of (time,
    name, step), metric values of (time, name, value, step), each span name's time summed per
    step in the order of (step, name) with its earliest start, FLOPs values of (time, value),
    events of (time, name, step, attributes; no step and no attributes last). A sum past
    INT64 is an error (``duckdb.ConversionException``, as DuckDB's cast of it said).

    Each part is put in order alone (a part combined before already is) and the parts are
    joined end to end when each begins where the one before ends, as the columns kept of a
    session's closed files and the rows of the files written since do: a re-report then
    reads the long kept columns (a first part not read yet, :attr:`DetailColumns.unread`)
    straight into the arrays that join them to the rest, rather than reading, copying or
    sorting and gathering them again. Else the
    parts are put in order together; either way the result is the same, rows that tie keeping
    the parts' order. ``consume``: each part's table is let go as it is taken (the caller holds
    the parts for this only), so that its columns and their ordered copies are not all held."""
    import numpy as np

    out = DetailColumns(names, combined=True)
    parts = list(parts)
    unread = parts[0].unread if parts else None  # kept columns first: read joined to the rest
    if unread is not None:
        unread.check()
    for k in range(1 if unread is not None else 0, len(parts)):
        if parts[k].unread is not None:  # (kept columns after others: read alone, then combined)
            parts[k] = combine([parts[k]], parts[k].names)
    for table, columns in TABLES.items():
        runs: list[dict[str, Any]] = []
        for part in parts[1 if unread is not None else 0:]:
            if not part.rows(table):
                continue
            cols = dict(part.tables[table])
            if consume:
                part.tables[table] = _empty(table)
            if "name" in cols and table != "events":
                cols["name"] = session_columns.recode(cols["name"], part.names, names)
            runs.append(cols if part.combined else _ordered(table, cols))
        lengths = [len(run[columns[0]]) for run in runs]
        if unread is not None and unread.rows(table):
            tail = {column: _joined([run[column] for run in runs]) for column in columns} if runs else None
            joined = unread.read(table, names, tail)
            lengths.insert(0, unread.rows(table))
        elif len(runs) == 1:
            joined = runs[0]
        elif runs:
            joined = {column: _joined([run[column] for run in runs]) for column in columns}
        else:
            out.tables[table] = _empty(table)
            continue
        ends = np.cumsum(lengths).tolist()
        if len(ends) == 1:
            out.tables[table] = joined
        elif all(_key(table, joined, end - 1) <= _key(table, joined, end) for end in ends[:-1]):
            out.tables[table] = _summed(joined) if table == "spans" else joined
        else:
            out.tables[table] = _ordered(table, joined)
    if unread is not None:
        unread.check()
    return out


def _joined(runs: Sequence[Any]) -> Any:
    """``runs`` end to end, into an array the reader's columns can take as they are
    (:func:`~goodtrace.columns.empty`): one copy of the long kept columns, not two."""
    import numpy as np

    out = empty(sum(len(run) for run in runs), np.result_type(*runs))
    at = 0
    for run in runs:
        out[at : at + len(run)] = run
        at += len(run)
    return out


def _key(table: str, c: dict[str, Any], i: int) -> tuple[Any, ...]:
    """Row ``i``'s place in its table's order (see :func:`combine`)."""
    if table == "events":
        attrs = c["attrs"][i]
        return int(c["t"][i]), str(c["name"][i]), bool(c["nostep"][i]), int(c["step"][i]), attrs is None, attrs or ""
    if table == "tags":
        return int(c["t"][i]), int(c["name"][i]), int(c["step"][i])
    if table == "metrics":
        return int(c["t"][i]), int(c["name"][i]), int(_sortable(c["value"][i : i + 1])[0]), int(c["step"][i])
    if table == "flops":
        return int(c["t"][i]), int(_sortable(c["value"][i : i + 1])[0])
    return int(c["step"][i]), int(c["name"][i])


def _ordered(table: str, c: dict[str, Any]) -> dict[str, Any]:
    """One part's rows of ``table`` in its order (spans summed per step and name)."""
    import numpy as np

    if not len(c[TABLES[table][0]]):
        return c
    if table == "events":
        keys = [_key(table, c, i) for i in range(len(c["t"]))]
        order: Any = np.array(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.int64)
    elif table == "tags":
        order = order_of(c["t"], c["name"], c["step"])
    elif table == "metrics":
        order = order_of(c["t"], c["name"], _sortable(c["value"]), c["step"])
    elif table == "flops":
        order = order_of(c["t"], _sortable(c["value"]))
    else:
        order = order_of(c["step"], c["name"])
    c = dict(c)
    for column in list(c):  # one column's two copies at a time
        c[column] = c[column][order]
    if table == "spans":
        c = _summed(c)
    return c


def _summed(c: dict[str, Any]) -> dict[str, Any]:
    """Span rows ordered by (step, name), one per (step, name): time summed, earliest start."""
    import duckdb
    import numpy as np

    step, name, ns = c["step"], c["name"], c["ns"]
    if len(step) < 2:
        return c
    new = np.ones(len(step), dtype=bool)
    new[1:] = (step[1:] != step[:-1]) | (name[1:] != name[:-1])
    if new.all():
        return c
    starts = np.flatnonzero(new)
    del new
    sizes = np.diff(starts, append=len(step))
    shared = sizes > 1  # the (step, name) rows of two files or more: summed
    rows = np.flatnonzero(np.repeat(shared, sizes))
    exact = np.add.reduceat(ns[rows].astype(np.float64), np.cumsum(sizes[shared]) - sizes[shared])
    if float(exact.max()) >= 2.0**63:  # as DuckDB's cast of the sum would say
        raise duckdb.ConversionException("a span time summed over a step is out of range for INT64")
    return {"step": step[starts], "name": name[starts], "ns": np.add.reduceat(ns, starts),
            "first": np.minimum.reduceat(c["first"], starts)}


def take(columns: DetailColumns, keep_fid: Mapping[str, Any]) -> DetailColumns:
    """The rows of ``columns`` where each table's boolean column ``keep_fid[table]`` is true."""
    return DetailColumns(columns.names, {table: {column: values[keep_fid[table]] for column, values in cols.items()}
                                         for table, cols in columns.tables.items()}, columns.combined)


# ------------------------------------------------------------------------------- from DuckDB
_QUERIES = {
    "tags": "SELECT d.sid, d.fid, d.t, d.step, v.code AS name FROM det_tags d JOIN vocab_detail v ON d.name = v.name",
    "metrics": "SELECT d.sid, d.fid, d.t, d.step, v.code AS name, d.value FROM det_metrics d "
               "JOIN vocab_detail v ON d.name = v.name",
    "spans": "SELECT d.sid, d.fid, d.step, v.code AS name, d.ns, d.first FROM det_spans d "
             "JOIN vocab_detail v ON d.name = v.name",
    "flops": "SELECT sid, fid, t, value FROM det_flops",
}


def fetch_detail(con: Any, sids: Iterable[int]) -> dict[int, tuple[DetailColumns, dict[str, Any]]]:
    """The rows of the ``det_*`` tables of ``sids`` as they lie, per session: its
    :class:`DetailColumns` (not combined) and each table's ``fid`` column."""
    import numpy as np

    wanted = sorted(set(sids))
    found = [row[0] for row in con.execute(
        "SELECT DISTINCT name FROM (SELECT name FROM det_tags UNION ALL SELECT name FROM det_metrics "
        "UNION ALL SELECT name FROM det_spans)").fetchall()]
    names = tuple(sorted(str(n) for n in found))
    con.execute("CREATE OR REPLACE TEMP TABLE vocab_detail (name VARCHAR, code INTEGER)")
    insert_rows(con, "vocab_detail", [(n, k) for k, n in enumerate(names)])
    out = {sid: (DetailColumns(names), {table: np.zeros(0, dtype=np.int64) for table in TABLES}) for sid in wanted}
    for table, sql in _QUERIES.items():
        c = con.execute(sql).fetchnumpy()
        _split(out, table, {k: np.asarray(v) for k, v in c.items()})
    rows = con.execute("SELECT sid, fid, t, step, name, attrs FROM det_events").fetchall()
    if rows:
        sid, fid, t, step, name, attrs = zip(*rows, strict=True)
        events = {"sid": np.array(sid, dtype=np.int64), "fid": np.array(fid, dtype=np.int64),
                  "t": np.array(t, dtype=np.int64), "step": np.array([s or 0 for s in step], dtype=np.int64),
                  "nostep": np.array([s is None for s in step], dtype=bool)}
        events["name"] = np.empty(len(rows), dtype=object)
        events["name"][:] = [str(n) for n in name]
        events["attrs"] = np.empty(len(rows), dtype=object)
        events["attrs"][:] = list(attrs)
        _split(out, "events", events)
    return out


def _split(out: dict[int, tuple[DetailColumns, dict[str, Any]]], table: str, c: dict[str, Any]) -> None:
    import numpy as np

    sid = c["sid"]
    if len(sid) and not bool((sid == sid[0]).all()):  # stable: each session's rows as they lie
        order = order_of(sid)
        c = {column: values[order] for column, values in c.items()}
    for sid_, rows in per_session(c):
        if sid_ in out:
            columns, fids = out[sid_]
            fids[table] = rows["fid"]
            columns.tables[table] = {column: np.asarray(rows[column], dtype=_dtype(table, column))
                                     for column in TABLES[table]}


# ------------------------------------------------------------------------------- kept columns
def load_kept(folder: str, session: str, version: str) -> tuple[list[dict[str, Any]], DetailColumns] | None:
    """The columns kept for ``session`` (not read yet: :func:`combine` reads them where it joins
    them) and the identities of the files they are of; None when none are kept (or of another
    version); a damaged file (its header) is a warning, and ignored."""
    import numpy as np

    path = session_columns.session_path(folder, PREFIX, session)
    try:
        head = session_columns.read_head(path)
        if head is None:
            return None
        if head.get("format") != KEPT_FORMAT or head.get("version") != version or head.get("session") != session:
            return None
        names = tuple(str(n) for n in head["names"])
        for table, cols in TABLES.items():
            lengths = set()
            for column in cols:
                if (table, column) in _OBJECTS:
                    continue
                dtype, _, length = head["arrays"][f"{table}.{column}"]
                if np.dtype(dtype) != _dtype(table, column):
                    raise ValueError(f"{table}.{column} is {np.dtype(dtype)}")
                lengths.add(length)
            if len(lengths) != 1:
                raise ValueError("columns of unequal length")
        events = head["events"]
        if not isinstance(events, list) or len(events) != head["arrays"]["events.t"][2] \
                or not all(isinstance(e, list) and len(e) == 2 for e in events):
            raise ValueError("the events' names and attributes do not match their columns")
        files = head["files"]
        if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
            raise ValueError("no file list")
        return files, DetailColumns(names, {}, combined=True, unread=KeptFile(path, head, names))
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        warn(f"the kept step detail in {folder} cannot be read ({path}: {exc}); ignored (read again)")
        return None


def keep(folder: str, session: str, version: str, files: Sequence[FileIdentity], columns: DetailColumns) -> None:
    """Keep ``columns`` (combined) as those of ``session``'s ``files``: written aside and renamed
    into place, whole or not at all; a failure to write is a warning."""
    events = columns.tables["events"]
    arrays = [(f"{table}.{column}", values) for table, cols in columns.tables.items()
              for column, values in cols.items() if (table, column) not in _OBJECTS]
    head: dict[str, Any] = {
        "format": KEPT_FORMAT, "version": version, "session": session, "names": list(columns.names),
        "files": [f.entry() for f in files],
        "events": [[n, a] for n, a in zip(events["name"].tolist(), events["attrs"].tolist(), strict=True)],
    }
    try:
        session_columns.write(session_columns.session_path(folder, PREFIX, session), head, [name for name, _ in arrays], arrays)
    except OSError as exc:
        warn(f"the step detail of session {session} cannot be kept in {folder} ({exc})")


def prune_kept(folder: str, sessions: Iterable[str], grace_s: float = session_columns.GRACE_S) -> None:
    """Remove the kept detail of sessions the run no longer has (:func:`session_columns.prune`)."""
    session_columns.prune(folder, PREFIX, sessions, grace_s)
