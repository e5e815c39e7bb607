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
read again); rows of the files a kept file covers are dropped from what DuckDB gives.

The file format of what is kept (here and in :mod:`goodtrace.read.detail_columns`): numpy
columns and a JSON header, written aside and renamed into place (whole or not at all), read back
an array at a time (:func:`write`, :func:`read_head`, :func:`read_arrays`). Plain arrays, not Parquet: read back with one
``readinto`` each, no decoding, since a re-report reads millions of rows of them.

Layout: :data:`MAGIC`, the header's length (8 bytes, little-endian), the header (JSON: what the
file is of, and under ``"arrays"`` each array's dtype, offset and length), then each array's
bytes at its offset (aligned to 64 bytes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from goodtrace.columns import empty, order_of
from goodtrace.read.chunk_files import FileIdentity
from goodtrace.read.io_pool import on_network_filesystem
from goodtrace.read.loaded import LoadError
from goodtrace.record.errors import warn

__all__ = ["KEPT", "ColumnFileError", "KeptColumns", "KeptSession", "find_kept", "prune", "prune_kept", "read_arrays", "read_head", "read_kept", "recode", "session_path", "write", "write_kept"]

# The file format: a JSON header, then each array aligned
MAGIC = b"goodtrace-columns\n"
_ALIGN = 64
PARTIAL = ".partial"
SUFFIX = ".columns"
GRACE_S = 900.0  # a kept file of no session of the run, or left aside, is removed this old


def session_path(folder: str, prefix: str, session: str) -> str:
    """Where the file ``prefix`` of ``session`` (its name hashed: any string) is kept in ``folder``."""
    return os.path.join(folder, prefix + hashlib.sha256(session.encode()).hexdigest()[:20] + SUFFIX)


class ColumnFileError(ValueError):
    """A column file that is damaged, cut short or not one."""


def write(path: str, head: dict[str, Any], names: Sequence[str], arrays: Iterable[tuple[str, Any]]) -> None:
    """Write ``head`` (JSON-able; its ``"arrays"`` is set here) and the arrays ``names``, which
    ``arrays`` yields (name, 1-D numpy array) in that order, one after another (so that what
    makes them holds one at a time), to ``path``: aside, then renamed over it. Raises
    ``OSError``."""
    import numpy as np

    head = dict(head, arrays={})
    # the header is written last, in a place of a size it cannot exceed: an array's entry
    # takes its name and 48 characters of numbers at most
    reserve = len(json.dumps(head)) + sum(len(json.dumps(name)) + 64 for name in names) + _ALIGN
    offset = -(-(len(MAGIC) + 8 + reserve) // _ALIGN) * _ALIGN
    partial = f"{path}.{os.getpid()}.{os.urandom(4).hex()}{PARTIAL}"
    # on a network filesystem, written locally and copied over in a few large writes: a seek
    # and a write an array there are round trips each
    local = tempfile.mkstemp(prefix="goodtrace-columns-")[1] if on_network_filesystem(os.path.dirname(path)) else None
    try:
        with open(local or os.open(partial, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666), "wb") as out:
            given = []
            for name, values in arrays:
                given.append(name)
                head["arrays"][name] = [values.dtype.str, offset, len(values)]
                out.seek(offset)
                np.ascontiguousarray(values).tofile(out)
                offset += -(-values.nbytes // _ALIGN) * _ALIGN
                del values
            if given != list(names):
                raise ValueError(f"arrays {given} given for {list(names)}")
            text = json.dumps(head).encode()
            if len(text) > reserve:
                raise ValueError("the header outgrew its place")
            out.seek(0, os.SEEK_END)
            out.write(b"\0" * (offset - out.tell()))  # to the end of the last array's place, empty ones too
            out.seek(0)
            out.write(MAGIC + reserve.to_bytes(8, "little") + text + b" " * (reserve - len(text)))
        if local is not None:
            shutil.copyfile(local, partial)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(partial)
        raise
    finally:
        if local is not None:
            with contextlib.suppress(OSError):
                os.remove(local)


def read_head(path: str) -> dict[str, Any] | None:
    """The header of ``path``; None when there is no such file. Raises ``ColumnFileError`` (or
    ``OSError``) when it is not a whole column file's, or an array would lie past its end."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 (closed below)
    except FileNotFoundError:
        return None
    with handle:
        if handle.read(len(MAGIC)) != MAGIC:
            raise ColumnFileError("not a column file")
        size = int.from_bytes(handle.read(8), "little")
        end = os.fstat(handle.fileno()).st_size
        if size > end:
            raise ColumnFileError("its header is cut short")
        try:
            head = json.loads(handle.read(size).decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ColumnFileError(f"its header is not JSON ({exc})") from None
    import numpy as np

    if not isinstance(head, dict):
        raise ColumnFileError("its header is not an object")
    arrays = head.get("arrays")
    if not isinstance(arrays, dict):
        raise ColumnFileError("its header lists no arrays")
    for name, entry in arrays.items():
        try:
            dtype, offset, length = entry
            if np.dtype(dtype).hasobject or offset < 0 or length < 0 or (
                    length and offset + length * np.dtype(dtype).itemsize > end):
                raise ColumnFileError(f"array {name} lies past the file's end")
        except (TypeError, ValueError) as exc:
            raise ColumnFileError(f"array {name}: {exc}") from None
    return head


def read_arrays(path: str, head: dict[str, Any], names: Iterable[str],
                then: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The arrays ``names`` of ``path`` (whose header is ``head``); with ``then`` (name -> an
    array), each followed by that one's values, read into one array (no second copy to join
    them). Raises ``ColumnFileError`` (or ``OSError``, ``KeyError`` for a name it lacks) when
    one cannot be read whole."""
    import numpy as np

    out: dict[str, Any] = {}
    with open(path, "rb") as handle:
        for name in names:
            dtype, offset, length = head["arrays"][name]
            after = then[name] if then is not None else ()
            values = empty(length + len(after), np.dtype(dtype))
            handle.seek(offset)
            mine = values[:length]
            if handle.readinto(mine.data.cast("B")) != mine.nbytes:
                raise ColumnFileError(f"array {name} is cut short")
            values[length:] = after
            out[name] = values
    return out


def recode(codes: Any, names: Sequence[str], into: Sequence[str]) -> Any:
    """``codes`` (int32, into ``names``) as codes into ``into``, which holds every one of
    ``names``: ``codes`` itself where the names are the same, else a new array. Raises
    ``ColumnFileError`` when one is not a code of ``names`` (a damaged file's)."""
    import numpy as np

    if len(codes) and (int(codes.min()) < 0 or int(codes.max()) >= len(names)):
        raise ColumnFileError("a code out of the range of its names")
    if tuple(names) == tuple(into):
        return codes
    where = {name: k for k, name in enumerate(into)}
    return np.array([where[name] for name in names], dtype=np.int32)[codes]


def prune(folder: str, prefix: str, sessions: Iterable[str], grace_s: float = GRACE_S) -> None:
    """Remove the files ``prefix`` of sessions the run no longer has (``sessions``: all it has),
    and what a writer left aside, once ``grace_s`` old (a report that began before may still
    read them)."""
    keep = {os.path.basename(session_path(folder, prefix, s)) for s in sessions}
    try:
        names = os.listdir(folder)
    except OSError:
        return
    now = time.time()
    for name in names:
        if not name.startswith(prefix) or name in keep:
            continue
        path = os.path.join(folder, name)
        with contextlib.suppress(OSError):
            if now - os.path.getmtime(path) >= grace_s:
                os.remove(path)


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
# (outermost.kept_outer: each execution's ns, by seq; its bounds: the latest end and start of
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
        path = session_path(folder, PREFIX, session)
        try:
            head = read_head(path)
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
        head = read_head(kept.path)
        if head is None or head.get("files") != kept.files:
            raise KeptChanged(kept.path)
        wanted = [f"{table}.{column}" for table, columns in tables.items() for column in columns]
        arrays = read_arrays(kept.path, head, wanted, after)
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
                    recoded = recode(mine, kept.vocab[column], vocab[column])
                except ColumnFileError as exc:
                    raise KeptChanged(f"{kept.path}: {column}: {exc}") from None
                if recoded is not mine:
                    mine[:] = recoded
            out[table][column] = values
        if then is not None and table in ORDER:  # a derived table's caller joins it (outermost.by_seq)
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

    path = session_path(folder, PREFIX, session)
    try:
        write(path, head, names, arrays())
    except OSError as exc:
        warn(f"the columns of session {session} cannot be kept in {folder} ({exc})")
        return None
    return path


def prune_kept(folder: str, sessions: Iterable[str], grace_s: float = GRACE_S) -> None:
    """Remove the kept columns of sessions the run no longer has (:func:`prune`)."""
    prune(folder, PREFIX, sessions, grace_s)
