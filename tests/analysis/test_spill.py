"""The analysis's temporary file: a value put in it comes back equal, its long columns written as
raw bytes beside it (not pickled) and read straight into new columns."""

from __future__ import annotations

from array import array
from pathlib import Path

import numpy as np
import pytest

from goodtrace.analysis import analyze
from goodtrace.analysis import spill as spill_module
from goodtrace.analysis.spill import RAW_BYTES, SpillFile
from goodtrace.read.load import load_run

RUNS = Path(__file__).resolve().parents[1] / "data" / "runs"


def test_values_come_back_equal_with_their_long_columns_as_raw_bytes() -> None:
    rng = np.random.default_rng(3)
    n = 10_000
    assert 4 * n >= RAW_BYTES  # each column below but "short", "empty" and "small numpy" is written raw
    value = {
        "ints": array("q", rng.integers(-(2**62), 2**62, n).tolist()),
        "codes": array("i", rng.integers(0, 5, n).tolist()),
        "floats": array("d", rng.random(n).tolist()),
        "short": array("q", [1, 2, 3]),
        "empty": array("q"),
        "numpy": rng.integers(0, 10**12, n),
        "strided": np.repeat(rng.random(n), 2)[::2],  # a view with a stride
        "matrix": rng.random((50, 40)),
        "small numpy": np.arange(4, dtype=np.int32),
        "steps": range(3, 3 + n),
        "names": ["a", "b\u00e9", "c"] * 10,
        "nested": ({"x": array("q", range(n))}, None, 1.5),
    }
    spill = SpillFile("goodtrace-test-")
    try:
        where = spill.put(value)
        other = spill.put(("second", array("d", [0.5] * n)))
        raw = sum(8 * n for _ in ("ints", "floats", "numpy", "strided", "nested")) + 4 * n + 8 * 50 * 40
        assert where[1] < raw // 50  # the columns are beside the pickled value, not in it
        for _ in range(2):
            back = spill.get(where)
            assert back.keys() == value.keys()
            for key in ("ints", "codes", "floats", "short", "empty", "steps", "names"):
                assert back[key] == value[key] and type(back[key]) is type(value[key])
            for key in ("numpy", "strided", "matrix", "small numpy"):
                assert back[key].dtype == value[key].dtype and back[key].shape == value[key].shape
                assert back[key].tobytes() == value[key].tobytes()
                assert back[key].flags.writeable
            assert back["nested"][0]["x"] == value["nested"][0]["x"] and back["nested"][1:] == (None, 1.5)
            assert back["ints"] is not value["ints"]
        assert spill.get(other) == ("second", array("d", [0.5] * n))
    finally:
        spill.close()


@pytest.mark.parametrize("raw_bytes", [0, RAW_BYTES], ids=["every-column-raw", "long-columns-raw"])
def test_every_cut_of_a_run_comes_back_equal(raw_bytes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cuts of a run with a restart, each put and read back: equal to the cut, field by field
    (its columns, a dict of them, its labels' codes, its rewinds)."""
    monkeypatch.setattr(spill_module, "RAW_BYTES", raw_bytes)
    analysis = analyze(load_run(RUNS / "restart_2ranks"))
    spill = SpillFile("goodtrace-test-")
    try:
        where = {i: spill.put(analysis.cuts[i]) for i in analysis.cuts}
        assert len(where) == len(list(analysis.cuts)) > 1
        for i, at in where.items():
            assert spill.get(at) == analysis.cuts[i]
    finally:
        spill.close()
