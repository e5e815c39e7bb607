"""Each session's long columns kept for its closed files: joined to the rows of the files
written since they give the order one fetch of every row gives (rows that tie, files that
overlap in time, compute spans without a step), a kept file that another report replaced
while this one read is noticed (the run read again without), a damaged one is a warning,
and reports that use them are the cold report to the byte."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from goodtrace.analysis import analyze
from goodtrace.columns import order_of
from goodtrace.read import cache_keep, duckdb_sql, load, session_columns
from goodtrace.read.chunk_files import FileIdentity
from goodtrace.read.engine import Engine
from goodtrace.read.environment import run_cache_dir
from goodtrace.read.load import load_run
from goodtrace.read.outermost import kept_outer
from goodtrace.read.segment_cache import ENV_SEGMENT_CACHE
from goodtrace.read.session_columns import (
    ORDER,
    TABLES,
    KeptChanged,
    KeptSession,
    read_kept,
    write_kept,
)
from goodtrace.renderers.json_report import render_json
from helpers.many_ranks import NOW, write_many_ranks


def _report(run: Path, *, cache: bool, workers: int = 1) -> str:
    loaded = load_run(run, engine=Engine(workers=workers), use_cache=cache)
    return render_json(analyze(loaded, now_wall_ns=NOW, release_records=True))


def _rows(rng: np.random.Generator, table: str, n: int, t0: int) -> dict[str, Any]:
    """A file's rows of ``table`` with few distinct values (rows tie), from time ``t0``."""
    t = t0 + rng.integers(0, 30, n)
    out: dict[str, Any] = {}
    for column in TABLES[table]:
        if column == "nostep":
            out[column] = rng.random(n) < 0.3
        elif column in ("how", "cat"):
            out[column] = rng.integers(0, 3, n).astype(np.int32)
        elif column in ("t", "t0"):
            out[column] = t
        elif column == "t1":
            out[column] = t + rng.integers(1, 5, n)
        else:
            out[column] = rng.integers(0, 4, n) + t0 // 10
    return out


def _with_outer(tables: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A session's kept tables with the outermost compute kept beside them."""
    return tables | {"outer": kept_outer(tables["steps"], tables["compute"])}


def _in_order(table: str, c: dict[str, Any]) -> dict[str, Any]:
    keys = [~c[spec[1:]] if spec.startswith("-") else c[spec] for spec in ORDER[table]]
    order = order_of(*keys)
    return {column: values[order] for column, values in c.items()}


@pytest.mark.parametrize("table", list(TABLES))
@pytest.mark.parametrize("overlap", [False, True])
def test_kept_columns_joined_to_new_rows_are_every_row_in_order(tmp_path: Path, table: str, overlap: bool) -> None:
    rng = np.random.default_rng(len(table) + overlap)
    files = [_rows(rng, table, 200, 0 if overlap else 40 * k) for k in range(3)]
    every = {column: np.concatenate([f[column] for f in files]) for column in TABLES[table]}
    whole = _in_order(table, every)
    vocab = {"how": ["a", "b", "c"], "cat": ["d", "e", "f"]}

    def joined(kept: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
        """``kept`` written as a session's kept file, read back joined to ``new``."""
        ident = FileIdentity("rank-00000/s.jsonl", 1, 2, 3, 4)
        write_kept(str(tmp_path), "s", "v", [ident], vocab,
                   _with_outer({t: kept if t == table else _rows(rng, t, 0, 0) for t in TABLES}).items())
        [found] = session_columns.find_kept(str(tmp_path), "v", {0: "s"}, {0: [(0, ident)]}).values()
        return read_kept(found, {table: TABLES[table]}, vocab, then={table: new})[table]

    for kept_files in (0, 1, 2, 3):
        kept = _in_order(table, {c: np.concatenate([every[c][:0]] + [f[c] for f in files[:kept_files]])
                                 for c in TABLES[table]})
        new = _in_order(table, {c: np.concatenate([every[c][:0]] + [f[c] for f in files[kept_files:]])
                                for c in TABLES[table]})
        back = joined(kept, new)
        assert {c: v.tolist() for c, v in back.items()} == {c: v.tolist() for c, v in whole.items()}


def _kept_file(tmp_path: Path) -> tuple[str, list[FileIdentity], dict[str, dict[str, Any]]]:
    rng = np.random.default_rng(3)
    tables = {table: _in_order(table, _rows(rng, table, 100, 0)) for table in TABLES}
    files = [FileIdentity("rank-00000/s.00000.jsonl", 10, 20, 30, 40)]
    path = write_kept(str(tmp_path), "s", "v", files, {"how": ["a", "b", "c"], "cat": ["d", "e", "f"]},
                      _with_outer(tables).items())
    assert path is not None
    return path, files, tables


def test_a_kept_file_reads_back_its_codes_into_the_fetch_s_vocabulary(tmp_path: Path) -> None:
    path, files, tables = _kept_file(tmp_path)
    [found] = session_columns.find_kept(str(tmp_path), "v", {0: "s"}, {0: [(5, files[0])]}).values()
    assert found.fids.tolist() == [5]
    # the fetch knows one more value, sorted before the kept ones: every code moves up by one
    back = read_kept(found, {"syncs": TABLES["syncs"], "steps": ("seq",)}, {"how": ["0", "a", "b", "c"], "cat": []})
    assert back["syncs"]["how"].tolist() == (tables["syncs"]["how"] + 1).tolist()
    assert back["steps"]["seq"].tolist() == tables["steps"]["seq"].tolist()
    # a file that changed since: not used; another version: not used
    changed = FileIdentity(files[0].path, 11, 20, 30, 40)
    assert not session_columns.find_kept(str(tmp_path), "v", {0: "s"}, {0: [(5, changed)]})
    assert not session_columns.find_kept(str(tmp_path), "w", {0: "s"}, {0: [(5, files[0])]})
    # replaced by another report after this one decided to use it: said, not read
    stale = KeptSession(path, [FileIdentity("rank-00000/other.jsonl", 1, 2, 3, 4).entry()], found.fids, found.vocab)
    with pytest.raises(KeptChanged, match="another report"):
        read_kept(stale, {"steps": ("seq",)}, {"how": [], "cat": []})
    # a code past its vocabulary (a damaged array, its header whole): said, not read
    head = session_columns.read_head(path)
    assert head is not None
    _, offset, _ = head["arrays"]["syncs.how"]
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(np.array([9], dtype=np.int32).tobytes())
    with pytest.raises(KeptChanged, match="how: a code out of the range"):
        read_kept(found, {"syncs": TABLES["syncs"]}, {"how": ["0", "a", "b", "c"], "cat": []})
    Path(path).write_bytes(Path(path).read_bytes()[:200])  # torn
    with pytest.warns(UserWarning, match="kept columns .* cannot be read"):
        assert not session_columns.find_kept(str(tmp_path), "v", {0: "s"}, {0: [(5, files[0])]})


@pytest.fixture
def keep_every_session(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_SEGMENT_CACHE, "1")
    monkeypatch.setattr(cache_keep, "KEEP_MIN_STEPS", 0)


@pytest.mark.usefixtures("keep_every_session")
@pytest.mark.processes
def test_reports_with_kept_columns_are_the_cold_one_and_a_replaced_file_reads_the_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = write_many_ranks(tmp_path / "run", ranks=4, long_line=True)
    cold = _report(run, cache=False)
    assert _report(run, cache=True) == cold  # keeps the columns of every session with a closed file
    folder = Path(run_cache_dir(str(run), "segments"))
    kept = sorted(folder.glob("columns-*.columns"))
    assert kept
    used: list[int] = []
    real = session_columns.find_kept

    def finding(*args: Any) -> dict[int, KeptSession]:
        found = real(*args)
        used.append(len(found))
        return found

    monkeypatch.setattr(cache_keep, "find_kept", finding)
    assert _report(run, cache=True) == cold
    assert used[-1] == len(kept)
    assert _report(run, cache=True, workers=2) == cold
    # another report replaces a file after this one decided to use it: read again without them
    def replaced(*args: Any) -> dict[int, KeptSession]:
        found = real(*args)
        for sid, mine in found.items():
            found[sid] = KeptSession(mine.path, [*mine.files[:-1], dict(mine.files[-1], size=-1)], mine.fids, mine.vocab)
        return found

    monkeypatch.setattr(cache_keep, "find_kept", replaced)
    tries: list[bool] = []
    real_load = load._load_run

    def counting(*args: Any, **kwargs: Any) -> Any:
        tries.append(kwargs.get("keep_columns", True))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(load, "_load_run", counting)
    assert _report(run, cache=True) == cold
    assert tries == [True, False]
    monkeypatch.setattr(cache_keep, "find_kept", finding)
    # damaged: a warning each, the sessions read from the segment cache, and kept again
    for path in kept:
        path.write_bytes(b"goodtrace-columns\n" + b"\x00" * 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _report(run, cache=True) == cold
    assert len([w for w in caught if "kept columns" in str(w.message)]) == len(kept)
    assert _report(run, cache=True) == cold
    assert used[-1] == len(kept)
    # stale (another RUN_MODEL_VERSION): quietly not used, then kept again
    monkeypatch.setattr(duckdb_sql, "RUN_MODEL_VERSION", "another")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _report(run, cache=True) == cold
    assert not [w for w in caught if "kept columns" in str(w.message)]
    assert used[-1] == 0
    assert _report(run, cache=True) == cold
    assert used[-1] == len(kept)


@pytest.mark.parametrize("start", [0, 40, 99, 200])
def test_the_compute_new_spans_add_is_joined_to_the_kept_one_by_seq(tmp_path: Path, start: int) -> None:
    """What the new files' compute spans add to a kept session (``compute_added``, by seq) is
    joined to its kept outermost compute when the session is fetched: end to end when the new
    executions follow the kept ones, else summed by seq (a kept execution gains compute)."""
    from goodtrace.read.model_fetch import _kept_compute

    _, files, tables = _kept_file(tmp_path)
    [found] = session_columns.find_kept(str(tmp_path), "v", {0: "s"}, {0: [(5, files[0])]}).values()
    kept = session_columns.KeptColumns(str(tmp_path), "v", {0: "s"}, {0: found})
    outer = _with_outer(tables)["outer"]
    assert len(outer["seq"]) > 1
    rng = np.random.default_rng(start)
    seq = np.unique(rng.integers(start, start + 60, 20)).astype(np.int64)
    ns = rng.integers(1, 1_000, len(seq)).astype(np.int64)
    kept.compute_added[0] = (seq, ns)
    got_seq, got_ns = _kept_compute(kept, 0)
    every = dict.fromkeys(outer["seq"].tolist() + seq.tolist(), 0)
    for s, n in [*zip(outer["seq"].tolist(), outer["ns"].tolist(), strict=True), *zip(seq.tolist(), ns.tolist(), strict=True)]:
        every[s] += n
    want_seq = sorted(every)  # each seq once, in order, its ns summed
    assert (list(got_seq), list(got_ns)) == (want_seq, [every[s] for s in want_seq])
