"""Run a loop of ``helpers/host_bound.py`` in real processes and check the report's charge of
each overhead category against the device's idle time (``tests/analysis/test_host_overhead.py``
says the bounds)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from goodtrace.analysis import RunAnalysis, analyze
from goodtrace.read.load import load_run

CHILD = Path(__file__).resolve().parent.parent / "helpers" / "host_bound.py"
MS = 1_000_000


def run_loop(shape: str, run_dir: Path, out: Path, rank: int = 0, world: int = 1) -> subprocess.Popen[str]:
    config = {"shape": shape, "run_dir": str(run_dir), "out": str(out), "rank": rank, "world": world}
    return subprocess.Popen([sys.executable, str(CHILD), json.dumps(config)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finished(child: subprocess.Popen[str], out: Path) -> dict[str, Any]:
    _, stderr = child.communicate(timeout=180)
    assert child.returncode == 0, stderr
    truth: dict[str, Any] = json.loads(out.read_text())
    return truth


def idle_overlap(t0: int, t1: int, busy: Sequence[Sequence[int]]) -> int:
    """How much of [t0, t1) the device sat idle: its length less its overlap with the busy intervals."""
    covered = 0
    for b0, b1 in busy:
        covered += max(0, min(t1, b1) - max(t0, b0))
    return (t1 - t0) - covered


def true_cost(truth: dict[str, Any]) -> dict[str, int]:
    """Each category's true cost: its spans' overlap with the device's idle time."""
    busy = sorted(truth["busy"])
    out: dict[str, int] = {}
    for category, t0, t1, _ in truth["spans"]:
        out[category] = out.get(category, 0) + idle_overlap(t0, t1, busy)
    return out


def charged(analysis: RunAnalysis, rank: int) -> tuple[dict[str, int], int]:
    """What the analysis charged in the step intervals of ``rank``'s session, by category, and
    how much of it it said depends on what the sync points cannot see."""
    (index,) = [i for i in analysis.cuts if analysis.sessions[i].rank == rank]
    cut = analysis.cuts[index]
    return {category: sum(column) for category, column in cut.interval_overhead.items()}, cut.uncertain_ns


def misses(truth: dict[str, Any], measured: dict[str, int], uncertain: int, categories: Sequence[str]) -> list[str]:
    bound = truth["poll_ns"] + truth["slack_ns"] + MS
    expected = true_cost(truth)
    out = []
    for category in categories:
        n = sum(1 for s in truth["spans"] if s[0] == category)
        want, got = expected.get(category, 0), measured.get(category, 0)
        if not want - n * bound <= got <= want + uncertain + MS:
            out.append(f"{category}: charged {got / MS:.1f} ms, the device was idle {want / MS:.1f} ms of its "
                       f"{n} spans (bound {bound / MS:.1f} ms a span, {uncertain / MS:.1f} ms uncertain)")
    return out


def run_and_check(shape: str, tmp_path: Path, categories: Sequence[str], world: int = 1,
                  shaped: Callable[[RunAnalysis, list[dict[str, Any]]], str | None] | None = None,
                  ) -> tuple[RunAnalysis, list[dict[str, Any]]]:
    """Run ``shape`` until its charges are within the bounds and (``shaped``: None, or why not)
    the loop had the shape it was written for on this machine at that moment (a loaded machine
    can make a device-bound loop wait for its host); three runs at most."""
    problems: list[str] = []
    for attempt in range(3):
        run_dir = tmp_path / f"{shape}-{attempt}"
        outs = [tmp_path / f"{shape}-{attempt}-{rank}.json" for rank in range(world)]
        children = [run_loop(shape, run_dir, outs[rank], rank, world) for rank in range(world)]
        truths = [finished(child, out) for child, out in zip(children, outs, strict=True)]
        analysis = analyze(load_run(run_dir))
        problems = []
        for rank, truth in enumerate(truths):
            problems += [f"rank {rank}: {m}" for m in misses(truth, *charged(analysis, rank), categories)]
        why_not = shaped(analysis, truths) if shaped is not None and not problems else None
        if why_not:
            problems.append(f"the loop did not have its shape: {why_not}")
        if not problems:
            return analysis, truths
    raise AssertionError("; ".join(problems))
