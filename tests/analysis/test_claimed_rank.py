"""Several processes claiming one rank at once (``mp.spawn`` with ``gt.init`` before the process
group: every process falls back to rank 0) are one attempt, with a warning naming where the rank
came from (docs/semantics.md section 4.1); a rank's process started after its previous one went
quiet is still a restart."""

from __future__ import annotations

from pathlib import Path

from goodtrace.analysis import analyze
from goodtrace.read.sessions import number_attempts
from helpers.builders import Proc, buckets_s, load


def _process(run: Path, pid: int, start: float, *, rank_source: str = "default", steps: int = 10) -> None:
    p = Proc(run, rank=0, world=1, start=start)
    p.session = p.session.replace("-1000-", f"-{pid}-")
    p.header.update(session=p.session, pid=pid, rank_source=rank_source)
    t = p.loop(range(steps), start + 1.0)
    p.finish(t + 0.5)
    p.write()


def test_processes_claiming_one_rank_at_once_are_one_attempt_with_a_warning(tmp_path: Path) -> None:
    _process(tmp_path, 2000, 0.0)
    _process(tmp_path, 2001, 0.3)
    result = analyze(load(tmp_path), now_wall_ns=None)
    # one job, one attempt of one rank: not "an unrelated job" hiding the first process
    assert result.jobs == 1 and len(result.attempts) == 1
    (attempt,) = result.attempts
    assert (attempt.ranks, attempt.ended, attempt.first_step, attempt.last_step) == (1, "completed", 0, 9)
    # the first process's time whole: 1 s of start-up, its 10 steps, its teardown
    assert buckets_s(result.partition) == {"startup": 1.0, "productive": 10.0, "teardown": 0.5}
    assert [f.goodput for f in result.spread.per_rank] == [10.0 / 11.5]
    (warning,) = [w for w in result.warnings if "claim rank 0" in w]
    assert "2 processes claim rank 0 at the same time (pids 2000 on node0, 2001 on node0)" in warning
    assert "fell back to rank 0" in warning and "call gt.init after the process group is initialised" in warning
    assert not any("reused run directory" in w for w in result.warnings)


def test_a_rank_given_twice_by_the_argument_says_so(tmp_path: Path) -> None:
    _process(tmp_path, 2000, 0.0, rank_source="argument")
    _process(tmp_path, 2001, 0.3, rank_source="argument")
    (warning,) = [w for w in analyze(load(tmp_path), now_wall_ns=None).warnings if "claim rank 0" in w]
    assert "their rank came from gt.init's rank= argument" in warning


def test_a_rank_that_appears_again_after_its_process_went_quiet_is_a_new_attempt() -> None:
    s = 10**9
    # (rank, restart counter, start, last seen, recording began)
    overlapping = [(0, None, 0, 10 * s, 0), (1, None, 0, 10 * s, 0), (0, None, 1 * s, 9 * s, 1 * s)]
    assert number_attempts(overlapping) == [0, 0, 0]
    # rank 0 restarted while rank 1 ran on: its new process started after its old one went quiet
    restarted = [(0, None, 0, 5 * s, 0), (1, None, 0, 20 * s, 0), (0, None, 6 * s, 20 * s, 6 * s)]
    assert number_attempts(restarted) == [0, 0, 1]
    # one process recording twice, one recording after the other (gt.init, finish, gt.init): both
    # start at the process's start, but the second claims the rank after the first went quiet
    twice = [(0, None, 0, 5 * s, 1 * s), (0, None, 0, 9 * s, 6 * s)]
    assert number_attempts(twice) == [0, 1]
    assert number_attempts(restarted) == [0, 0, 1]
