"""Each session's long run-model columns (its executions, sync points, spans and main-thread
compute spans) kept for its closed files beside the segment cache, so that re-reporting a
growing run takes them from one file of plain arrays and fetches from DuckDB only the rows of
the files written since.

The segment cache keeps each closed file's rows as Parquet (kind ``model``); a re-report loaded
every one of them into DuckDB again (at 2 ranks x 1 M steps, 10 M rows and 1.7 s), fetched them
out per block of sessions and ordered them. With the columns kept here, the closed files'
chunks give DuckDB only their small tables (the summaries, device values, clock offsets,
events, the model's attributes, the span-start sample), and each session's columns are the
kept ones followed by the new files' rows, joined end to end where they follow each other, as
a growing session's do (else put in order together: :func:`read_kept`; either way the same
columns, in the order the fetch gives them, a test holds).

A session's file is replaced whole (written aside, renamed) when more of its files have
closed; the reader checks, when it reads the arrays, that the file still covers the files it
decided on (a report running beside it may have replaced it: then it says so, and the run is
read again); rows of the files a kept file covers are dropped from what DuckDB gives."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from goodtrace.columns import order_of
from goodtrace.read import column_file
from goodtrace.read.chunk_files import FileIdentity
from goodtrace.read.loaded import LoadError
from goodtrace.record.errors import warn

__all__ = ["KEPT", "KeptColumns", "KeptSession", "find_kept", "prune_kept", "read_kept", "write_kept"]

NO_VALUE = -(2**63)  # a NULL in an integer column (loaded.NO_TIME)

# each table's columns as kept (plain int64 but the codes of how and cat, and nostep), and the
# order of its rows ("-x": x descending; nostep before step: a span without a step last)
TABLES: dict[str, tuple[str, ...]] = {
    "steps": ("seq", "step", "t0", "t1"),
    "syncs": ("seq", "step", "t", "how"),
    "spans": ("cat", "t0", "t1", "step"),
    "compute": ("t0", "t1", "step", "nostep"),
}
ORDER: dict[str, tuple[str, ...]] = {
    "steps": ("seq", "t0"),
    "syncs": ("t", "seq", "step"),
    "spans": ("t0", "-t1", "cat"),
    "compute": ("t0", "-t1", "nostep", "step"),
}
# what is kept beside the tables, made of them: the outermost compute of the kept executions
# (model_fetch.kept_outer: each execution's ns, by seq; its bounds: the latest end and start of
# the kept compute spans, and how many kept executions entered at or before that end), which a
# re-report adds the new files' compute spans to, when they cannot change it
DERIVED: dict[str, tuple[str, ...]] = {"outer": ("seq", "ns", "bounds")}
KEPT = TABLES | DERIVED
CODED = {"how": "syncs", "cat": "spans"}  # code column -> its table
KEPT_FORMAT = 3  # 3: no sync "after" column (no view reads it)
PREFIX = "columns-"


class KeptChanged(LoadError):
    """A kept file was replaced or removed after this report decided to use it (by a report
    running beside it)."""

    def __init__(self, what: str) -> None:
        super().__init__(f"the columns kept in the cache changed while it was read, by another report ({what}); "
                         "report again")


def dtype_of(column: str) -> Any:
    import numpy as np

    return np.dtype(np.int32 if column in CODED else bool if column == "nostep" else np.int64)


@dataclasses.dataclass
class KeptSession:
    """A session's kept file as this report decided to use it."""

    path: str
    files: list[dict[str, Any]]  # the identities of the files it is of
    fids: Any  # their numbers in this load (sorted int64)
    vocab: dict[str, tuple[str, ...]]  # what its codes of how and cat stand for


@dataclasses.dataclass
class KeptColumns:
    """What a load keeps and uses: the kept files in use (by session number), the sessions
    whose newly closed files join theirs (``closing``: those files' numbers, and the
    identities of every file the new kept file will be of), and the session names."""

    folder: str
    version: str
    names: dict[int, str]
    sessions: dict[int, KeptSession] = dataclasses.field(default_factory=dict)
    closing: dict[int, tuple[list[int], list[FileIdentity]]] = dataclasses.field(default_factory=dict)
    # per session whose kept outermost compute the new files' spans add to: the (seq, ns) they
    # add, joined to the kept ones when the session is fetched (not a round trip through DuckDB)
    compute_added: dict[int, tuple[Any, Any]] = dataclasses.field(default_factory=dict)

    def covered(self) -> set[int]:
        """The files the kept files in use hold the long columns of."""
        return {fid for kept in self.sessions.values() for fid in kept.fids.tolist()}

    def vocab(self, column: str) -> set[str]:
        """Every value of ``column`` (how, cat) the kept files in use hold codes of."""
        return {value for kept in self.sessions.values() for value in kept.vocab.get(column, ())}


def find_kept(
    folder: str, version: str, names: Mapping[int, str], files_of: Mapping[int, Sequence[tuple[int, FileIdentity]]],
) -> dict[int, KeptSession]:
    """The kept files of the sessions ``names`` (number -> name) that are of files the session
    has as they were (``files_of``: per session, its files' numbers and identities now); a
    damaged one is a warning and is not used."""
    import numpy as np

    found: dict[int, KeptSession] = {}
    for sid, session in names.items():
        path = column_file.session_path(folder, PREFIX, session)
        try:
            head = column_file.read_head(path)
            if head is None or head.get("format") != KEPT_FORMAT or head.get("version") != version \
                    or head.get("session") != session:
                continue
            entries, vocab = head["files"], head["vocab"]
            if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries) \
                    or not isinstance(vocab, dict):
                raise ValueError("no file list")
            for table, columns in KEPT.items():
                for column in columns:
                    dtype = head["arrays"][f"{table}.{column}"][0]
                    if np.dtype(dtype) != dtype_of(column):
                        raise ValueError(f"{table}.{column} is {dtype}")
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            warn(f"the kept columns in {folder} cannot be read ({path}: {exc}); ignored (read again)")
            continue
        now = {ident.path: (fid, ident) for fid, ident in files_of.get(sid, ())}
        fids: list[int] = []
        for entry in entries:
            here = now.get(str(entry.get("path")))
            if here is None or not here[1].matches(entry):
                break
            fids.append(here[0])
        else:
            if fids and len(set(fids)) == len(fids):
                found[sid] = KeptSession(path, entries, np.array(sorted(fids), dtype=np.int64),
                                         {k: tuple(str(v) for v in vocab.get(k, ())) for k in CODED})
    return found


def read_kept(kept: KeptSession, tables: Mapping[str, Iterable[str]], vocab: Mapping[str, Sequence[str]], *,
              then: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """The columns ``tables`` (table -> columns) of a kept file, codes into ``vocab`` (column ->
    every value, sorted: the fetch's); with ``then`` (table -> fetched columns, in order), each
    table's kept rows joined to those rows (end to end when they follow each other, else put in
    order together; ties: the kept rows first, as one stable sort of both gives), read into one array a column.
    Raises :class:`KeptChanged` when the file is not the one decided on any more, or its codes
    are not of its vocabulary (damaged)."""
    after = {f"{table}.{column}": then[table][column] for table, columns in tables.items()
             for column in columns} if then is not None else None
    try:
        head = column_file.read_head(kept.path)
        if head is None or head.get("files") != kept.files:
            raise KeptChanged(kept.path)
        wanted = [f"{table}.{column}" for table, columns in tables.items() for column in columns]
        arrays = column_file.read_arrays(kept.path, head, wanted, after)
    except (OSError, ValueError, KeyError) as exc:
        raise KeptChanged(f"{kept.path}: {exc}") from None
    out: dict[str, dict[str, Any]] = {}
    for table, columns in tables.items():
        out[table] = {}
        added = len(next(iter(then[table].values()))) if then is not None and then[table] else 0
        for column in columns:
            values = arrays.pop(f"{table}.{column}")
            mine = values[:len(values) - added]
            if column in CODED and len(mine):
                try:
                    recoded = column_file.recode(mine, kept.vocab[column], vocab[column])
                except column_file.ColumnFileError as exc:
                    raise KeptChanged(f"{kept.path}: {column}: {exc}") from None
                if recoded is not mine:
                    mine[:] = recoded
            out[table][column] = values
        if then is not None and table in ORDER:  # a derived table's caller joins it (model_fetch.by_seq)
            out[table] = _in_order(table, out[table], len(out[table][TABLES[table][0]]) - added)
    return out


def _keys(table: str, c: Mapping[str, Any]) -> list[Any]:
    return [~c[spec[1:]] if spec.startswith("-") else c[spec] for spec in ORDER[table]]


def _key_at(table: str, c: Mapping[str, Any], i: int) -> tuple[int, ...]:
    return tuple(~int(c[spec[1:]][i]) if spec.startswith("-") else int(c[spec][i]) for spec in ORDER[table])


def _in_order(table: str, joined: dict[str, Any], n: int) -> dict[str, Any]:
    """``joined``, whose rows before ``n`` and from ``n`` on are each in order, in order."""
    if n <= 0 or n >= len(joined[TABLES[table][0]]) or _key_at(table, joined, n - 1) <= _key_at(table, joined, n):
        return joined
    order = order_of(*_keys(table, joined))
    return {column: values[order] for column, values in joined.items()}


def write_kept(folder: str, session: str, version: str, files: Sequence[FileIdentity],
               vocab: Mapping[str, Sequence[str]], tables: Iterable[tuple[str, Mapping[str, Any]]]) -> str | None:
    """Keep the tables ``tables`` yields (table, its every column of :data:`KEPT`, in order;
    codes into ``vocab``), in the order of :data:`KEPT`, a table held at a time, as those of
    ``session``'s ``files``; returns its path, None (a warning) when it cannot be written."""
    head = {"format": KEPT_FORMAT, "version": version, "session": session, "files": [f.entry() for f in files],
            "vocab": {k: list(v) for k, v in vocab.items()}}
    names = [f"{table}.{column}" for table, columns in KEPT.items() for column in columns]

    def arrays() -> Iterator[tuple[str, Any]]:
        for table, columns in tables:
            for column in KEPT[table]:
                yield f"{table}.{column}", columns[column]

    path = column_file.session_path(folder, PREFIX, session)
    try:
        column_file.write(path, head, names, arrays())
    except OSError as exc:
        warn(f"the columns of session {session} cannot be kept in {folder} ({exc})")
        return None
    return path


def prune_kept(folder: str, sessions: Iterable[str], grace_s: float = column_file.GRACE_S) -> None:
    """Remove the kept columns of sessions the run no longer has (:func:`column_file.prune`)."""
    column_file.prune(folder, PREFIX, sessions, grace_s)
