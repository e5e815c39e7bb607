"""A column file reads back the arrays written to it, each of its own type and byte order."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from goodtrace import columns
from goodtrace.read import session_columns


def test_arrays_read_back_as_written_whatever_their_type_and_byte_order(tmp_path: Path) -> None:
    arrays = {
        "native_int64": np.array([1, -2, 3 << 40], dtype=np.int64),
        "native_int32": np.array([7, -8], dtype=np.int32),
        "native_float64": np.array([0.5, -1e300], dtype=np.float64),
        "big_endian_int64": np.array([1, -2, 3 << 40], dtype=">i8"),  # a file a big-endian machine wrote
        "uint8": np.array([0, 255], dtype=np.uint8),
        "empty_int64": np.zeros(0, dtype=np.int64),
    }
    path = str(tmp_path / "x.columns")
    session_columns.write(path, {"of": "a test"}, list(arrays), arrays.items())
    head = session_columns.read_head(path)
    assert head is not None and head["of"] == "a test"
    back = session_columns.read_arrays(path, head, list(arrays))
    for name, values in arrays.items():
        assert back[name].dtype == values.dtype, name
        assert back[name].tolist() == values.tolist(), name
    # with the rows after it, read into one array
    back = session_columns.read_arrays(path, head, ["native_int64"], {"native_int64": np.array([9], dtype=np.int64)})
    # the native int64 column lies on an array.array, handed on as it is (no copy)
    whole = columns.array_of(back["native_int64"], "q")
    assert whole.tolist() == [1, -2, 3 << 40, 9]
    assert whole.buffer_info()[0] == back["native_int64"].__array_interface__["data"][0]
