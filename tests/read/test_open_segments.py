"""A segment still being written is kept in the segment cache as a prefix: a report of a growing
run reads only the bytes written since the last one, and the JSON report is the cold one to
the byte, on a run the real recorder writes: as it grows, with a line being written when the
report reads (torn), after the kept bytes were changed in place, and after the file was
replaced."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from goodtrace.analysis import analyze
from goodtrace.read import fold_batches
from goodtrace.read.cache_keep import PREFIX_STEP_BYTES
from goodtrace.read.engine import Engine
from goodtrace.read.environment import run_cache_dir
from goodtrace.read.load import load_run
from goodtrace.read.segment_cache import ENV_SEGMENT_CACHE
from goodtrace.renderers.json_report import render_json
from helpers.cli import goodtrace
from helpers.growing import WORK, Ranks
from helpers.many_ranks import NOW

pytestmark = [pytest.mark.processes, pytest.mark.slow]

# One rank of a training loop through the public API, all in one segment (the writer's
# default size), each step flushed by hand and no flush on a timer: the file stays as it is
# while the test reads it. Each line on stdin: a number of steps to write ("done" after
# them), or "finish".
WRITER = WORK + r"""
import sys
run, rank = sys.argv[1], int(sys.argv[2])
gt.init(run, rank=rank, world_size=2, flush_interval_s=3600)
k = 0
for line in sys.stdin:
    if line.strip() == "finish":
        break
    for _ in range(int(line)):
        work(k, 0.0005 * (1 + rank))
        k += 1
    print("done", flush=True)
gt.finish()
"""


class Job(Ranks):
    """Two ranks of :data:`WRITER`, driven step by step."""

    def __init__(self, run: Path) -> None:
        super().__init__(WRITER, run)

    def segments(self) -> list[Path]:
        return sorted(self.run.glob("rank-*/*.jsonl"))

    def size(self) -> int:
        return sum(p.stat().st_size for p in self.segments())


@pytest.fixture()
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Job]:
    monkeypatch.setenv(ENV_SEGMENT_CACHE, "1")
    running = Job(tmp_path / "run")
    try:
        yield running
    finally:
        running.close()


def _report(run: Path, *, cache: bool, workers: int = 1) -> tuple[str, int]:
    """The JSON report (with every step) and the bytes of JSON lines the load parsed."""
    loaded = load_run(run, engine=Engine(workers=workers), use_cache=cache)
    read = loaded.read_bytes
    return render_json(analyze(loaded, now_wall_ns=NOW, release_records=True), include_steps=True), read


def _prefixes(run: Path) -> dict[str, list[int]]:
    """Per kind of open chunk, the prefix lengths the cache holds."""
    found: dict[str, list[int]] = {}
    for index in Path(run_cache_dir(str(run), "segments")).glob("*.json"):
        content = json.loads(index.read_text())
        for entry in content["files"]:
            if "prefix" in entry:
                found.setdefault(content["kind"], []).append(entry["prefix"])
    return {kind: sorted(sizes) for kind, sizes in found.items()}


def test_a_report_of_a_growing_segment_reads_only_the_bytes_written_since(job: Job) -> None:
    job.steps(40)
    assert len(job.segments()) == 2  # one open segment a rank: nothing closed to take from the cache
    first = job.size()
    cold, read = _report(job.run, cache=False)
    assert read == first
    warm, read = _report(job.run, cache=True)  # reads everything, keeps each open file as a prefix
    assert (warm, read) == (cold, first)
    # each rank's file as a prefix; the reference rank's (rank 0) detail too
    assert _prefixes(job.run) == {"model-open": sorted(p.stat().st_size for p in job.segments()),
                                  "detail-open": [p.stat().st_size for p in job.segments() if "rank-00000" in str(p)]}
    for workers in (1, 2):  # in this process, and on a pool
        before = job.size()
        job.steps(15)
        cold, _ = _report(job.run, cache=False)
        warm, read = _report(job.run, cache=True, workers=workers)
        assert warm == cold
        # the bytes since the first report: what was read after it was kept (a prefix is kept
        # again only once a megabyte was read after it)
        assert read == job.size() - first
        assert read < before
    nothing_new, read = _report(job.run, cache=True)
    assert (nothing_new, read) == (cold, job.size() - first)
    job.finish()
    cold, _ = _report(job.run, cache=False)
    assert _report(job.run, cache=True)[0] == cold  # finished: the last segments are closed now
    assert _report(job.run, cache=True) == (cold, 0)  # kept whole: nothing to read
    assert _prefixes(job.run) == {}  # and their prefixes pruned


def test_a_line_being_written_when_the_report_reads_is_neither_lost_nor_counted_twice(job: Job) -> None:
    job.steps(30)
    assert _report(job.run, cache=True)[0] == _report(job.run, cache=False)[0]
    segment = next(p for p in job.segments() if "rank-00000" in str(p))  # the reference rank: its steps listed
    line = next(record for record in map(json.loads, reversed(segment.read_bytes().splitlines()))
                if record.get("kind") == "step")
    # a record being written (an event just after the last step): half of its line, then the report
    written = json.dumps({"kind": "event", "name": "probe", "t": line["t1"] + 1_000, "step": line["step"]}).encode()
    with open(segment, "ab") as handle:
        handle.write(written[: len(written) // 2])
    cold, _ = _report(job.run, cache=False)
    warm, _ = _report(job.run, cache=True)
    assert warm == cold and "torn" in cold
    with open(segment, "ab") as handle:  # the write completes; the job goes on
        handle.write(written[len(written) // 2:] + b"\n")
    job.steps(5)
    cold, _ = _report(job.run, cache=False)
    warm, _ = _report(job.run, cache=True)
    assert warm == cold
    report = json.loads(cold)
    assert [event["name"] for event in report["events"]] == ["probe"]  # the completed line counts, once
    assert "torn" not in "".join(json.loads(cold)["warnings"])


def test_kept_bytes_changed_in_place_or_a_replaced_file_are_read_again(job: Job) -> None:
    job.steps(30)
    cold, _ = _report(job.run, cache=False)
    assert _report(job.run, cache=True)[0] == cold
    segment = next(p for p in job.segments() if "rank-00000" in str(p))
    data = bytearray(segment.read_bytes())
    # a loss value near the end of the kept bytes rewritten in place (same inode, same size)
    at = data.rindex(b'"value":') + len(b'"value":')
    while data[at:at + 1] in (b" ",):
        at += 1
    data[at:at + 1] = b"7" if data[at:at + 1] != b"7" else b"8"
    with open(segment, "r+b") as handle:
        handle.write(bytes(data))
    cold, _ = _report(job.run, cache=False)
    warm, read = _report(job.run, cache=True)
    assert warm == cold and read >= segment.stat().st_size  # the changed file read whole
    # the file replaced by another (new inode) holding the same bytes and more
    job.steps(3)
    replacement = segment.with_suffix(".tmp")
    replacement.write_bytes(segment.read_bytes())
    os.replace(replacement, segment)
    cold, _ = _report(job.run, cache=False)
    warm, read = _report(job.run, cache=True)
    assert warm == cold and read >= segment.stat().st_size


def test_a_prefix_is_kept_again_once_enough_was_read_after_it(job: Job) -> None:
    job.steps(10)
    _report(job.run, cache=True)
    kept = _prefixes(job.run)["model-open"]
    start = job.size()
    while min(p.stat().st_size for p in job.segments()) < max(kept) + PREFIX_STEP_BYTES:
        job.steps(1000)
    grown = job.size() - start
    cold, _ = _report(job.run, cache=False)
    warm, read = _report(job.run, cache=True)
    assert warm == cold and read == grown
    longer = _prefixes(job.run)["model-open"]
    assert len(longer) == 2 and all(new > old for new, old in zip(longer, kept, strict=True))  # the old ones pruned
    assert _report(job.run, cache=True) == (cold, 0)


def test_a_last_line_without_its_newline_is_not_kept_as_a_prefix(job: Job) -> None:
    """A file that ends in a whole record whose newline is not written yet: the record is read,
    but the file is not kept (the next report could not tell where to start); once the
    newline is there, the record still counts once."""
    job.steps(10)
    segment = next(p for p in job.segments() if "rank-00000" in str(p))
    line = next(record for record in map(json.loads, reversed(segment.read_bytes().splitlines()))
                if record.get("kind") == "step")
    with open(segment, "ab") as handle:
        handle.write(json.dumps({"kind": "event", "name": "probe", "t": line["t1"] + 1_000, "step": line["step"]}).encode())
    cold, _ = _report(job.run, cache=False)
    assert _report(job.run, cache=True)[0] == cold
    other = next(p for p in job.segments() if "rank-00001" in str(p))
    kept = other.stat().st_size
    assert _prefixes(job.run) == {"model-open": [kept]}  # rank 0's file (and its detail) not kept
    with open(segment, "ab") as handle:
        handle.write(b"\n")
    job.steps(3)
    cold, _ = _report(job.run, cache=False)
    warm, read = _report(job.run, cache=True)
    assert warm == cold
    assert read == segment.stat().st_size + other.stat().st_size - kept  # rank 0 whole, rank 1 after its prefix
    assert [event["name"] for event in json.loads(cold)["events"]] == ["probe"]


def test_a_line_too_long_to_read_after_the_kept_prefix_is_skipped_once(job: Job) -> None:
    job.steps(10)
    assert _report(job.run, cache=True)[0] == _report(job.run, cache=False)[0]
    segment = next(p for p in job.segments() if "rank-00000" in str(p))  # the reference rank: its detail too
    with open(segment, "ab") as handle:
        handle.write(b'{"kind":"event","name":"huge","t":1,"attrs":{"x":"' + b"a" * 40_000_000 + b'"}}\n')
    job.steps(3)
    cold, _ = _report(job.run, cache=False)
    for _ in range(2):  # the file is not kept past its prefix, so both read the line again
        warm, read = _report(job.run, cache=True)
        assert warm == cold and read > 40_000_000
    assert json.loads(cold)["skipped_lines"] == {"too_long": 1}
    # a view that reads the records again: the file without its long line, as when read whole
    records = goodtrace("records", str(job.run), "--json")
    assert records.returncode == 0, records.stderr
    assert json.loads(records.stdout)["skipped"] == {"too_long": 1}


def test_reports_while_the_ranks_write_lose_and_double_nothing(job: Job) -> None:
    """Reports taken while both ranks append (each report reads the files up to where they
    were listed, and keeps whole lines of that); once the ranks pause, a report from the cache
    is the cold one."""
    job.steps(20)
    overlapped = 0
    for _ in range(3):
        for proc in job.procs:  # the ranks write 1,000 steps each, flushing every step ...
            assert proc.stdin is not None
            proc.stdin.write("1000\n")
            proc.stdin.flush()
        _report(job.run, cache=True)  # ... while this report reads
        during = job.size()
        for proc in job.procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "done"
        overlapped += job.size() > during
    assert overlapped  # at least one report read files that were still growing
    cold, _ = _report(job.run, cache=False)
    warm, read = _report(job.run, cache=True)
    assert warm == cold and read < job.size()
    assert len(json.loads(cold)["steps"]) == 20 + 3 * 1000


def test_prefix_chunks_of_files_that_grew_at_different_times_are_merged(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten ranks, each growing past the re-store threshold in a report of its own: each report
    keeps a chunk with one file, and each old chunk lives while it holds some file's longest
    prefix; past MAX_CHUNKS of them, the next report's chunk holds every open file and
    replaces them. Every report is the cold one."""
    from goodtrace.read.segment_cache import MAX_CHUNKS
    from helpers.builders import Proc

    monkeypatch.setenv(ENV_SEGMENT_CACHE, "1")
    run = tmp_path / "run"
    first, grown = 200, 4_700  # steps; 3 lines each (data span, step, sync): about 1.2 MB grown
    procs, paths = [], []
    for rank in range(10):
        proc = Proc(run, rank=rank, world=10)
        proc.loop(range(grown), 1.0 + rank * 0.01, step_s=0.5, data_s=0.05)
        procs.append(proc)
        paths.append(proc.write())
        text = paths[-1].read_text().splitlines(keepends=True)
        paths[-1].write_text("".join(text[:1 + 3 * first]))  # the header and the first steps
    assert _report(run, cache=True)[0] == _report(run, cache=False)[0]
    counts = []
    for rank, proc in enumerate(procs):
        lines = [json.dumps(line, separators=(",", ":")) + "\n" for line in proc.lines[3 * first:]]
        with open(paths[rank], "a") as handle:
            handle.write("".join(lines))
        warm, read = _report(run, cache=True)
        assert warm == _report(run, cache=False)[0]
        assert read == paths[rank].stat().st_size - len("".join(proc_text(proc, first)))
        counts.append(sum(json.loads(index.read_text())["kind"] == "model-open"
                          for index in Path(run_cache_dir(str(run), "segments")).glob("*.json")))
    # one chunk more each report (the first one's lives while it holds a rank not grown yet),
    # until MAX_CHUNKS: then one chunk of every file
    assert counts == [*range(2, MAX_CHUNKS + 1), 1, 2, 3]


def proc_text(proc: Any, steps: int) -> list[str]:
    """The lines of ``proc``'s file that hold its header and first ``steps`` steps."""
    return [json.dumps(line, separators=(",", ":")) + "\n" for line in [proc.header, *proc.lines[:3 * steps]]]


def test_the_new_bytes_are_copied_in_memory_or_on_disk_when_memory_is_full(
    job: Job, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The parts a re-report reads are copied to shared memory when they are small; when a copy
    fails there (the space filled up since it was checked: a disk-full error, injected), it is
    made on disk instead, the report is the cold one, and nothing is left in either place."""
    memory = tmp_path / "shm"
    memory.mkdir()
    monkeypatch.setattr(fold_batches, "SHARED_MEMORY", str(memory))
    job.steps(30)
    _report(job.run, cache=True)
    job.steps(10)
    copied: list[str] = []
    full = [True]  # the first copy in memory fails
    real_copy = fold_batches.range_copy

    def copy(path: str, start: int, end: int, folder: str) -> str:
        copied.append(folder)
        if full and folder.startswith(str(memory)):
            full.clear()
            raise OSError(28, "No space left on device")
        return real_copy(path, start, end, folder)

    monkeypatch.setattr(fold_batches, "range_copy", copy)
    cold, _ = _report(job.run, cache=False)
    warm, read = _report(job.run, cache=True)
    assert warm == cold and read > 0
    assert len(copied) == 3  # two ranks' new bytes: the first copy failed in memory and went to disk
    assert copied[0].startswith(str(memory)) and not copied[1].startswith(str(memory))
    assert copied[2].startswith(str(memory))
    assert not list(memory.iterdir())  # every copy and folder removed
    job.steps(10)
    copied.clear()
    cold, _ = _report(job.run, cache=False)
    assert _report(job.run, cache=True)[0] == cold
    assert copied and all(folder.startswith(str(memory)) for folder in copied)  # small parts: in memory
    monkeypatch.setenv(ENV_SEGMENT_CACHE, "0")  # the cache turned off: nothing to keep, so no copy first
    copied.clear()
    assert _report(job.run, cache=True)[0] == cold and not copied
