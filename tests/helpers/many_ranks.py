"""A run of many ranks with what a long job meets: two attempts (a crash at a step, then a
restart from a checkpoint), a slow rank, data loading, checkpoints, device metrics, clock
samples, killed ranks with torn last lines, lines that are no record, and (optionally) one
line too long for DuckDB's read buffer. For the tests that read one run in different places
(in this process, on a pool of processes, on Ray) and compare the reports."""

from __future__ import annotations

import random
from pathlib import Path

from goodtrace.analysis import analyze
from goodtrace.read.engine import Engine
from goodtrace.read.load import load_run
from goodtrace.read.validate import MAX_LINE_BYTES
from goodtrace.renderers.json_report import render_json
from helpers.builders import Proc

CRASH_AT = 12  # attempt 0 dies during this step
CHECKPOINT = 9  # the last checkpoint before it: attempt 1 resumes after it
NOW = 1_800_000_000 * 10**9  # "now" for the analysis: fixed, so that two reports may be compared


def report_read_by(run: Path | str, engine: Engine, labels: list[str] | None = None) -> str:
    """``goodtrace report --json``'s text, the run read where ``engine`` says; ``labels``
    collects the progress labels (which say where the files were read)."""
    def progress(label: str, done: int, total: int) -> None:
        if labels is not None and label not in labels:
            labels.append(label)

    loaded = load_run(run, engine=engine, progress=progress)
    return render_json(analyze(loaded, now_wall_ns=NOW, release_records=True))


def write_many_ranks(run_dir: Path, ranks: int = 64, steps: int = 24, *, long_line: bool = False,
                     seed: int = 7) -> Path:
    """Write the run; ``long_line`` adds to rank 1's second attempt a line longer than a record
    may be (DuckDB refuses its batch; the reader reads a copy of the file without it)."""
    rng = random.Random(seed)
    for rank in range(ranks):
        slow = 1.3 if rank == 5 else 1.0
        first = Proc(run_dir, rank=rank, world=ranks, start=0.0, overhead=("data",))
        first.span("init", 0.0, 2.0, cat="init")
        t = 2.0
        for k in range(CRASH_AT + 1):
            step_s = (1.0 + rng.random() * 0.05) * slow
            first.span("data", t, t + 0.1, cat="data", step=k)
            first.span("forward", t + 0.1, t + step_s * 0.6, cat="compute", step=k)
            first.span("backward", t + step_s * 0.6, t + step_s, cat="compute", step=k)
            if k == CRASH_AT:
                break  # the crash: this step never ends
            first.step(k, t, t + step_s).sync(k, t + step_s)
            first.metric("gpu_util", k, 0.5 + rng.random() / 2, t + step_s)
            t += step_s
            if k == CHECKPOINT:
                first.span("save", t, t + 0.5, cat="checkpoint_save", step=k)
                t += 0.5
            if k % 5 == 0:
                first.heartbeat(t).clock(1_000 * rank, t)
        if rank == 7:
            first.event("preempted", t + 0.1)
        first.write(torn=rank % 3 == 0)
        if rank % 16 == 2:  # lines that are no record, in the middle of the file
            path = next((run_dir / f"rank-{rank:05d}").glob("*.jsonl"))
            lines = path.read_text().splitlines(keepends=True)
            lines[5:5] = ['{"kind": "span", "t0": "soon"}\n', "not json at all\n"]
            path.write_text("".join(lines))
        second = Proc(run_dir, rank=rank, world=ranks, start=t + 20.0, restart=1)
        t = t + 20.0
        second.span("restore", t, t + 1.5, cat="checkpoint_restore")
        t += 1.5
        for k in range(CHECKPOINT + 1, steps):
            step_s = (1.0 + rng.random() * 0.05) * slow
            second.span("data", t, t + 0.1, cat="data", step=k)
            second.span("forward", t + 0.1, t + step_s, cat="compute", step=k)
            second.step(k, t, t + step_s).sync(k, t + step_s)
            if k % 4 == 0:
                second.event("eval_done", t + step_s, step=k)
            t += step_s
        second.finish(t + 0.2)
        path = second.write()
        if long_line and rank == 1:
            with open(path, "a", encoding="utf-8") as handle:
                handle.write('{"kind":"event","name":"huge","t":1,"attrs":{"blob":"' + "x" * (MAX_LINE_BYTES + 1024)
                             + '"}}\n')
    return run_dir
