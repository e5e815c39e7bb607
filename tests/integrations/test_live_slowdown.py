"""A rank's slowdown on the live line (record/live/slowdown.py), on real gloo ranks: the rank
whose compute doubles from step 15 is named by rank 0's printed line a few log steps after the
onset, with the onset and the size, as the report names it; a uniform run's lines name nobody.
Compute is a busy loop until a deadline (a device of known speed), as in
test_no_false_alarms.py. The rule's threshold (a 30% slowdown named, noise and 5% shifts not)
is tested on synthetic series (tests/analysis/test_slowdown.py, and the live parts driven by
hand in tests/record/test_live_slowdown_parts.py); here the slowdown is one that no scheduler's
noise can hide: 30% was lost in it with two suites on two cores.

Each rank records how long its step bodies really took (helpers/step_truth.py): on the uniform
run a rank may be named only where that truth shows it slower beyond the others."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from helpers import step_truth
from helpers.ranks import leave_group, run_ranks

pytestmark = pytest.mark.processes

torch = pytest.importorskip("torch")

STEPS, LOG_EVERY, ONSET = 60, 5, 15
FORWARD_S, BACKWARD_S = 0.020, 0.010
LINE = re.compile(r"rank (\d+) computes (\d+)% slower since step (\d+) \(host ([^)]+)\)")


def _spin(seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


def _worker(rank: int, world: int, port: int, run_dir: str, slow_rank: int, slower: float) -> None:
    import torch.distributed as dist

    import goodtrace as gt
    from goodtrace.integrations.torch import instrument

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    gt.init(run_dir, rank=rank, world_size=world)
    lines = Path(run_dir) / "live-lines.txt"

    def printer(text: str) -> None:
        with lines.open("a") as out:
            out.write(text + "\n")

    instrument(log_every=LOG_EVERY, memory=False, clock_sync_every=0, printer=printer)
    dist.barrier()
    bodies: list[float] = []  # how long each step's body really took (the ground truth)
    for step in range(STEPS):
        scale = slower if rank == slow_rank and step >= ONSET else 1.0
        with gt.step(step) as s:
            t0 = time.perf_counter()
            with gt.span("forward"):
                _spin(FORWARD_S * scale)
            with gt.span("backward"):
                _spin(BACKWARD_S * scale)
            loss = torch.ones(1) * step
            bodies.append(time.perf_counter() - t0)
            s.complete_on(loss)
        dist.all_reduce(loss)  # the fast ranks wait here, after their step
        if step % 10 == 9:
            with gt.span("checkpoint"):
                _spin(5 * (FORWARD_S + BACKWARD_S))
    gt.finish()
    step_truth.write(run_dir, rank, bodies)
    leave_group()


def _lines(tmp_path: Path, world: int, slow_rank: int, slower: float) -> tuple[list[str], Path]:
    run_dir = tmp_path / "run"
    run_ranks(_worker, world, str(run_dir), slow_rank, slower, timeout=240)
    return (run_dir / "live-lines.txt").read_text().splitlines(), run_dir


def _named(lines: list[str]) -> list[tuple[int, re.Match[str]]]:
    """(step, match) for each step line that names a rank."""
    return [(int(line.split(" ", 2)[1]), m) for line in lines
            if line.startswith("step ") and (m := LINE.search(line)) is not None]


def test_the_live_line_names_a_rank_whose_compute_doubles_from_step_15(tmp_path: Path) -> None:
    """Two ranks, as the report's own test (test_no_false_alarms.py): four busy ranks on this
    machine's two cores wait for a core often enough that neither the report nor the line can
    tell a slowdown from their noise in 45 steps."""
    from goodtrace.analysis import analyze
    from goodtrace.read.load import load_run

    world = 2
    slow = world - 1
    lines, run_dir = _lines(tmp_path, world, slow, 2.0)
    steps = [int(line.split(" ", 2)[1]) for line in lines if line.startswith("step ")]
    named = [(step, LINE.search(line)) for step, line in zip(steps, [x for x in lines if x.startswith("step ")],
                                                              strict=True)]
    first = next(((step, m) for step, m in named if m is not None), None)
    assert first is not None, lines
    step, match = first
    rank, percent, onset, host = int(match[1]), int(match[2]), int(match[3]), match[4]
    # the size is the busy time's (100% on a quiet machine; less where the load slowed the
    # steps before the onset too): at least the rule's 10%, and no more than the doubling
    assert rank == slow and abs(onset - ONSET) <= 3 and 10 <= percent <= 150, lines
    # a few log steps after the onset: 10 steps at the new level, then one log interval for the others' change
    assert step <= ONSET + 10 + 3 * LOG_EVERY, lines
    assert host != "?"  # the rank's host name travelled with its vectors
    assert all(len(LINE.findall(line)) == (m is not None) for (_, m), line in zip(
        named, [x for x in lines if x.startswith("step ")], strict=True) if m is not None)
    assert {int(m[1]) for _, m in named if m is not None} == {slow}  # nobody else, ever
    (report,) = analyze(load_run(run_dir)).slowdowns  # the report says the same
    assert (report.rank, report.measure) == (slow, "compute") and abs(report.onset_step - onset) <= 3
    assert f"computes {report.increase:.0%} slower since step {report.onset_step}" in report.reason


def test_a_uniform_run_s_live_lines_name_nobody(tmp_path: Path) -> None:
    """Nobody, unless its step bodies really were slower (CI once saw rank 0 named "12% slower
    since step 13" on a loaded machine): then the truth must show it, by at least 5 points
    (half the rule's 10) beyond the others, which a rank named for nothing does not."""
    world = 4
    lines, run_dir = _lines(tmp_path, world, -1, 1.0)
    assert [line for line in lines if line.startswith("step ")], lines
    for step, m in _named(lines):
        truly = step_truth.slower_than_others(run_dir, world, int(m[1]), int(m[3]), step)
        assert truly >= step_truth.MARGIN, (step, m[0], lines)
