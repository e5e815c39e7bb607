"""The step of a small training loop that the segment-cache tests' ranks run through the
public API, as source text for their child processes (``work(k, compute_s)``): a data span, a
compute span of ``compute_s`` seconds, a loss metric, a tag every 7 steps, then a flush by hand
(their ranks have no flush on a timer, so that the files stay as they are while a test reads
them); :class:`Ranks`, which drives such ranks step by step; and :func:`beats`, which grows
the open segment of a small run's crashed session as a live rank's grows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

WORK = r"""
import time
import goodtrace as gt

def work(k, compute_s):
    with gt.step(k):
        with gt.span("data", "data"):
            time.sleep(0.0002)
        with gt.span("forward", "compute"):
            time.sleep(compute_s)
        gt.metric("loss", 1.0 / (k + 1), step=k)
        if k % 7 == 0:
            gt.tag("eval_window", step=k)
    gt.flush()
"""


class Ranks:
    """Two ranks running ``script`` (``python -c script RUN RANK``), driven over their stdin:
    a number of steps (each answers "done" once they are written), or "finish"."""

    def __init__(self, script: str, run: Path, ranks: int = 2) -> None:
        self.run = run
        self.procs = [subprocess.Popen([sys.executable, "-c", script, str(run), str(rank)], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True) for rank in range(ranks)]

    @staticmethod
    def line(proc: subprocess.Popen[str]) -> str:
        assert proc.stdout is not None
        return proc.stdout.readline().strip()

    def send(self, text: str) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(f"{text}\n")
            proc.stdin.flush()

    def steps(self, count: int) -> None:
        self.send(str(count))
        for proc in self.procs:
            assert self.line(proc) == "done"

    def finish(self) -> None:
        self.send("finish")
        for proc in self.procs:
            assert proc.wait(timeout=120) == 0

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()


# 2 ranks, each a session that crashed (its one segment open: no finish) and one that finished
RESTART = Path(__file__).parent.parent / "data" / "runs" / "restart_2ranks"


def beats(segment: Path, first: int, count: int) -> None:
    """Heartbeats ``first`` to ``first + count`` appended to rank 1's crashed session of
    :data:`RESTART` (0.1 ms apart from its last record on, before its restart): what a live
    rank's open segment gains (16,000 of them are over 1 MiB)."""
    with open(segment, "a", encoding="utf-8") as handle:
        handle.writelines(f'{{"kind":"heartbeat","wall":{1700000007200000000 + k * 100_000},'
                          f'"mono":{7008200000007 + k * 100_000},"dropped":0}}\n' for k in range(first, first + count))
