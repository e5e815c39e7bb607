"""A temporary file the analysis puts per-session values in while it holds them, so that what
grows with ranks x steps is on disk, not in memory: each session's slowdown series
(:class:`~goodtrace.analysis.slowdown.SeriesStore`) and the cuts the views read beyond what is
kept in memory (:class:`~goodtrace.analysis.session_cuts.SessionCuts`).

A value is pickled, its long columns (``array.array`` and numeric numpy arrays) written as their
raw bytes beside it and read back straight into a new column, so that reading a value back holds
it once, not its bytes and then its copy. The file has no name (it is gone with the process) and
is made at the first write; a write that fails (a full disk) raises ``OSError``, and the caller
keeps that value in memory instead (the numbers are the same); the first such failure stays in
``SpillFile.failure``, which the analysis warns of (a run that long needs the disk).
"""

from __future__ import annotations

import io
import pickle
import sys
import tempfile
import weakref
from array import array
from typing import IO, Any

__all__ = ["SpillFile"]

RAW_BYTES = 4096  # a column at least this long is written as raw bytes, not pickled


class SpillFile:
    """Values put in a temporary file (:meth:`put`, which says where) and read back (:meth:`get`)."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._file: io.BufferedRandom | None = None
        self._end = 0
        self.failure: str | None = None  # why the first write that failed did

    def put(self, value: object) -> tuple[int, int]:
        """``value`` written; returns where (for :meth:`get`). Raises ``OSError``."""
        head = io.BytesIO()
        try:
            _Pickler(head, self).dump(value)
            return self._write(head.getbuffer())
        except OSError as exc:
            if self.failure is None:
                self.failure = f"{tempfile.gettempdir()}: {exc.strerror or exc}"
            raise

    def get(self, where: tuple[int, int]) -> Any:
        """The value :meth:`put` wrote at ``where`` (its columns new, each read once)."""
        return _Unpickler(io.BytesIO(self._read(*where)), self).load()

    def _write(self, data: memoryview) -> tuple[int, int]:
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix=self._prefix)  # noqa: SIM115 (closed by close())
            # and when the owner goes without close() (an analysis that raised after the cut)
            weakref.finalize(self, self._file.close)
        at = self._end
        self._file.seek(at)
        self._file.write(data)
        self._end = at + data.nbytes
        return at, data.nbytes

    def _read(self, at: int, size: int) -> bytearray:
        data = bytearray(size)
        self._read_into(at, memoryview(data))
        return data

    def _read_into(self, at: int, target: memoryview) -> None:
        if self._file is None:
            raise KeyError(at)
        self._file.seek(at)
        got = self._file.readinto(target)
        if got != target.nbytes:
            raise OSError(f"the analysis's temporary file lost bytes at {at} ({got} of {target.nbytes})")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _numeric_numpy(value: object) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.ndarray) and value.dtype.kind in "biuf"


class _Pickler(pickle.Pickler):
    """Pickles a value, each long column written to the file as its raw bytes."""

    def __init__(self, out: IO[bytes], spill: SpillFile) -> None:
        super().__init__(out, pickle.HIGHEST_PROTOCOL)
        self._spill = spill

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is array and obj.itemsize * len(obj) >= RAW_BYTES:
            at, _ = self._spill._write(memoryview(obj).cast("B"))
            return ("array", obj.typecode, len(obj), at)
        if _numeric_numpy(obj) and obj.nbytes >= RAW_BYTES:
            import numpy as np

            values = np.ascontiguousarray(obj)  # a view with a stride: its values, in order
            at, _ = self._spill._write(values.reshape(-1).data.cast("B"))
            return ("numpy", values.dtype.str, values.shape, at)
        return None


class _Unpickler(pickle.Unpickler):
    """Reads a value :class:`_Pickler` wrote, each column read into a new one."""

    def __init__(self, data: IO[bytes], spill: SpillFile) -> None:
        super().__init__(data)
        self._spill = spill

    def persistent_load(self, pid: Any) -> Any:
        kind, type_, shape, at = pid
        if kind == "array":
            values: Any = array(type_, [0]) * shape  # its memory once (filled below)
            self._spill._read_into(at, memoryview(values).cast("B"))
            return values
        import numpy as np

        values = np.empty(shape, dtype=np.dtype(type_))
        self._spill._read_into(at, values.reshape(-1).data.cast("B"))
        return values
