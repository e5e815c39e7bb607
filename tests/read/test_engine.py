"""The reader's per-session fold on a pool of local worker processes gives the report one
process gives, to the byte: on a 64-rank run with a crash and a restart, killed ranks' torn
lines, lines that are no record and a line too long for DuckDB (read from a copy without it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from goodtrace.read import engine
from goodtrace.read.engine import Engine, plan_tasks
from goodtrace.read.fold_batches import session_batches
from helpers.cli import goodtrace
from helpers.many_ranks import report_read_by as report
from helpers.many_ranks import write_many_ranks


@pytest.fixture(scope="module")
def many_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_many_ranks(tmp_path_factory.mktemp("many") / "run", ranks=64, long_line=True)


@pytest.mark.processes
def test_two_workers_give_the_one_process_report(many_ranks: Path) -> None:
    in_process: list[str] = []
    pooled: list[str] = []
    one = report(many_ranks, Engine(workers=1), in_process)
    two = report(many_ranks, Engine(workers=2), pooled)
    assert "reading rank files (2 workers)" in pooled  # the pool ran
    assert not any("workers" in label for label in in_process)
    assert two == one
    parsed = json.loads(one)
    warnings = "\n".join(parsed["warnings"])
    # what the workers skipped reaches the report: torn last lines, lines that are no record,
    # the long line (read from a copy made again by this process)
    assert "22 segment file(s) end in a torn line" in warnings
    assert "line(s) 64 longer than 32 MiB" in warnings
    assert "in all, 9 lines skipped" in warnings
    assert len(parsed["attempts"]) == 2


@pytest.mark.processes
def test_three_workers_on_uneven_tasks_give_the_same(many_ranks: Path) -> None:
    assert report(many_ranks, Engine(workers=3)) == report(many_ranks, Engine(workers=1))


def test_tasks_are_runs_of_whole_batches() -> None:
    files = {sid: [f"f{sid}-{i}" for i in range(1 + sid % 3)] for sid in range(100)}
    batches = session_batches(files, {p: 64 << 20 for paths in files.values() for p in paths})
    assert all(sum(len(files[s]) for s in b) <= 32 for b in batches)
    sizes = {sid: 1000 * (1 + sid % 7) for sid in files}
    weights = [sum(sizes[s] for s in batch) for batch in batches]
    groups = plan_tasks(weights, 4)
    assert len(groups) == 4
    assert [index for group in groups for index in group] == list(range(len(batches)))  # consecutive, each once
    task_bytes = [sum(weights[i] for i in group) for group in groups]
    assert max(task_bytes) <= sum(weights) / 4 + max(weights)  # an even share, give or take a batch


def test_small_files_share_a_batch_up_to_its_bytes() -> None:
    """What a live run's re-report reads (a few KB of each rank's open segment) is parsed in
    batches of many files, not of 32: a batch's fixed cost is a dozen statements."""
    files = {sid: [f"r{sid}"] for sid in range(3000)}
    assert [len(b) for b in session_batches(files, dict.fromkeys(files_of(files), 4096))] == [1024, 1024, 952]
    assert {len(b) for b in session_batches(files, dict.fromkeys(files_of(files), 1 << 20))} == {64, 56}
    batches = session_batches(files, dict.fromkeys(files_of(files), 64 << 20))
    assert {len(b) for b in batches} == {32, 24}  # large files: 32 a batch, as before
    assert [sid for batch in batches for sid in batch] == sorted(files)


def files_of(files: dict[int, list[str]]) -> list[str]:
    return [p for paths in files.values() for p in paths]


def test_a_few_long_sessions_are_split_between_tasks_at_file_boundaries() -> None:
    """Two ranks of 11 segments each and 4 workers: tasks of files, each file in one task, in
    order; a session's files may go to two tasks (a file's fold depends on no other file)."""
    files = {sid: [f"r{sid}-{i:02d}" for i in range(11)] for sid in (0, 1)}
    fid_of = {p: n for n, p in enumerate(p for sid in (0, 1) for p in files[sid])}
    sizes = dict.fromkeys(fid_of, 64 * 2**20)
    tasks = engine._tasks(files, fid_of, {0: 11, 1: None}, sizes, 4, None)
    assert len(tasks) == 4 * engine.TASKS_PER_WORKER  # the bytes ask for more (1.4 GB of 32 MiB tasks)
    listed = [(sid, p) for task in tasks for sid, paths in task.files.items() for p in paths]
    assert listed == [(sid, p) for sid in (0, 1) for p in files[sid]]
    for sid in (0, 1):  # each session's files are spread over several tasks
        assert sum(sid in task.files for task in tasks) > 4
    for task in tasks:
        assert task.fids == {p: fid_of[p] for paths in task.files.values() for p in paths}
        assert task.main_tids == [(sid, {0: 11, 1: None}[sid]) for sid in task.files]


@pytest.mark.processes
def test_a_small_run_is_read_in_process_unless_workers_are_asked(many_ranks: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    labels: list[str] = []
    report(many_ranks, Engine(), labels)  # 18 MiB: under the pool's threshold
    assert not any("workers" in label for label in labels)
    monkeypatch.setenv("GOODTRACE_WORKERS", "2")
    labels.clear()
    report(many_ranks, Engine(), labels)
    assert "reading rank files (2 workers)" in labels


@pytest.mark.processes
def test_bad_worker_counts_are_clear_errors(tmp_path: Path) -> None:
    run = write_many_ranks(tmp_path / "run", ranks=2, steps=12)
    done = goodtrace("report", str(run), env={"GOODTRACE_WORKERS": "two"})
    assert done.returncode != 0 and "GOODTRACE_WORKERS must be a whole number" in done.stderr
    assert "Traceback" not in done.stderr
    done = goodtrace("report", str(run), "--workers", "0", env={"GOODTRACE_WORKERS": None})
    assert done.returncode != 0 and "at least 1" in done.stderr and "Traceback" not in done.stderr
    done = goodtrace("report", str(run), "--workers", "2", "--ray", env={"GOODTRACE_WORKERS": None})
    assert done.returncode != 0 and "give one" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.processes
def test_no_task_reads_more_than_the_cap(many_ranks: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past 4 tasks a worker when a task would read more than TASK_MAX_BYTES (it holds its
    sessions' tables until it returns them); the report is the same."""
    one = report(many_ranks, Engine(workers=1))
    cap = 1 << 20
    monkeypatch.setattr(engine, "TASK_MAX_BYTES", cap)
    counts: list[int] = []
    plan = engine._tasks

    def counted(*args: Any, **kwargs: Any) -> list[engine.FoldTask]:
        tasks = plan(*args, **kwargs)
        counts.append(len(tasks))
        return tasks

    monkeypatch.setattr(engine, "_tasks", counted)
    assert report(many_ranks, Engine(workers=2)) == one
    total = sum(p.stat().st_size for p in many_ranks.rglob("*.jsonl"))
    assert counts and counts[0] >= total // cap > 2 * engine.TASKS_PER_WORKER
