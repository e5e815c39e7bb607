"""One file of numpy columns and a JSON header, written aside and renamed into place (whole or
not at all), read back an array at a time: what the reader keeps of a session's closed files
beside the segment cache (:mod:`goodtrace.read.detail_columns`,
:mod:`goodtrace.read.session_columns`). Plain arrays, not Parquet: read back with one
``readinto`` each, no decoding, since a re-report reads millions of rows of them.

Layout: :data:`MAGIC`, the header's length (8 bytes, little-endian), the header (JSON: what the
file is of, and under ``"arrays"`` each array's dtype, offset and length), then each array's
bytes at its offset (aligned to 64 bytes)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from goodtrace.columns import empty
from goodtrace.read.io_pool import on_network_filesystem

__all__ = ["ColumnFileError", "prune", "read_arrays", "read_head", "recode", "session_path", "write"]

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
