"""The segment cache: a report keeps the reduction of every closed segment beside the run and
reads only what is new, and the JSON report is the cold one to the byte: on a growing run
written by the real recorder in small segments (reported, continued, reported again), on a
run with crashes, torn lines, bad lines and a line too long for DuckDB (in one process and on
a pool), and after the cache or a segment was damaged or rewritten."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from goodtrace.analysis import analyze
from goodtrace.read import cache_keep, segment_cache
from goodtrace.read.chunk_files import HOST_TAG
from goodtrace.read.compact import COMPACT_DIR
from goodtrace.read.engine import Engine
from goodtrace.read.environment import run_cache_dir
from goodtrace.read.load import compact_run, load_run
from goodtrace.read.segment_cache import ENV_SEGMENT_CACHE, MAX_CHUNKS
from goodtrace.renderers.json_report import render_json
from helpers.builders import Proc
from helpers.growing import WORK
from helpers.many_ranks import NOW, write_many_ranks

pytestmark = pytest.mark.processes

# One rank of a training loop through the public API, in segments of 4 KiB; it writes STEPS
# steps, says "paused" and waits for a line on stdin, then writes as many more and finishes.
# No heartbeat while it waits (one flush an hour; each step is flushed by hand), so that the
# files stay as they are while the test reads them.
WRITER = WORK + r"""
import sys
run, rank, world, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
gt.init(run, rank=rank, world_size=world, segment_bytes=4096, flush_interval_s=3600)
for k in range(steps):
    work(k, 0.001 * (1 + rank))
print("paused", flush=True)
sys.stdin.readline()
for k in range(steps, 2 * steps):
    work(k, 0.001 * (1 + rank))
gt.finish()
"""


def _report(run: Path, *, cache: bool, workers: int = 1, labels: list[tuple[str, int]] | None = None) -> str:
    def progress(label: str, done: int, total: int) -> None:
        if labels is not None and label.startswith("reading rank files"):
            labels.append((label, total))

    loaded = load_run(run, engine=Engine(workers=workers), use_cache=cache, progress=progress)
    return render_json(analyze(loaded, now_wall_ns=NOW, release_records=True))


def _chunks(run: Path) -> list[Path]:
    return sorted(Path(run_cache_dir(str(run), "segments")).glob("*.json"))


@pytest.fixture(autouse=True)
def _cache_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_SEGMENT_CACHE, "1")
    # every session's long columns kept (not only those of 10,000 executions or more): each
    # test here holds reports that use them to the cold one
    monkeypatch.setattr(cache_keep, "KEEP_MIN_STEPS", 0)


def test_a_growing_run_reads_only_its_new_segments_and_reports_as_a_cold_read(tmp_path: Path) -> None:
    run = tmp_path / "run"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(run), str(rank), "2", "120"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for rank in range(2)]
    try:
        for writer in writers:
            assert writer.stdout is not None and writer.stdout.readline().strip() == "paused"
        segments = sorted(run.glob("rank-*/*.jsonl"))
        assert len(segments) >= 6  # several closed segments per rank, and each rank's open one
        cold = _report(run, cache=False)
        assert _report(run, cache=True) == cold  # fills the cache with the closed segments
        assert _chunks(run)
        read: list[tuple[str, int]] = []
        assert _report(run, cache=True, labels=read) == cold
        assert read and {total for _, total in read} == {2}  # only the two open segments were parsed
        for writer in writers:  # the run goes on: more segments, then each rank finishes
            assert writer.stdin is not None
            writer.stdin.write("go\n")
            writer.stdin.flush()
        for writer in writers:
            assert writer.wait(timeout=120) == 0
    finally:
        for writer in writers:
            if writer.poll() is None:
                writer.kill()
                writer.wait()
            for stream in (writer.stdin, writer.stdout):
                if stream is not None:
                    stream.close()
    grown = sorted(run.glob("rank-*/*.jsonl"))
    assert len(grown) > len(segments)
    read = []
    warm = _report(run, cache=True, labels=read)
    cold = _report(run, cache=False)
    assert warm == cold
    # what was closed before was not parsed again: at most the segments new since, and the two
    # that were open then
    assert read and max(total for _, total in read) <= len(grown) - len(segments) + 2
    assert _report(run, cache=True, workers=2) == cold  # every segment closed now: all from the cache
    assert _report(run, cache=False, workers=2) == cold
    # three workers for two sessions: the sessions' segments are split between the tasks
    assert _report(run, cache=False, workers=3) == cold


@pytest.fixture(scope="module")
def many_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_many_ranks(tmp_path_factory.mktemp("many") / "run", ranks=16, long_line=True)


def test_crashes_torn_lines_and_a_long_line_read_from_the_cache_give_the_cold_report(
    many_ranks: Path, tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    shutil.copytree(many_ranks, run)
    cold = _report(run, cache=False)
    assert _report(run, cache=True) == cold
    assert _chunks(run)
    assert _report(run, cache=True) == cold
    assert _report(run, cache=True, workers=2) == cold
    warnings_text = "\n".join(json.loads(cold)["warnings"])
    assert "end in a torn line" in warnings_text and "longer than 32 MiB" in warnings_text


def _finished_run(many_ranks: Path, tmp_path: Path) -> tuple[Path, str]:
    run = tmp_path / "run"
    shutil.copytree(many_ranks, run)
    cold = _report(run, cache=False)
    assert _report(run, cache=True) == cold
    return run, cold


def test_a_damaged_chunk_is_ignored_once_and_rebuilt(many_ranks: Path, tmp_path: Path) -> None:
    run, cold = _finished_run(many_ranks, tmp_path)
    [index] = [p for p in _chunks(run) if json.loads(p.read_text())["kind"] == "model"]
    # the summaries: read whatever is kept beside the chunk (a session's long columns are not)
    table = Path(run_cache_dir(str(run), "segments")) / json.loads(index.read_text())["tables"]["seg_summ"]
    table.write_bytes(table.read_bytes()[:100])  # torn
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _report(run, cache=True) == cold
    assert len([w for w in caught if "segment cache" in str(w.message)]) == 1
    assert not index.exists() and not table.exists()  # removed; the files were read and kept again
    assert any(json.loads(p.read_text())["kind"] == "model" for p in _chunks(run))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _report(run, cache=True) == cold
    assert not [w for w in caught if "segment cache" in str(w.message)]
    # a torn index, and a chunk of another version: ignored, rebuilt
    for path in _chunks(run):
        text = path.read_text()
        if "detail" in text:
            path.write_text(text[: len(text) // 2])
        else:  # as another release (or other code) wrote it
            path.write_text(json.dumps(json.loads(text) | {"version": "2-another-release"}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _report(run, cache=True) == cold
    assert len([w for w in caught if "segment cache" in str(w.message)]) == 1
    assert _report(run, cache=True) == cold


def test_a_segment_rewritten_with_the_same_size_is_read_again(many_ranks: Path, tmp_path: Path) -> None:
    run, before = _finished_run(many_ranks, tmp_path)
    segment = sorted(run.glob("rank-00000/*.jsonl"))[0]  # the reference rank: its detail is cached too
    text = segment.read_text()
    assert '"cat":"data"' in text
    changed = text.replace('"cat":"data"', '"cat":"eval"', 3)  # time waiting for data becomes evaluation
    stat = segment.stat()
    segment.write_text(changed)
    os.utime(segment, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert segment.stat().st_size == stat.st_size
    warm = _report(run, cache=True)
    assert warm == _report(run, cache=False)
    assert warm != before  # the rewritten step's time is in the numbers, not the cached one


def test_what_a_killed_report_left_is_removed_and_trips_nothing(many_ranks: Path, tmp_path: Path) -> None:
    run, cold = _finished_run(many_ranks, tmp_path)
    folder = Path(run_cache_dir(str(run), "segments"))
    for index in _chunks(run):
        index.unlink()  # killed before its index was written: its tables are orphans, of a process gone
    for table in folder.glob("*.parquet"):
        table.rename(folder / ("c999999998-" + table.name.split("-", 1)[1]))
    (folder / f"c999999999-{HOST_TAG}89abcdef-seg_summ.parquet.partial").write_bytes(b"PAR1 half")
    (folder / f"c999999999-{HOST_TAG}89abcdef.json.999999999.partial").write_text("{")
    # another host's report sharing the cache (a home directory on NFS), still writing: its pid
    # says nothing here, so its files stay; one of its files untouched for two days goes
    other = "ffff" if HOST_TAG != "ffff" else "eeee"
    (folder / f"c12-{other}89abcdef-seg_summ.parquet.partial").write_bytes(b"PAR1 half")
    (folder / f"c13-{other}89abcdef-seg_summ.parquet.partial").write_bytes(b"PAR1 half")
    os.utime(folder / f"c13-{other}89abcdef-seg_summ.parquet.partial", (time.time() - 2 * 86_400,) * 2)
    assert _report(run, cache=True) == cold
    left = [p.name for p in folder.iterdir() if p.name.startswith(("c99999999", "c12-", "c13-")) or p.name.endswith(".partial")]
    assert left == [f"c12-{other}89abcdef-seg_summ.parquet.partial"]
    names = {p.name.split("-", 2)[0] + "-" + p.name.split("-", 2)[1] for p in folder.glob("*.parquet")}
    assert names == {p.name[: -len(".json")] for p in _chunks(run)}  # no orphan tables are left


def test_compact_is_the_cache_of_every_segment(many_ranks: Path, tmp_path: Path) -> None:
    run, cold = _finished_run(many_ranks, tmp_path)
    compact_run(run)
    assert not [p for p in _chunks(run) if json.loads(p.read_text())["kind"] == "model"]  # held by compact now
    cold = _report(run, cache=False)  # from the compacted copy, extracted again
    read: list[tuple[str, int]] = []
    assert _report(run, cache=True, labels=read) == cold
    # segments with a long line are read again (their records are needed from a copy)
    assert len(read) <= 1


def test_chunks_of_many_reports_are_merged_into_one(many_ranks: Path, tmp_path: Path) -> None:
    """Each report that finds new closed segments keeps a chunk; past MAX_CHUNKS of a kind, the
    next one holds the files of all of them and replaces them."""
    run = tmp_path / "run"
    ranks = sorted(many_ranks.glob("rank-*"))
    run.mkdir()
    for rank in ranks[:2]:
        shutil.copytree(rank, run / rank.name)
    for rank in ranks[2:2 + MAX_CHUNKS + 1]:  # the run gains a rank's finished sessions each time
        shutil.copytree(rank, run / rank.name)
        assert _report(run, cache=True) == _report(run, cache=False)
    kinds = [json.loads(p.read_text())["kind"] for p in _chunks(run)]
    assert 1 <= kinds.count("model") < MAX_CHUNKS
    read: list[tuple[str, int]] = []
    assert _report(run, cache=True, labels=read) == _report(run, cache=False)
    # parsed: only the segments never closed (each rank's first attempt crashed, without a
    # finish) and rank 1's file with a line too long for DuckDB (never kept)
    assert {total for _, total in read} == {len(list(run.glob("rank-*"))) + 1}


def test_merges_rewrite_the_small_chunks_not_a_large_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks merge by level (``SegmentCache.merging``): a report that finds MAX_CHUNKS small
    chunks merges those, and leaves the large chunk of an earlier report as it is (rewriting
    it every MAX_CHUNKS reports made the re-reports of a long run cost its square)."""
    source = write_many_ranks(tmp_path / "source", ranks=12 + MAX_CHUNKS + 1, steps=1000)
    ranks = sorted(source.glob("rank-*"))
    run = tmp_path / "run"
    run.mkdir()
    for rank in ranks[:12]:
        shutil.copytree(rank, run / rank.name)
    assert _report(run, cache=True) == _report(run, cache=False)

    def model_chunks() -> dict[str, int]:  # index file -> the chunk's bytes
        out = {}
        for index in _chunks(run):
            found = json.loads(index.read_text())
            if found["kind"] == "model":
                out[index.name] = sum((index.parent / name).stat().st_size for name in found["tables"].values())
        return out

    ((large, size),) = model_chunks().items()
    monkeypatch.setattr(segment_cache, "MERGE_FLOOR", size // MAX_CHUNKS)  # the large chunk: level 1
    for rank in ranks[12:]:  # a rank's finished sessions more each time: a small chunk each
        if len(model_chunks()) == 1 + MAX_CHUNKS:
            assert all(n < size // MAX_CHUNKS for name, n in model_chunks().items() if name != large)  # level 0
        shutil.copytree(rank, run / rank.name)
        assert _report(run, cache=True) == _report(run, cache=False)
    kept = model_chunks()
    assert large in kept and kept[large] == size  # never rewritten
    assert len(kept) == 2  # the MAX_CHUNKS small ones and the last report's files, merged into one
    read: list[tuple[str, int]] = []
    assert _report(run, cache=True, labels=read) == _report(run, cache=False)
    assert {total for _, total in read} == {len(ranks)}  # each rank's crashed first attempt, never closed


def test_a_run_directory_it_cannot_write_keeps_its_cache_in_the_cache_dir(
    many_ranks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = tmp_path / "run"
    shutil.copytree(many_ranks, run)
    (run / COMPACT_DIR).write_text("not a folder")  # RUN/compact/cache/ cannot be made
    monkeypatch.setenv("GOODTRACE_CACHE_DIR", str(tmp_path / "cache"))
    cold = _report(run, cache=False)
    assert _report(run, cache=True) == cold
    kept = list((tmp_path / "cache" / "segments").glob("*/*.json"))
    assert kept
    assert _report(run, cache=True) == cold
    assert sorted((tmp_path / "cache" / "segments").glob("*/*.json")) == sorted(kept)  # nothing new to keep


def test_a_damaged_table_of_span_starts_is_read_again_without_counting_twice(
    many_ranks: Path, tmp_path: Path,
) -> None:
    """The span starts of a cached segment are read last (their sample needs every file's
    summary): a chunk that fails there has its files read again whole, their skipped lines
    counted once."""
    run, cold = _finished_run(many_ranks, tmp_path)
    [index] = [p for p in _chunks(run) if json.loads(p.read_text())["kind"] == "model"]
    table = Path(run_cache_dir(str(run), "segments")) / json.loads(index.read_text())["tables"]["seg_starts"]
    table.write_bytes(b"PAR1" + b"\0" * 64 + b"PAR1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _report(run, cache=True) == cold
    assert len([w for w in caught if "segment cache" in str(w.message)]) == 1
    assert _report(run, cache=True) == cold


def _split(proc: Proc, run: Path, cuts: list[int]) -> None:
    """``proc``'s records as segments cut before the record at each index of ``cuts`` (the
    header again at the top of each, its segment number counted up), the last one finished."""
    folder = run / f"rank-{proc.rank:05d}"
    folder.mkdir(parents=True, exist_ok=True)
    bounds = [0, *cuts, len(proc.lines)]
    for number, (a, b) in enumerate(itertools.pairwise(bounds)):
        lines = [dict(proc.header, segment=number), *proc.lines[a:b]]
        (folder / f"{proc.session}.{number:05d}.jsonl").write_text(
            "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines))


def _crossing(run: Path, seq: bool = True, steps: int = 8) -> Proc:
    """A session whose records reach across the segments it is split into: an outer compute
    span that ends steps after it began, a span without a step, a tag and a metric a step."""
    p = Proc(run, seq=seq)
    p.span("init", 0.0, 1.0, cat="init")
    t = 1.0
    for k in range(steps):
        p.span("data", t, t + 0.1, cat="data", step=k)
        p.span("forward", t + 0.1, t + 0.6, cat="compute", step=k)
        p.step(k, t, t + 1.0)
        p.sync(k, t + 1.0)
        p.tag(k, "phase", t + 0.5)
        p.metric("loss", k, 1.0 / (k + 1), t + 1.0)
        t += 1.0
    p.span("graph", 2.05, 6.9, cat="compute", step=1)  # outer: began in step 1, ends in step 5
    p.span("tail", 8.5, 9.5, cat="compute")  # no step: the execution entered last
    p.finish(t + 0.5)
    return p


def test_a_long_session_is_parsed_a_few_files_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A session of many files is parsed in parts of a few files (``fold_batches.batch_parts``) and
    its detail read the same way (``detail.extract_details``): parsed whole, a session of 10 M
    steps was one table DuckDB could not group within its memory. Here parts of one and of two
    files of a session of eight give the report that one batch gives, read from the JSON lines
    and from the compacted copy (whose reduction is extracted in the same parts)."""
    from goodtrace.read import fold_batches

    run = tmp_path / "run"
    p = _crossing(run, steps=24)
    _split(p, run, [len(p.lines) * k // 8 for k in range(1, 8)])
    assert len(list(run.glob("rank-*/*.jsonl"))) == 8
    whole = _report(run, cache=False)
    for files in (1, 2):
        monkeypatch.setattr(fold_batches, "FOLD_BATCH_FILES", files)
        monkeypatch.setattr(fold_batches, "FOLD_BATCH_BYTES", 0)
        assert _report(run, cache=False) == whole
        compact_run(run)  # its reduction extracted a few files at a time too
        compacted, expected = json.loads(_report(run, cache=True)), json.loads(whole)
        assert (compacted.pop("form"), expected.pop("form")) == ("parquet", "jsonl")
        assert compacted == expected
        shutil.rmtree(run / COMPACT_DIR)  # and the cache beside it


def _without_path(report: str) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(report)
    parsed.pop("path", None)
    return parsed


@pytest.mark.parametrize("seq", [True, False], ids=["numbered", "older files without seq"])
def test_records_that_reach_across_segments_count_as_in_one_file(tmp_path: Path, seq: bool) -> None:
    """An outer compute span is written when it ends, in a later segment than the spans it
    holds; steps and spans of one execution sit in two segments; older files number their
    executions by entry order across files. One file, the same records in three segments read
    cold, and the three segments read from the cache give the same report."""
    def proc(run: Path) -> Proc:
        return _crossing(run, seq)

    one = proc(tmp_path / "one" / "run")
    one.write()
    split = tmp_path / "split" / "run"
    three = proc(split)
    _split(three, split, [12, 24])
    assert len(list(split.glob("rank-*/*.jsonl"))) == 3
    cold = _report(one.run_dir, cache=False)
    assert _without_path(_report(split, cache=False)) == _without_path(cold)
    assert _report(split, cache=True) == _report(split, cache=False)  # fills the cache
    read: list[tuple[str, int]] = []
    assert _report(split, cache=True, labels=read) == _report(split, cache=False)
    assert not read  # every segment from the cache: the session finished


def test_the_listed_sample_steps_are_the_sample_s_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The span starts a warm report loads from a chunk are filtered by the sample's rule; the
    steps it also lists (for the Parquet reader to skip row groups) are exactly the steps that
    rule keeps of each session's range, so the list drops no row the rule keeps."""
    import duckdb

    from goodtrace.read import duckdb_sql
    from goodtrace.read.loaded import sample_stride

    con = duckdb.connect()
    con.execute("CREATE TABLE seg_summ (sid INTEGER, first_step BIGINT, last_step BIGINT)")
    ranges = {0: (0, 999_999), 1: (5, 20), 2: (-40, 3_000), 3: (None, None)}
    con.executemany("INSERT INTO seg_summ VALUES (?, ?, ?)", [(sid, lo, hi) for sid, (lo, hi) in ranges.items()])
    con.execute("CREATE TABLE p (sid INTEGER, step BIGINT)")
    con.execute("INSERT INTO p SELECT sid, step FROM (VALUES (0), (1), (2)) s(sid), range(-50, 1_000_001) r(step)")
    con.execute("CREATE TABLE m AS SELECT DISTINCT sid FROM p")

    def kept(rule: str) -> list[tuple[int, int]]:
        return sorted(con.execute(f"SELECT p.sid, p.step FROM p JOIN m ON p.sid = m.sid {rule}").fetchall())

    listed = duckdb_sql.sampled_starts(con)
    assert " AND p.step IN (" in listed
    every = kept(duckdb_sql.SAMPLED_STARTS)
    assert kept(listed) == every
    for sid in (0, 1, 2):  # about SAMPLE_STEPS steps of each range, every one inside it: its stride's multiples
        lo, hi = ranges[sid]
        steps = [step for s, step in every if s == sid]
        stride = sample_stride(lo, hi)
        assert steps == list(range(lo + (-lo) % stride, hi + 1, stride)) and lo <= min(steps) and max(steps) <= hi
        assert duckdb_sql.SAMPLE_STEPS <= len(steps) <= 2 * duckdb_sql.SAMPLE_STEPS or hi - lo < duckdb_sql.SAMPLE_STEPS
    assert {sid for sid, _ in every} == {0, 1, 2}
    monkeypatch.setattr(duckdb_sql, "PRUNE_STEPS", 10)  # too many to list: the rule alone
    assert duckdb_sql.sampled_starts(con) == duckdb_sql.SAMPLED_STARTS
