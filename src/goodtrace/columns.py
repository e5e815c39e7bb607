"""Generic helpers for numpy columns, the one place for them: the reader keeps its long
columns as ``array.array`` (numpy views over them: :func:`int64s`, :func:`empty`, and back
without a copy: :func:`array_of`); labels as int32 codes (:func:`label_codes`,
:func:`codes_in`); lookups, orders and cuts of sorted keys (:func:`positions`,
:func:`order_of`, :func:`per_session`, :func:`distinct_sorted`); and the order statistics the
rules use, equal to numpy's to the bit (:func:`median`, :func:`quantile`,
:func:`robust_noise`). numpy is imported when a function first runs; nothing here reads or
writes files.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Collection, Iterable, Sequence
from typing import Any, TypeAlias

from goodtrace.read.loaded import Labels
from goodtrace.record.live.change_point import interpolate

__all__ = ["MAD_TO_SIGMA", "Array", "array_of", "codes_in", "distinct_sorted", "empty", "int64s", "int_array", "ints",
           "label_codes", "median", "order_of", "per_session", "positions", "quantile", "robust_noise"]

# A numpy.ndarray (numpy is imported when a function first runs; a long run on thousands of
# ranks holds millions of executions, and the analysis works on such columns)
Array: TypeAlias = Any

MAD_TO_SIGMA = 1.4826  # makes a median absolute deviation comparable to a standard deviation


def int64s(values: Any) -> Array:
    """A buffer of int64 values (a reader's ``array.array`` column) as a numpy view of it."""
    import numpy as np

    return np.frombuffer(values, dtype=np.int64) if len(values) else np.zeros(0, dtype=np.int64)


def ints(n: int) -> Array:
    """An int64 column of ``n`` zeros to fill, over the ``array.array`` that :func:`int_array` then
    hands on as it is (a cut's columns are as long as its run: made once, not made and copied)."""
    return empty(n, "int64")


def int_array(values: Array) -> array[int]:
    """``values`` as the int64 ``array.array`` a cut's columns are: the one they lie on whole
    (made by :func:`ints`, or a reader's column), else one copy."""
    return array_of(values, "q")


_TYPECODES: dict[Any, str] = {}  # native int64, int32 and float64 -> their array.array type code (filled once)


def empty(n: int, dtype: Any) -> Any:
    """A numpy array of ``n`` values to fill; a native int64, int32 or float64 one over an
    ``array.array`` of its type (what the reader's columns are), which :func:`array_of` then
    hands on as it is, not a copy. (A cut makes thousands a session: the type is looked up by
    the dtype itself, not by its name, a slow property.)"""
    import numpy as np

    if not _TYPECODES:
        _TYPECODES.update({np.dtype(np.int64): "q", np.dtype(np.int32): "i", np.dtype(np.float64): "d"})
    code = _TYPECODES.get(np.dtype(dtype))
    if code is not None and n:
        return np.frombuffer(array(code, [0]) * n, dtype=dtype)
    return np.empty(n, dtype=dtype)


_DTYPES: dict[str, Any] = {}


def _dtype_of(typecode: str) -> Any:
    """The numpy dtype of an ``array.array`` type code (made once a code)."""
    dtype = _DTYPES.get(typecode)
    if dtype is None:
        import numpy as np

        dtype = _DTYPES[typecode] = np.dtype(typecode)
    return dtype


def array_of(values: Any, typecode: str) -> array[Any]:
    """``values`` (a numpy column) as an ``array.array`` of ``typecode``: the array the
    column lies on whole where :func:`empty` made it, else one copy of it."""
    import numpy as np

    base = getattr(values, "base", None)
    # the whole of an array of this type: as long as it, the same item type, one item after the
    # other from the start (a view as long as its buffer, ascending, can only start where it does)
    if type(base) is memoryview and type(base.obj) is array and base.obj.typecode == typecode \
            and len(base.obj) == len(values) and values.ndim == 1 and values.dtype == _dtype_of(typecode) \
            and (len(values) < 2 or values.strides[0] == values.itemsize):
        return base.obj
    out = array(typecode)
    out.frombytes(np.ascontiguousarray(values, dtype=np.dtype(typecode)).data.cast("B"))  # one copy, not two
    return out


def distinct_sorted(values: Any) -> Any:
    """``np.unique(values)`` of an integer column, by sorting: NumPy 2.4's hash-based unique
    took 6.5 s for 4 M distinct times that a sort takes 0.3 s for."""
    import numpy as np

    ordered = np.sort(values)
    if not len(ordered):
        return ordered
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


def label_codes(values: Sequence[str]) -> tuple[Array, tuple[str, ...]]:
    """A column of a few distinct strings as (int32 codes, names): the reader's :class:`Labels`
    as they are, any other sequence (a test's list) coded here."""
    import numpy as np

    if isinstance(values, Labels):
        return np.frombuffer(values.codes, dtype=np.intc) if len(values.codes) else np.zeros(0, np.intc), values.names
    names = tuple(dict.fromkeys(values))
    code_of = {name: k for k, name in enumerate(names)}
    return np.fromiter((code_of[v] for v in values), dtype=np.intc, count=len(values)), names


def codes_in(codes: Array, names: Sequence[str], wanted: Collection[str]) -> Array:
    """Where ``codes`` (into ``names``) name one of ``wanted``, as a bool column: a comparison
    per wanted name present, not a Python step per row."""
    import numpy as np

    out = np.zeros(len(codes), dtype=bool)
    for k, name in enumerate(names):
        if name in wanted:
            out |= codes == k
    return out


def positions(keys: Array, wanted: Array) -> Array:
    """Where each of ``wanted`` is in ``keys`` (sorted; a key there twice: its first place), -1
    where it is not: through a table by key when the keys are each once and dense (executions
    numbered in order: no search), else by binary search."""
    import numpy as np

    out = np.full(len(wanted), -1, dtype=np.int64)
    if not len(keys) or not len(wanted):
        return out
    lo, hi = int(keys[0]), int(keys[-1])
    if hi - lo < 4 * (len(keys) + len(wanted)) and bool((keys[1:] > keys[:-1]).all()):
        inside = (wanted >= lo) & (wanted <= hi)
        every = bool(inside.all())
        if hi - lo + 1 == len(keys):  # every key from lo to hi: the position is the key's offset
            found = wanted - lo
        else:
            table = np.full(hi - lo + 1, -1, dtype=np.int64)
            table[keys - lo] = np.arange(len(keys))
            found = table[wanted - lo] if every else table[np.where(inside, wanted - lo, 0)]
            del table
        if every:
            return found
        out[inside] = found[inside]
        return out
    at = np.minimum(np.searchsorted(keys, wanted), len(keys) - 1)
    found = np.flatnonzero(keys[at] == wanted)
    out[found] = at[found]
    return out


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


def median(values: Any) -> float:
    """``float(np.median(values))`` of a numpy array of numbers, to the bit (the middle element,
    or the float64 mean of the middle two; NaN when a float array holds one), without
    ``np.median``'s machinery: tens of microseconds a call, a few calls per session, thousands
    of sessions at many ranks. Empty (NaN, with numpy's warning) and other dtypes: ``np.median``."""
    import numpy as np

    n = len(values)
    kind = values.dtype.kind
    if not n or not (kind in "iu" or values.dtype == np.float64):  # (float32's mean is float32's)
        return float(np.median(values))
    half = n // 2
    kth = [half - 1, half] if n % 2 == 0 else [half]
    if kind == "f":
        kth.append(n - 1)  # NaN sorts last: np.median's check
    part = np.partition(values, kth)
    if kind == "f" and np.isnan(part[-1]):
        return float("nan")
    if n % 2:
        return float(np.float64(part[half]))
    return (float(np.float64(part[half - 1])) + float(np.float64(part[half]))) / 2


def quantile(values: Any, q: float) -> float:
    """``float(np.quantile(values, q))`` of a numpy array of float64 values (its default, linear
    method), to the bit: the two order statistics around ``q * (n - 1)`` by a partition, and
    numpy's interpolation between them (from the upper one when the fraction is 0.5 or more),
    without ``np.quantile``'s machinery (about 80 microseconds a call, one a rank: 10,000 ranks
    made it a second). NaN in the values, an empty array and other dtypes: ``np.quantile``."""
    import numpy as np

    n = len(values)
    if not n or values.dtype != np.float64:
        return float(np.quantile(values, q))
    position = (n - 1) * q
    low = math.floor(position)
    if low >= n - 1:
        part = np.partition(values, n - 1)
        return float("nan") if np.isnan(part[-1]) else float(part[-1])
    part = np.partition(values, [low, low + 1, n - 1])
    if np.isnan(part[-1]):
        return float("nan")
    return interpolate(float(part[low]), float(part[low + 1]), position - low)


def robust_noise(values: Any) -> float:
    """1.4826 x the median absolute deviation of ``values`` (a numpy array; 0 when empty)."""
    import numpy as np

    if not len(values):
        return 0.0
    return float(MAD_TO_SIGMA * median(np.abs(values - median(values))))
