"""A rank's own compactor (``compact_interval_s``): real ranks written by the recorder through
the public API, each with the compactor the recorder starts. While the job runs, the closed
segments are reduced into the rank's folder of the segment cache, so that a report parses
only the segments still being written; once the job finished, nothing; the JSON report is
the cold one to the byte either way. A killed rank's compactor makes its last pass and exits."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import goodtrace as gt
from goodtrace.analysis import analyze
from goodtrace.read.compact import COMPACT_DIR
from goodtrace.read.engine import Engine
from goodtrace.read.load import load_run
from goodtrace.read.rank_compact import LOG_NAME
from goodtrace.read.segment_cache import CACHE_DIR, MAX_CHUNKS, RANKS_DIR
from goodtrace.record.config import Config, ConfigError
from goodtrace.record.errors import GoodtraceWarning
from goodtrace.renderers.json_report import render_json
from helpers.growing import WORK, Ranks
from helpers.many_ranks import NOW

pytestmark = [pytest.mark.processes, pytest.mark.slow]

# One rank in small segments (4 KiB: a segment every ~15 steps), flushed by hand each step,
# with its compactor looking every 0.1 s. Each line on stdin: a number of steps ("done" after
# them), or "finish".
WRITER = WORK + r"""
import sys
run, rank = sys.argv[1], int(sys.argv[2])
gt.init(run, rank=rank, world_size=2, flush_interval_s=3600, segment_bytes=4096, compact_interval_s=0.1)
print(gt.recorder().session, flush=True)
k = 0
for line in sys.stdin:
    if line.strip() == "finish":
        break
    for _ in range(int(line)):
        work(k, 0.0002)
        k += 1
    print("done", flush=True)
gt.finish()
"""

WAIT_S = 120  # a bound on a loaded machine, never reached when the compactor works


class Job(Ranks):
    """Two ranks of :data:`WRITER`; each says its session first."""

    def __init__(self, run: Path) -> None:
        super().__init__(WRITER, run)
        self.sessions = [self.line(proc) for proc in self.procs]

    def segments(self, rank: int) -> list[Path]:
        return sorted((self.run / f"rank-{rank:05d}").glob(f"{self.sessions[rank]}.*.jsonl"))

    def folder(self, rank: int) -> Path:
        return self.run / COMPACT_DIR / CACHE_DIR / RANKS_DIR / f"rank-{rank:05d}" / self.sessions[rank]

    def kept(self, rank: int, kind: str = "model") -> dict[str, int]:
        """The files the rank's compactor kept (path in the run -> size), from its chunks' indexes."""
        folder = self.folder(rank)
        while True:
            out: dict[str, int] = {}
            try:
                for index_path in folder.glob("*.json") if folder.is_dir() else ():
                    index = json.loads(index_path.read_text())
                    if index["kind"] == kind:
                        out.update({e["path"]: e["size"] for e in index["files"]})
            except FileNotFoundError:  # merged into a new chunk while listed: list again
                continue
            return out


def compactors(run: Path) -> list[int]:
    """The pids of the compactors of ``run`` still running."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"goodtrace.read.rank_compact" in cmdline and os.fsencode(os.path.abspath(run)) in cmdline:
            found.append(int(entry))
    return found


def wait_for(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        time.sleep(0.05)


def relative(job: Job, path: Path) -> str:
    return path.relative_to(job.run).as_posix()


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Job]:
    running = Job(tmp_path / "run")
    yield running
    running.close()


def report(run: Path, *, cache: bool) -> tuple[str, int]:
    loaded = load_run(run, engine=Engine(workers=1), use_cache=cache)
    read = loaded.read_bytes
    return render_json(analyze(loaded, now_wall_ns=NOW, release_records=True), include_steps=True), read


def at_normal_priority(run: Path, count: int = 2) -> None:
    """The job's ``count`` compactors are started at the lowest CPU priority (asserted here); then, where
    this process may (as root), they are raised to the normal one: at ``SCHED_IDLE`` they run only
    on a core nothing else wants, which a loaded machine (the test suite beside another process
    keeping every core busy) may not have for minutes, and the test's waits are on them."""
    def lowest() -> bool:  # each sets it first thing, nice then SCHED_IDLE: the job's threads first
        pids = compactors(run)
        try:
            return len(pids) == count and all(os.getpriority(os.PRIO_PROCESS, pid) == 19
                                              and os.sched_getscheduler(pid) == os.SCHED_IDLE for pid in pids)
        except ProcessLookupError:  # one ended while looked at: look again
            return False

    wait_for(f"{count} compactor(s) at the lowest CPU priority", lowest)
    raise_priority(run)


def raise_priority(run: Path) -> None:
    """The compactors of ``run`` still running at the normal CPU priority, where this process may."""
    for pid in compactors(run):
        try:
            os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, pid, 0)
        except (PermissionError, ProcessLookupError):  # not root (they stay where the job put them), or gone
            pass


def test_ranks_compact_their_closed_segments_while_the_job_runs(job: Job) -> None:
    job.steps(20)
    at_normal_priority(job.run)
    for _ in range(12):  # a pass of each compactor, or more, between batches: chunks pile up and are merged
        job.steps(20)

        def closed_kept() -> bool:
            return all(set(job.kept(rank)) >= {relative(job, p) for p in job.segments(rank)[:-1]}
                       and set(job.kept(rank, "detail" if rank == 0 else "model")) >= set(job.kept(rank))
                       for rank in range(2))

        wait_for("the closed segments kept by the ranks' compactors", closed_kept)
    for rank in range(2):
        assert len(job.segments(rank)) >= 8  # the run rotated often enough for the test to mean something
        kept = job.kept(rank)
        for p in job.segments(rank)[:-1]:
            assert kept[relative(job, p)] == p.stat().st_size
        assert relative(job, job.segments(rank)[-1]) not in kept  # still being written: never kept whole
        chunks = [json.loads(p.read_text())["kind"] for p in job.folder(rank).glob("*.json")]
        assert 1 <= chunks.count("model") <= MAX_CHUNKS
        assert not (job.folder(rank) / LOG_NAME).exists()
    assert "detail" not in {json.loads(p.read_text())["kind"] for p in job.folder(1).glob("*.json")}  # rank 0's only
    cold, cold_read = report(job.run, cache=False)
    warm, warm_read = report(job.run, cache=True)
    assert warm == cold
    open_bytes = sum(job.segments(rank)[-1].stat().st_size for rank in range(2))
    assert warm_read == open_bytes < cold_read  # only the segments still being written were parsed
    assert len(compactors(job.run)) == 2

    job.finish()
    wait_for("the compactors' last pass, and their exit", lambda: not compactors(job.run))
    for rank in range(2):  # the session finished: its last segment is closed, and kept
        assert set(job.kept(rank)) == {relative(job, p) for p in job.segments(rank)}
    cold, _ = report(job.run, cache=False)
    warm, warm_read = report(job.run, cache=True)
    assert warm == cold
    assert warm_read == 0

    # one of the chunks read together cannot be read: its files are parsed again, with a warning
    # that names it, and the report is still the cold one
    damaged = next(job.folder(1).glob("*-seg_steps.parquet"))
    damaged.write_bytes(damaged.read_bytes()[:100])
    index = json.loads(damaged.with_name(damaged.name.split("-seg_")[0] + ".json").read_text())
    with pytest.warns(gt.GoodtraceWarning, match="has a chunk that cannot be read"):
        warm, warm_read = report(job.run, cache=True)
    assert warm == cold
    assert warm_read == sum((job.run / e["path"]).stat().st_size for e in index["files"])


def test_a_killed_ranks_compactor_makes_its_last_pass_and_exits(job: Job) -> None:
    job.steps(100)
    at_normal_priority(job.run)
    for proc in job.procs:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    wait_for("the compactors' exit once their job is gone", lambda: not compactors(job.run))
    for rank in range(2):
        kept = job.kept(rank)
        segments = job.segments(rank)
        assert {relative(job, p) for p in segments[:-1]} <= set(kept)
        assert relative(job, segments[-1]) not in kept  # no finish record: not known to be closed
    cold, _ = report(job.run, cache=False)  # the report turns the killed rank's ring into one more segment
    warm, warm_read = report(job.run, cache=True)
    assert warm == cold
    assert warm_read < sum(p.stat().st_size for rank in range(2) for p in job.segments(rank))


FORKING = WORK + r"""
import os, sys, time
gt.init(sys.argv[1], flush_interval_s=3600, segment_bytes=4096, compact_interval_s=0.1)
for k in range(60):
    work(k, 0.0002)
child = os.fork()  # a worker forked by the program (a data loader's) outlives the recorder's finish
if child == 0:
    time.sleep(600)
    os._exit(0)
gt.finish()
print(child, flush=True)
sys.stdin.readline()
os.kill(child, 9)
os.waitpid(child, 0)
"""


def test_a_forked_child_does_not_keep_the_compactor_waiting(tmp_path: Path) -> None:
    run = tmp_path / "run"
    job = Ranks(FORKING, run, ranks=1)
    try:
        child = int(job.line(job.procs[0]))
        raise_priority(run)  # its last pass, if it is still making it
        assert os.path.exists(f"/proc/{child}")
        # the child holds a copy of every descriptor the parent had at the fork, but not the
        # compactor's pipe (closed in the child): the parent's finish ends the compactor
        wait_for("the compactor's exit after finish(), the forked child alive", lambda: not compactors(run))
        assert os.path.exists(f"/proc/{child}")
        job.send("")
        assert job.procs[0].wait(timeout=60) == 0
    finally:
        job.close()
    session = next((run / "rank-00000").glob("*.jsonl")).name.split(".")[0]
    folder = run / COMPACT_DIR / CACHE_DIR / RANKS_DIR / "rank-00000" / session
    kept = {e["path"] for p in folder.glob("*.json") for e in json.loads(p.read_text())["files"]}
    assert kept == {p.relative_to(run).as_posix() for p in (run / "rank-00000").glob("*.jsonl")}


def test_compact_interval_is_checked_and_needs_a_local_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="compact_interval_s"):
        Config(compact_interval_s=-1)
    with pytest.warns(GoodtraceWarning, match="GOODTRACE_COMPACT_INTERVAL_S='nan' ignored"):
        assert Config.from_env({"GOODTRACE_COMPACT_INTERVAL_S": "nan"}).compact_interval_s == 0
    assert Config().compact_interval_s == 0  # off by default
    pytest.importorskip("fsspec")
    with pytest.warns(gt.GoodtraceWarning, match="local or NFS run directory"):
        gt.init("memory://goodtrace-compact-test/run", compact_interval_s=1)
    try:
        assert gt.recorder().compactor is None
    finally:
        gt.finish()
