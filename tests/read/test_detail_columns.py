"""The reference sessions' step detail kept as columns of their closed files: combining the
kept columns with the rows of the files written since gives what combining every file's rows
at once gives (ties, a step's spans in two files, files that overlap in time), the kept file
reads back as written, a damaged one is a warning and is read around, and a report that uses
them is the cold report to the byte."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from goodtrace.analysis import analyze
from goodtrace.read import detail_columns, duckdb_sql
from goodtrace.read.chunk_files import FileIdentity
from goodtrace.read.detail_columns import TABLES, DetailColumns, combine, keep, load_kept, take, vocabulary
from goodtrace.read.engine import Engine
from goodtrace.read.environment import run_cache_dir
from goodtrace.read.load import load_run
from goodtrace.read.segment_cache import ENV_SEGMENT_CACHE
from goodtrace.read.session_columns import KeptChanged
from goodtrace.renderers.json_report import render_json
from helpers.many_ranks import NOW, write_many_ranks


def _report(run: Path, *, cache: bool) -> str:
    loaded = load_run(run, engine=Engine(workers=1), use_cache=cache)
    return render_json(analyze(loaded, now_wall_ns=NOW, release_records=True))


def _rows(rng: np.random.Generator, n: int, names: tuple[str, ...], t0: int) -> DetailColumns:
    """A file's detail rows, as they come out of DuckDB (not in order), from time ``t0``: few
    distinct times, steps and values, so that rows tie."""
    t = t0 + rng.integers(0, 40, n)
    step = t // 4
    code = rng.integers(0, len(names), n).astype(np.int32)
    cols = DetailColumns(names)
    cols.tables["tags"] = {"t": t, "step": step, "name": code}
    cols.tables["metrics"] = {"t": t, "step": step, "name": code, "value": rng.choice([-1.5, 0.0, 2.25, np.nan], n)}
    cols.tables["spans"] = {"step": step, "name": code, "ns": rng.integers(0, 1000, n), "first": t}
    cols.tables["flops"] = {"t": t, "value": rng.choice([1e12, 2e12], n)}
    events = {"t": t, "step": step, "nostep": rng.random(n) < 0.3}
    for column, choices in (("name", ["save", "eval"]), ("attrs", [None, '{"k": 1}', '{"k": 2}'])):
        events[column] = np.empty(n, dtype=object)
        events[column][:] = [choices[k] for k in rng.integers(0, len(choices), n)]
    cols.tables["events"] = events
    return cols


def _same(a: DetailColumns, b: DetailColumns) -> None:
    assert a.names == b.names
    for table, columns in TABLES.items():
        for column in columns:
            x, y = a.tables[table][column], b.tables[table][column]
            assert x.dtype == y.dtype or x.dtype == object, (table, column)
            if x.dtype.kind == "f":
                np.testing.assert_array_equal(x, y)  # NaN where NaN
            else:
                assert x.tolist() == y.tolist(), (table, column)


@pytest.mark.parametrize("overlap", [False, True])
def test_kept_columns_combined_with_new_rows_equal_every_row_combined_at_once(overlap: bool) -> None:
    rng = np.random.default_rng(7 + overlap)
    # four files; the later ones begin where the ones before end (a growing run), or, with
    # ``overlap``, reach back into their time (records written late, a span ending later)
    files = [_rows(rng, 300, ("bwd", "fwd", "z"), 0 if overlap else 40 * k) for k in range(4)]
    files[3].names = ("a", "fwd", "zz")  # a name the kept columns never saw, one they share
    names = vocabulary(files)
    whole = combine(files, names)
    assert whole.tables["spans"]["step"].tolist() == sorted(whole.tables["spans"]["step"].tolist())
    keys = list(zip(whole.tables["spans"]["step"].tolist(), whole.tables["spans"]["name"].tolist(), strict=True))
    assert len(set(keys)) == len(keys)  # one row per step and name
    for kept_files in (1, 2, 3):
        kept = combine(files[:kept_files], vocabulary(files[:kept_files]))  # kept under their own names
        _same(combine([kept, *files[kept_files:]], names), whole)
        # closing: the next file joins the kept ones, the rest is combined with them
        joined = combine([kept, files[kept_files]], names)
        _same(combine([joined, *files[kept_files + 1:]], names), whole)


@pytest.mark.parametrize("overlap", [False, True])
def test_kept_columns_read_from_their_file_into_the_joined_arrays_equal_every_row_combined(
    tmp_path: Path, overlap: bool,
) -> None:
    # as above, the kept columns written and found again: combine reads them (not read before)
    # into the arrays it joins them to the rest in, and reads them alone when they come later
    rng = np.random.default_rng(11 + overlap)
    files = [_rows(rng, 300, ("bwd", "fwd", "z"), 0 if overlap else 40 * k) for k in range(3)]
    files[2].names = ("a", "fwd", "zz")  # new names: the kept codes are mapped as they are read
    names = vocabulary(files)
    whole = combine(files, names)
    keep(str(tmp_path), "s", "v1", [], combine(files[:2], vocabulary(files[:2])))

    def found() -> DetailColumns:
        loaded = load_kept(str(tmp_path), "s", "v1")
        assert loaded is not None and loaded[1].unread is not None
        return loaded[1]

    _same(combine([found(), files[2]], names), whole)
    _same(combine([found()], vocabulary(files[:2])), combine(files[:2], vocabulary(files[:2])))
    _same(combine([files[2], found()], names), combine([files[2], *files[:2]], names))


def test_kept_columns_changed_or_damaged_after_they_were_found_are_not_used(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    kept = combine([_rows(rng, 200, ("fwd", "bwd"), 0)], ("bwd", "fwd"))
    keep(str(tmp_path), "s", "v1", [], kept)
    found = load_kept(str(tmp_path), "s", "v1")
    assert found is not None
    [path] = tmp_path.glob("detail-*.columns")
    keep(str(tmp_path), "s", "v1", [], combine([_rows(rng, 10, ("fwd",), 0)], ("fwd",)))  # replaced since
    with pytest.raises(KeptChanged):
        combine([found[1]], found[1].names)
    keep(str(tmp_path), "s", "v1", [], kept)
    found = load_kept(str(tmp_path), "s", "v1")
    assert found is not None
    head = found[1].unread.head if found[1].unread is not None else {}
    _, offset, _ = head["arrays"]["spans.name"]
    with path.open("r+b") as handle:  # a bit flipped in the span names' codes: the header is whole
        handle.seek(offset)
        handle.write(np.array([7], dtype=np.int32).tobytes())
    with pytest.warns(UserWarning, match="kept step detail .*a name code out of range"), \
            pytest.raises(KeptChanged):
        combine([found[1], _rows(rng, 5, ("fwd",), 100)], ("bwd", "fwd"))


def test_a_kept_file_reads_back_and_a_damaged_one_is_a_warning(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    kept = combine([_rows(rng, 500, ("fwd", "bwd"), 0)], ("bwd", "fwd"))
    files = [FileIdentity("rank-00000/s.00000.jsonl", 123, 456, 7, 8)]
    keep(str(tmp_path), "session-a", "v1", files, kept)
    found = load_kept(str(tmp_path), "session-a", "v1")
    assert found is not None
    assert found[0] == [files[0].entry()]
    assert found[1].unread is not None and found[1].rows("spans") == kept.rows("spans")  # read when combined
    _same(combine([found[1]], found[1].names), kept)
    assert found[1].combined
    assert load_kept(str(tmp_path), "session-a", "v2") is None  # another version: quietly not used
    assert load_kept(str(tmp_path), "session-b", "v1") is None  # none kept
    [path] = tmp_path.glob("detail-*.columns")
    path.write_bytes(path.read_bytes()[:-100])  # torn
    with pytest.warns(UserWarning, match="kept step detail .* cannot be read"):
        assert load_kept(str(tmp_path), "session-a", "v1") is None
    detail_columns.prune_kept(str(tmp_path), ["session-b"], grace_s=0)  # a session the run no longer has
    assert not list(tmp_path.glob("detail-*"))


def test_take_keeps_the_rows_of_some_files() -> None:
    rng = np.random.default_rng(2)
    rows = _rows(rng, 50, ("a",), 0)
    mask = {table: np.arange(rows.rows(table)) % 2 == 0 for table in TABLES}
    half = take(rows, mask)
    assert all(half.rows(table) == 25 for table in TABLES)


@pytest.mark.slow
def test_a_report_with_kept_detail_reads_only_the_other_files_and_is_the_cold_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_SEGMENT_CACHE, "1")
    run = write_many_ranks(tmp_path / "run", ranks=4, long_line=False)
    cold = _report(run, cache=False)
    assert _report(run, cache=True) == cold  # keeps the reference session's closed files' detail
    folder = Path(run_cache_dir(str(run), "segments"))
    kept = sorted(folder.glob("detail-*.columns"))
    assert kept
    loaded_hits: list[int] = []
    real_load = detail_columns.load_kept

    def loading(folder: str, session: str, version: str) -> Any:
        found = real_load(folder, session, version)
        loaded_hits.append(found is not None)
        return found

    monkeypatch.setattr("goodtrace.read.cache_keep.load_kept", loading)
    assert _report(run, cache=True) == cold
    used = loaded_hits.count(True)  # the reference sessions with a closed file (a crashed one may have none)
    assert used >= 1
    # damaged: a warning, the files read again (from the segment cache), the same report, and
    # the columns kept again
    for path in kept:
        path.write_bytes(b"goodtrace-columns\n" + b"\xff" * 20)
    loaded_hits.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _report(run, cache=True) == cold
    assert [w for w in caught if "kept step detail" in str(w.message)]
    assert loaded_hits and not any(loaded_hits)
    loaded_hits.clear()
    assert _report(run, cache=True) == cold
    assert loaded_hits.count(True) == used
    # another RUN_MODEL_VERSION makes the kept columns stale: quietly not used, and replaced
    monkeypatch.setattr(duckdb_sql, "RUN_MODEL_VERSION", "another")
    loaded_hits.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _report(run, cache=True) == cold
    assert not [w for w in caught if "kept step detail" in str(w.message)]
    assert loaded_hits and not any(loaded_hits)
    loaded_hits.clear()
    assert _report(run, cache=True) == cold
    assert loaded_hits.count(True) == used
