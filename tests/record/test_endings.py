"""How a session ends, as the program's own ``finish()`` says it: a crash inside the idiomatic
``try: ... finally: gt.finish()`` is a crash, and the restart from a checkpoint is the next
attempt of the same job. The recorder is the point, so the loops run in real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest

import goodtrace as gt
from goodtrace import schema
from goodtrace.analysis import analyze
from goodtrace.read.load import load_run
from goodtrace.testing import capture

# Steps FIRST..9 of 10 ms each, complete_on a host value; at step CRASH the loop raises.
_LOOP = textwrap.dedent("""
    import sys, time
    import goodtrace as gt
    run_dir, first, crash = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    gt.init(run_dir, rank=0, world_size=1, flush_interval_s=0.2)
    try:
        for k in range(first, 10):
            with gt.step(k) as s:
                time.sleep(0.01)
                if k == crash:
                    raise RuntimeError("the loss went to nan")
                s.complete_on(1.0)
    finally:
        gt.finish(**eval(sys.argv[4]))
""")


def _loop(run_dir: Path, first: int, crash: int, finish_args: str = "{}") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _LOOP, str(run_dir), str(first), str(crash), finish_args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.processes
@pytest.mark.parametrize("finish_args", ["{}", "{'completed': True}"])
def test_a_crash_inside_try_finally_is_a_crash_and_the_restart_its_next_attempt(
    tmp_path: Path, finish_args: str
) -> None:
    run_dir = tmp_path / "run"
    crashed = _loop(run_dir, 0, 6, finish_args)
    assert crashed.returncode == 1 and "RuntimeError: the loss went to nan" in crashed.stderr
    if finish_args != "{}":  # the exception wins over an explicit completed=True, and says so
        assert "finish(completed=True) called while builtins.RuntimeError was propagating" in crashed.stderr
    restarted = _loop(run_dir, 5, -1)  # restored the checkpoint of step 4
    assert restarted.returncode == 0, restarted.stderr
    analysis = analyze(load_run(run_dir))
    assert analysis.jobs == 1
    assert [(a.ended, a.ending.detail) for a in analysis.attempts] == [("crashed", "RuntimeError"), ("completed", "")]
    buckets = analysis.partition.buckets_ns
    assert buckets.get("wasted_progress", 0) > 0  # attempt 0's steps 5 and 6, run again
    assert buckets.get("disruption", 0) > 0
    assert not any("unrelated job" in w for w in analysis.warnings)


def test_finish_infers_its_ending_in_process() -> None:
    with capture() as rec:
        try:
            with gt.step(0) as s:
                s.complete_on(1.0)
            raise KeyError("x")
        except KeyError:
            gt.finish()
    (finish,) = rec.records(schema.FINISH)
    assert (finish["completed"], finish["reason"], finish[schema.F_EXCEPTION]) == (False, "exception", "builtins.KeyError")
    for ending in (SystemExit(0), None):
        with capture() as rec:
            try:
                if ending is not None:
                    raise ending
            except SystemExit:
                pass
            finally:
                gt.finish()
        (finish,) = rec.records(schema.FINISH)
        assert (finish["completed"], finish["reason"]) == (True, "finish")


def _spawned_init(run_dir: str, explicit: bool, out: Any) -> None:
    """In a process ``multiprocessing`` spawned (as ``mp.spawn`` starts ranks): torch imported,
    ``gt.init`` twice without a rank (or with one), and the warnings it gave sent back."""
    import warnings

    import torch  # noqa: F401  (the program uses torch; goodtrace looks in sys.modules only)

    import goodtrace as gt

    for name in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "JAX_PROCESS_ID"):
        os.environ.pop(name, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in range(2):
            gt.init(os.path.join(run_dir, str(k)), **({"rank": 0, "world_size": 1} if explicit else {}))
            gt.finish()
    out.put([str(w.message) for w in caught if "by default" in str(w.message)])


@pytest.mark.processes
def test_init_warns_once_when_a_spawned_process_takes_the_default_rank(tmp_path: Path) -> None:
    """mp.spawn with gt.init before the process group: every process would claim rank 0. A
    spawned process warns once; one that names its rank does not, nor does a single process
    (this one, with torch imported: a one-host script is rank 0 rightly)."""
    import multiprocessing

    import torch  # noqa: F401

    context = multiprocessing.get_context("spawn")
    for explicit, expected in ((False, 1), (True, 0)):
        out = context.Queue()
        child = context.Process(target=_spawned_init, args=(str(tmp_path / str(explicit)), explicit, out))
        child.start()
        messages = out.get(timeout=120)
        child.join(timeout=60)
        assert child.exitcode == 0 and len(messages) == expected, messages
        assert all("rank 0 of 1 by default" in m for m in messages)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gt.init(tmp_path / "single")  # not started by multiprocessing: no warning
        gt.finish()
