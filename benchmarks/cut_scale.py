"""Benchmark: do one session's cut and its outermost compute stay linear in its executions?

Builds one session's records in memory, as the reader hands them to the analysis (no file,
no parse: the cut alone), in the shapes ``report_steps.py`` writes: per step a data span at
its start, the step, its sync point and its outermost compute; a checkpoint span every 1,000
steps. Two loops: ``asynchronous`` (the sync point at the next step's entry, so that each data
span starts at the previous step's sync point: the host-overhead rule places every span
against the executions, and charges it whole) and ``synchronous`` (the sync point at the step's
host exit: every interval has a data piece, and the data intervals are cut at every overhead
boundary). Each
at S and 10 S steps (default 1,000,000 and 10,000,000; ``--quick``: 200,000 and 2,000,000: both beyond the caches), timed
(the best of ``--repeat``) with :func:`goodtrace.analysis.cut.cut_session`, in a process with the
report command's allocator setting (``cli.analysed.return_freed_memory``), against a baseline
in the same run: one linear pass over the session's input columns (a copy and a running sum
of each). A third case times what the reader computes before the cut, each execution's
outermost compute (:func:`goodtrace.read.outermost.outermost_compute`), on a session where one
compute span in 1,000 starts after the next step entered (its part goes to its own step's
execution, found among the executions of the steps named). It prints, per loop and size, the cut's time per execution, its ratio to the
baseline, and the time per execution at 10 S over that at S (1.0 = linear). ``--json``: the
last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import time
from array import array
from typing import Any

import numpy as np

from goodtrace import schema
from goodtrace.analysis.cut import cut_session
from goodtrace.cli.analysed import return_freed_memory
from goodtrace.read.loaded import Labels, SessionInfo, SessionRecords
from goodtrace.read.outermost import outermost_compute

SECOND = 10**9
STEP_NS = SECOND // 2


def _column(values: Any) -> array[int]:
    return array("q", np.ascontiguousarray(values, dtype=np.int64).tobytes())


def session(steps: int, synchronous: bool) -> tuple[SessionInfo, SessionRecords]:
    """One rank's session of ``steps`` steps (see the module docstring)."""
    k = np.arange(steps, dtype=np.int64)
    length = STEP_NS + (k * 7_919) % 5_000_000
    saves = k % 1_000 == 999
    pause = np.where(saves, 2 * SECOND, 0)
    t0 = 3 * SECOND + np.concatenate(([0], np.cumsum(length + pause)[:-1]))
    t1 = t0 + length * 19 // 20
    sync_t = t1 if synchronous else t0 + length
    save_t0 = (t0 + length)[saves]
    category = np.concatenate((np.zeros(steps, dtype=np.intc), np.ones(len(save_t0), dtype=np.intc)))
    span_t0 = np.concatenate((t0, save_t0))
    span_t1 = np.concatenate((t0 + length // 20, save_t0 + 2 * SECOND))
    span_step = np.concatenate((k, k[saves]))
    order = np.argsort(span_t0, kind="stable")
    end = int(t0[-1] + length[-1] + 3 * SECOND)
    info = SessionInfo(index=0, session="bench", rank=0, world=1, host="h", pid=1, restart=None, proc_start=0,
                       init=SECOND, submit_wall=None, wall_anchor=0, mono_anchor=0, last_seen=end,
                       finish_completed=True, finish_t=end, has_finish=True, step_count=steps, sync_count=steps)
    records = SessionRecords(
        step_seq=_column(k), step_number=_column(k), step_t0=_column(t0), step_t1=_column(t1),
        sync_seq=_column(k), sync_step=_column(k), sync_t=_column(sync_t),
        sync_how=Labels(array("i", bytes(4 * steps)), (schema.SYNC_LAG,)),
        span_category=Labels(array("i", category[order].tobytes()), (schema.DATA, schema.CHECKPOINT_SAVE)),
        span_t0=_column(span_t0[order]), span_t1=_column(span_t1[order]), span_step=_column(span_step[order]),
        compute_seq=_column(k), compute_ns=_column(length * 16 // 20),
    )
    return info, records


def _baseline(records: SessionRecords) -> None:
    for column in (records.step_seq, records.step_number, records.step_t0, records.step_t1, records.sync_seq,
                   records.sync_step, records.sync_t, records.span_t0, records.span_t1, records.span_step,
                   records.compute_seq, records.compute_ns):
        np.cumsum(np.array(np.frombuffer(column, dtype=np.int64)))


def best(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(steps: int, synchronous: bool, repeat: int) -> dict[str, Any]:
    info, records = session(steps, synchronous)
    cut = cut_session(info, records, tail_label="teardown", close_trailing=True)
    expected = "synchronous" if synchronous else "asynchronous"
    if cut.intervals != steps:
        raise SystemExit(f"the generated session was cut into {cut.intervals} intervals, not {steps}")
    del cut
    cut_s = best(lambda: cut_session(info, records, tail_label="teardown", close_trailing=True), repeat)
    base_s = best(lambda: _baseline(records), repeat)
    return {"loop": expected, "steps": steps, "cut_s": round(cut_s, 4), "baseline_s": round(base_s, 4),
            "cut_ns_per_step": round(cut_s / steps * 1e9, 1), "cut_over_baseline": round(cut_s / base_s, 2)}


def measure_outermost(steps: int, repeat: int) -> dict[str, Any]:
    k = np.arange(steps, dtype=np.int64)
    entered = k * 1_000
    t0 = entered + 100
    t0[999::1_000] += 1_400  # starts after the next step entered (and its span ended)
    t1 = t0 + 300
    step = np.ma.MaskedArray(k, mask=np.zeros(steps, dtype=bool))
    seqs, ns = outermost_compute(t0, t1, step, k, k, entered)
    if len(seqs) != steps or int(ns.sum()) != 300 * steps:
        raise SystemExit("the outermost compute of the generated session is not every span's")
    took = best(lambda: outermost_compute(t0, t1, step, k, k, entered), repeat)
    columns = [t0, t1, k, entered]
    base_s = best(lambda: [np.cumsum(np.array(c)) for c in columns], repeat)
    return {"loop": "outermost compute", "steps": steps, "cut_s": round(took, 4), "baseline_s": round(base_s, 4),
            "cut_ns_per_step": round(took / steps * 1e9, 1), "cut_over_baseline": round(took / base_s, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200,000 and 2,000,000 steps (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    parser.add_argument("--steps", type=int, help="S: the sizes are S and 10 S steps (default 1,000,000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per case, the best counts (3)")
    args = parser.parse_args()
    return_freed_memory()  # the report command's allocator setting: the cut's large temporaries are fresh pages
    small = args.steps or (200_000 if args.quick else 1_000_000)
    rows: list[dict[str, Any]] = []
    for case in ("asynchronous", "synchronous", "outermost compute"):
        pair = [measure_outermost(n, args.repeat) if case == "outermost compute"
                else measure(n, case == "synchronous", args.repeat) for n in (small, 10 * small)]
        growth = round(pair[1]["cut_ns_per_step"] / pair[0]["cut_ns_per_step"], 2)
        for row in pair:
            row["per_step_vs_smallest"] = round(row["cut_ns_per_step"] / pair[0]["cut_ns_per_step"], 2)
            print(f"{row['loop']:>17} {row['steps']:>10,} steps: {row['cut_s']:.3f} s "
                  f"({row['cut_ns_per_step']} ns a step, {row['cut_over_baseline']}x the baseline "
                  f"{row['baseline_s']:.3f} s)", flush=True)
        print(f"{pair[0]['loop']:>17}: time per step at 10x the steps {growth}x (1.0 = linear)", flush=True)
        rows.extend(pair)
    if args.json:
        print(json.dumps({"benchmark": "cut_scale", "quick": args.quick, "rows": rows}))


if __name__ == "__main__":
    main()
