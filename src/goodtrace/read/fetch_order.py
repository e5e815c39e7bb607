"""Rows fetched from DuckDB put in order in numpy, and cut per session: the run model's long
columns (a session's executions, sync points, spans; the reference rank's span time per step)
lie nearly in order, as a session's records do, and DuckDB's ``ORDER BY`` of a million rows
costs several times their fetch, numpy's stable sort of one combined key a fraction."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["by_session", "order_of", "per_session"]


def by_session(con: Any, sql: str, order: Sequence[str] = ()) -> Iterable[tuple[int, dict[str, Any]]]:
    """``(sid, {column: numpy array})`` per session of a query ordered by sid (its first
    column): the columns come out of DuckDB as arrays in one go, then are cut per session.
    ``order``: the query has no ORDER BY, and its rows are put in the order of these integer
    columns here (``sid`` first; ``-name``: descending; NULL last, as DuckDB orders), the
    rows fetched as they lie (nearly in order: a session's records are), since DuckDB's sort
    of a million rows costs several times their fetch (see :func:`order_of`)."""
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


def per_session(columns: dict[str, Any]) -> Iterable[tuple[int, dict[str, Any]]]:
    """``(sid, {column: numpy array})`` per session of columns ordered by ``sid``."""
    import numpy as np

    sid = columns.pop("sid")
    if len(sid) == 0:
        return
    cuts = np.flatnonzero(np.diff(sid)) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [len(sid)]))
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        yield int(sid[a]), {name: values[a:b] for name, values in columns.items()}


def order_of(*keys: Any) -> Any:
    """The stable order of rows by ``keys`` (integer columns, the first key first): one sort of
    one key combining the first keys whose ranges allow it (rows nearly in order, as they lie,
    sort fast); when that leaves no two rows tied, the other keys cannot reorder them (a
    session's executions by ``seq``), else every key is sorted on in turn (``np.lexsort``)."""
    import numpy as np

    if not len(keys[0]):
        return np.zeros(0, dtype=np.int64)
    combined = np.zeros(len(keys[0]), dtype=np.int64)
    room = 1
    used = 0
    for key in keys:
        lo, hi = int(key.min()), int(key.max())
        if room * (hi - lo + 1) >= 1 << 62:
            break
        room *= hi - lo + 1
        combined *= hi - lo + 1
        combined += np.subtract(key, lo, dtype=np.int64)  # in int64 whatever the key's type
        used += 1
    if used:
        order = np.argsort(combined, kind="stable")
        if used == len(keys):
            return order
        ordered = combined[order]
        if not (ordered[1:] == ordered[:-1]).any():
            return order
    return np.lexsort(tuple(reversed(keys)))
