"""The ground truth of a rank's steps on a loaded machine: how long each step's body really
took, on the host's clock, written by each rank of a real-process test and read by the test.

A busy loop until a deadline (the tests' device of known speed) lasts as long as asked only
while its process holds a core at the deadline; four busy ranks on two cores, and other suites
on a loaded machine, can make one rank's steps last longer for a while, sustained and of its
own. A test of a uniform run that asserts nobody is named slower would then fail on a rank the
machine really slowed. It asserts instead that a rank named is one the truth shows slower,
beyond the other ranks' change, by half the rule's 10-point margin: a rank named for nothing
(a change of about 0) still fails it."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

MARGIN = 0.05  # half the rule's MIN_INCREASE: the truth and the recorder's busy time differ by microseconds a step


def write(run_dir: str | Path, rank: int, bodies: list[float]) -> None:
    """Rank ``rank``'s step bodies (seconds, one per step, from step 0)."""
    (Path(run_dir) / f"truth-{rank}.json").write_text(json.dumps(bodies))


def slower_than_others(run_dir: str | Path, world: int, rank: int, onset: int, end: int | None = None) -> float:
    """How much slower ``rank``'s step bodies really were from ``onset`` to ``end`` (a step,
    included; None: the last) than before it (step 0 left out, as the rule leaves it out), less
    the other ranks' median change over the same steps."""
    truth = [json.loads((Path(run_dir) / f"truth-{r}.json").read_text()) for r in range(world)]
    stop = None if end is None else end + 1

    def change(r: int) -> float:
        return statistics.median(truth[r][onset:stop]) / statistics.median(truth[r][1:onset]) - 1

    return change(rank) - statistics.median(change(r) for r in range(world) if r != rank)
