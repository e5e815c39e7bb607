"""The DuckDB reader: torn and corrupt lines, missing finish records, headerless files, newer
and older schema versions, many ranks with a detail sample, and the compacted Parquet form
(including segments that grow or appear after compaction)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from goodtrace.analysis import analyze
from goodtrace.read.load import NotARunError, compact_run, load_run
from helpers.builders import Proc, buckets_s, load


def test_not_a_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(NotARunError, match="no goodtrace records"):
        load_run(tmp_path)
    with pytest.raises(NotARunError, match="not a directory"):
        load_run(tmp_path / "nothing")
    # Without s3fs: "install s3fs"; with it (the test extra has it for the storage tests): an
    # endpoint on loopback where nothing listens, so no request ever leaves this machine.
    for name, value in {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_EC2_METADATA_DISABLED": "true",
                        "AWS_MAX_ATTEMPTS": "1"}.items():
        monkeypatch.setenv(name, value)
    # a client an earlier test made (fsspec keeps one per set of options) would not see these
    # variables: it retries an endpoint that is gone, several seconds
    if importlib.util.find_spec("s3fs") is not None:
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(NotARunError, match=r"cannot list the run \("):
        load_run("s3://bucket/run")


def test_corrupt_lines_headerless_and_newer_files(tmp_path: Path) -> None:
    p = Proc(tmp_path)
    p.loop(range(3), 0.0)
    p.finish(3.0)
    path = p.write()
    lines = path.read_text().splitlines()
    lines.insert(2, '{"kind":"step","step":')  # corrupt line in the middle: skipped
    path.write_text("\n".join(lines) + "\n")
    (tmp_path / "rank-00000" / "junk.00000.jsonl").write_text('{"kind":"span"}\n')
    newer = Proc(tmp_path, rank=1, world=2, schema_version=99)
    newer.loop(range(3), 0.0)
    newer.write()
    loaded = load(tmp_path)
    assert [s.rank for s in loaded.sessions] == [0]
    text = " ".join(loaded.warnings)
    assert "does not start with a goodtrace header" in text
    assert "schema version 99, newer than this goodtrace reads" in text
    result = analyze(loaded)
    # the corrupt line was step 0's record; its interval still closes at its sync point
    assert buckets_s(result.partition) == {"productive": 3.0}


def test_missing_finish_is_lost_ending_at_the_last_sign_of_life(tmp_path: Path) -> None:
    p = Proc(tmp_path)
    p.loop(range(3), 0.0)
    p.heartbeat(4.0)
    p.write(torn=True)
    loaded = load(tmp_path)
    (session,) = loaded.sessions
    assert not session.has_finish
    result = analyze(loaded)
    # no finish record, no later attempt, heartbeats stopped: lost (since its last heartbeat)
    assert result.attempts[0].ended == "lost"
    assert result.attempts[0].ending.detail.startswith("no heartbeat since ")
    assert buckets_s(result.partition) == {"productive": 3.0, "disruption": 1.0}


def test_stopped_early_and_exited_attempts(tmp_path: Path) -> None:
    a = Proc(tmp_path)
    a.loop(range(2), 0.0)
    a.finish(2.0, completed=False, reason="finish")
    a.write()
    b = Proc(tmp_path, start=5.0)
    b.loop(range(2, 4), 5.0)
    b.finish(7.0, completed=None, reason="exit")
    b.write()
    result = analyze(load(tmp_path))
    assert [x.ended for x in result.attempts] == ["stopped early", "exited"]
    assert buckets_s(result.partition) == {"productive": 4.0, "disruption": 3.0}


def test_every_rank_is_analysed_and_only_the_reference_rank_read_in_full(tmp_path: Path) -> None:
    for rank in range(12):
        p = Proc(tmp_path, rank=rank, world=12)
        p.loop(range(4), 0.0, step_s=1.0 + (0.5 if rank == 7 else 0.0))
        p.finish(6.0)
        p.write()
    loaded = load_run(tmp_path)
    assert {loaded.sessions[i].rank for i in loaded.details} == {0}
    assert len(loaded.session_records) == 12
    result = analyze(loaded)
    assert result.spread.ranks == 12 and result.spread.analysed == 12
    assert result.spread.step_time_median_max_s == 1.5
    goodput = {f.rank: f.goodput for f in result.spread.per_rank}
    assert goodput[0] == pytest.approx(4 / 6) and goodput[7] == pytest.approx(6 / 6)


def test_compact_round_trip_and_later_segments(tmp_path: Path) -> None:
    a = Proc(tmp_path, restart=0)
    a.span("init", 0, 1)
    a.loop(range(3), 1.0)
    a.heartbeat(4.0)
    a.write()
    result = compact_run(tmp_path)
    assert (result.files, result.records) == (1, 8)
    manifest = json.loads((tmp_path / "compact" / "manifest.json").read_text())
    assert manifest["files"][0]["path"].startswith("rank-00000/")
    compacted = load(tmp_path)
    assert compacted.form == "parquet"
    assert buckets_s(analyze(compacted).partition) == {"productive": 3.0, "startup": 1.0}
    # the job goes on after compaction: a new attempt (JSON) beside the Parquet copy
    b = Proc(tmp_path, restart=1, start=6.0)
    b.loop(range(3, 5), 6.0)
    b.finish(8.0)
    b.write()
    mixed = load(tmp_path)
    assert mixed.form == "parquet+jsonl"
    assert buckets_s(analyze(mixed).partition) == {"productive": 5.0, "startup": 1.0, "disruption": 2.0}
    # a compacted segment that grew since is read from JSON again, not twice
    a.heartbeat(4.5)
    a.write()
    regrown = analyze(load(tmp_path))
    assert buckets_s(regrown.partition) == {"productive": 5.0, "startup": 1.0, "disruption": 2.0}
    again = load(tmp_path)
    assert (again.form, again.records) == ("jsonl", 9 + 6)


@pytest.mark.processes
def test_importing_goodtrace_does_not_import_duckdb_or_rich() -> None:
    import subprocess
    import sys

    code = ("import sys, goodtrace, goodtrace.read.load, goodtrace.analysis; "
            "print(sorted(m for m in ('duckdb', 'rich') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_damaged_compacted_copy_falls_back_to_json_lines(tmp_path: Path) -> None:
    p = Proc(tmp_path)
    p.loop(range(3), 0.0)
    p.finish(3.0)
    p.write()
    compact_run(tmp_path)
    (tmp_path / "compact" / "records.parquet").write_bytes(b"PAR1 not really parquet")
    loaded = load(tmp_path)
    assert loaded.form == "jsonl"
    assert "compacted copy could not be read" in loaded.warnings[0]
    assert buckets_s(analyze(loaded).partition) == {"productive": 3.0}


def test_a_run_on_object_storage_is_read_through_a_local_mirror(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """s3://, gs://... are fsspec URLs; memory:// is the same code path without a network."""
    import os

    import fsspec

    monkeypatch.setenv("GOODTRACE_CACHE_DIR", str(tmp_path / "cache"))
    local = tmp_path / "run"
    a = Proc(local, restart=0)
    a.span("init", 0, 1)
    a.loop(range(3), 1.0)
    a.heartbeat(4.0)
    a.write()
    fs = fsspec.filesystem("memory")
    url = "memory://goodtrace-tests/mirrored"

    def upload() -> None:
        for path in sorted(local.glob("rank-*/*.jsonl")):
            fs.pipe_file(f"/goodtrace-tests/mirrored/{path.parent.name}/{path.name}", path.read_bytes())

    upload()
    loaded = load_run(url)
    assert buckets_s(analyze(loaded).partition) == buckets_s(analyze(load(local)).partition)
    assert any("local mirror" in w for w in loaded.warnings)
    (mirrored,) = (tmp_path / "cache").glob("*/mirrored/rank-*/*.jsonl")  # <hash of the URL>/<its name>
    assert (mirrored.parent.parent / "SOURCE").read_text().strip() == url
    first_mtime = os.stat(mirrored).st_mtime_ns
    # the job goes on: a second attempt appears; only the new file is fetched
    b = Proc(local, restart=1, start=6.0)
    b.loop(range(3, 5), 6.0)
    b.finish(8.0)
    b.write()
    upload()
    again = analyze(load_run(url))
    assert buckets_s(again.partition) == {"productive": 5.0, "startup": 1.0, "disruption": 2.0}
    assert os.stat(mirrored).st_mtime_ns == first_mtime
    assert len(list((tmp_path / "cache").glob("*/mirrored/rank-*/*.jsonl"))) == 2


def test_unreadable_urls_are_clear_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOODTRACE_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(NotARunError, match="cannot list the run"):
        load_run("nosuchprotocol://bucket/run")
    with pytest.raises(NotARunError, match="holds no goodtrace records"):
        load_run("memory://goodtrace-tests/empty")


@pytest.mark.slow
def test_the_run_model_in_memory_and_in_a_database_file_give_the_same_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small run model is held in memory, a large one in a database file (read/load.py,
    IN_MEMORY_BYTES): the same report either way, over many blocks of sessions (64 ranks,
    fetched a few at a time), and the connection is the one chosen."""
    from goodtrace.read import duckdb_sql, model_fetch
    from goodtrace.read import load as load_module
    from goodtrace.read.engine import Engine
    from helpers.many_ranks import report_read_by, write_many_ranks

    run = write_many_ranks(tmp_path / "run", ranks=64)
    monkeypatch.setenv("GOODTRACE_SEGMENT_CACHE", "0")
    monkeypatch.setattr(model_fetch, "SESSION_BATCH", 8)  # eight blocks, each released after its fetch
    modes: list[bool] = []
    settle = duckdb_sql.settle

    def noting(con: object) -> None:
        modes.append(duckdb_sql.is_in_memory(con))
        settle(con)

    monkeypatch.setattr(duckdb_sql, "settle", noting)
    in_memory = report_read_by(run, Engine(workers=1))
    monkeypatch.setattr(load_module, "IN_MEMORY_BYTES", 0)
    in_a_file = report_read_by(run, Engine(workers=1))
    assert modes == [True, False]
    assert in_memory == in_a_file
    assert json.loads(in_memory)["partition"]["goodput"] > 0


def test_a_second_walk_over_the_sessions_fetches_them_a_block_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The analysis fetches a block of sessions at a time, and a session of a block fetched
    before alone (the reference sessions, cut last). A second walk over every session (a view
    cutting each rank again, a second analysis of the loaded run) fetches the rest of each block
    once it is seen to walk in order, not one session a query (1,600 ranks: 43 s -> 1.8 s);
    the same report."""
    from goodtrace.read import model_fetch
    from goodtrace.read.engine import Engine
    from goodtrace.renderers.json_report import render_json
    from helpers.many_ranks import write_many_ranks

    run = write_many_ranks(tmp_path / "run", ranks=64)
    monkeypatch.setenv("GOODTRACE_SEGMENT_CACHE", "0")
    monkeypatch.setattr(model_fetch, "SESSION_BATCH", 8)
    fetched: list[list[int]] = []
    fetch = model_fetch._fetch_records

    def noting(con: object, sids: range, *args: object) -> object:
        fetched.append(list(sids))
        return fetch(con, sids, *args)

    monkeypatch.setattr(model_fetch, "_fetch_records", noting)
    loaded = load_run(run, engine=Engine(workers=1))
    first = render_json(analyze(loaded), include_steps=False)
    sessions, blocks, attempts = len(loaded.sessions), -(-len(loaded.sessions) // 8), 2
    assert sessions == 64 * attempts  # every rank crashed once and was restarted
    assert len(fetched) == blocks + attempts, fetched  # the blocks, and each reference session again
    del fetched[:]
    second = render_json(analyze(loaded), include_steps=False)
    assert second == first
    assert sorted({sid for sids in fetched for sid in sids}) == list(range(sessions))
    assert len(fetched) <= blocks + attempts + 2, fetched  # not a query a session
