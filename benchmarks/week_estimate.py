"""Benchmark: what reading a week on 10,000 ranks costs, extrapolated from measured per-session costs.

Writes runs with ``report_steps.py``'s generator (per step three spans, the step, its sync
point, a loss metric; a tag every 100 steps, a checkpoint every 1,000, heartbeats each second:
6.1 records per step) at two sizes an order of magnitude apart (``--steps S``: S and 10 S steps
per rank), then measures, each in a fresh process:

* a task (:func:`goodtrace.read.engine.run_task`, what a pool worker or a Ray task runs, one
  DuckDB thread) folding one session, and one folding every rank's session: its wall time,
  the bytes of its reduction (the zstd Parquet tables a Ray task returns) and its peak RSS;
* the driver reading the run on 2 local workers as ``report --json`` does (each rank's cut
  dropped once its figures are reduced, ``keep_cuts=False``), split into the
  fold, the driver's reduction of the tasks' tables, the rest of the reading, the analysis
  and the JSON (the last four serial on the driver), with its peak RSS (and the peak by the end
  of the reading, before the analysis: what grows there is the reader's); and the same at
  4x the ranks, so that what grows with the ranks and what with the steps can be told apart.

From these (a task's time and peak fitted against the session-steps it folds, a session's
reduction against its steps, the driver's serial part and peak as a fixed part, a part per step
and a part per step and rank), it computes for ``--ranks`` ranks (10,000) at one step per second for ``--days`` (7): tasks,
bytes moved to the driver, memory per worker and on the driver, and the wall time on 1, 16 and
128 workers (the map divided among the workers, the driver's serial part not), and where that
serial part bounds the speed-up. ``--quick``: S = 1,000 on 4 ranks (under a minute; default
S = 10,000 on 8 ranks); ``--json``: the last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _timing import CALL_TIMER, OWN_PEAK
from goodtrace.read.engine import TASK_BYTES, TASK_MAX_BYTES, TASKS_PER_WORKER  # how a read is cut in tasks
from goodtrace.read.fold_batches import FOLD_BATCH_FILES  # files a worker parses at once (whole sessions)
from report_steps import write_rank

_TASK = OWN_PEAK + r"""
import json, sys, time
from goodtrace.read import engine
from goodtrace.read.discovery import collect_sessions, read_header
from goodtrace.read.segments import list_segments
run, count = sys.argv[1], int(sys.argv[2])
paths = [path for _, path in list_segments(run, [])]
drafts = list(collect_sessions([(p, read_header(p)) for p in paths], [], lambda p: None, {}).values())[:count]
files = {sid: list(draft.files) for sid, draft in enumerate(drafts)}
fids = {path: fid for fid, path in enumerate(p for paths in files.values() for p in paths)}
seconds = []
for _ in range(2):  # the faster of two: the machine is shared
    began = time.perf_counter()
    result = engine.run_task(engine.FoldTask(0, files, fids, [(sid, None) for sid in files], None))
    seconds.append(time.perf_counter() - began)
    assert result.error is None, result.error
rss = own_peak_kib() / 1024
print(json.dumps({"fold_s": min(seconds), "reduction_bytes": sum(len(t) for t in result.tables.values()),
                  "rss_mib": rss}))
"""

_DRIVER = OWN_PEAK + r"""
import json, sys, time
from goodtrace.analysis import analyze
from goodtrace.read import engine, load
from goodtrace.read.engine import Engine
from goodtrace.renderers.json_report import render_json
spent = {"fold_s": 0.0, "reduce_s": 0.0}
""" + CALL_TIMER + r"""timed(load, "fold_sessions", "fold_s")
timed(engine, "_reduce", "reduce_s")
start = time.perf_counter()
loaded = load.load_run(sys.argv[1], engine=Engine(workers=2))
loaded_at = time.perf_counter()
rss_loaded = own_peak_kib() / 1024  # the peak of the reading alone
analysis = analyze(loaded, now_wall_ns=1_800_000_000 * 10**9, release_records=True, keep_cuts=False)
analysed_at = time.perf_counter()
render_json(analysis, include_steps=False)
end = time.perf_counter()
spent["fold_s"] -= spent["reduce_s"]
print(json.dumps({**spent, "load_other_s": loaded_at - start - spent["fold_s"] - spent["reduce_s"],
                  "analysis_s": analysed_at - loaded_at, "render_s": end - analysed_at,
                  "rss_loaded_mib": rss_loaded, "rss_mib": own_peak_kib() / 1024}))
"""

SEGMENT_BYTES = 64 * 2**20  # the recorder's default segment size on a local disk or a share


def _run(code: str, *args: str) -> dict[str, float]:
    env = dict(os.environ, GOODTRACE_PROGRESS="0")
    env.pop("GOODTRACE_WORKERS", None)
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"a measurement failed: {done.stderr[-2000:]}")
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def _line(x0: float, y0: float, x1: float, y1: float) -> tuple[float, float]:
    """The line through two measured points: (value at 0, slope)."""
    slope = (y1 - y0) / (x1 - x0)
    return y0 - slope * x0, slope


def measure(root: Path, ranks: int, steps: int) -> dict[str, Any]:
    """Per-session and driver figures at ``steps`` and ``10 * steps`` steps."""
    sizes: dict[str, Any] = {}
    for label, n in (("small", steps), ("large", 10 * steps)):
        run = root / label
        records = sum(write_rank(run, rank, ranks, n) for rank in range(ranks))
        row: dict[str, Any] = {"steps": n, "ranks": ranks, "records": records,
                               "jsonl_bytes": sum(p.stat().st_size for p in run.rglob("*.jsonl"))}
        row["one_session"] = _run(_TASK, str(run), "1")
        row["all_sessions"] = _run(_TASK, str(run), str(ranks))
        row["driver"] = _run(_DRIVER, str(run))
        sizes[label] = row
        if label == "small":  # the same steps on 4x the ranks: what the driver's part does with ranks
            wide = root / "wide"
            for rank in range(4 * ranks):
                write_rank(wide, rank, 4 * ranks, n)
            sizes["wide"] = {"steps": n, "ranks": 4 * ranks, "driver": _run(_DRIVER, str(wide))}
            shutil.rmtree(wide)
        shutil.rmtree(run)
    return sizes


def _serial(driver: dict[str, float]) -> float:
    return driver["reduce_s"] + driver["load_other_s"] + driver["analysis_s"] + driver["render_s"]


def _plane(small: dict[str, Any], wide: dict[str, Any], large: dict[str, Any], value: Any) -> tuple[float, ...]:
    """A driver figure as fixed + per step + per step and rank, from three runs: the small one,
    4x its ranks, 10x its steps (a part measured below zero, i.e. within the noise, is 0)."""
    y0, yw, yl = value(small), value(wide), value(large)
    ranks, s0, s1 = small["ranks"], small["steps"], large["steps"]
    per_pair = max(0.0, (yw - y0) / ((wide["ranks"] - ranks) * s0))
    per_step = max(0.0, (yl - y0) / (s1 - s0) - per_pair * ranks)
    return max(0.0, y0 - per_step * s0 - per_pair * ranks * s0), per_step, per_pair


def extrapolate(sizes: dict[str, Any], ranks: int, days: float, workers: list[int]) -> dict[str, Any]:
    small, large, wide = sizes["small"], sizes["large"], sizes["wide"]
    s0, s1 = small["steps"], large["steps"]
    steps = int(days * 86_400)  # one step per second
    pairs = ranks * steps
    one_s, one_l = small["one_session"], large["one_session"]
    all_s, all_l = small["all_sessions"], large["all_sessions"]
    # a task folding every rank's session (one batch, as a worker parses them): its time and
    # peak against the session-steps it holds (the two sizes give a fixed part and a slope)
    work_s, work_l = small["ranks"] * s0, large["ranks"] * s1
    fold0, fold1 = _line(work_s, all_s["fold_s"], work_l, all_l["fold_s"])
    if fold0 < 0:  # within the noise: the largest measurement's rate, all of it per step
        fold0, fold1 = 0.0, all_l["fold_s"] / work_l
    rss0, rss1 = _line(work_s, all_s["rss_mib"], work_l, all_l["rss_mib"])
    red0, red1 = _line(s0, one_s["reduction_bytes"], s1, one_l["reduction_bytes"])
    json0, json1 = _line(s0, small["jsonl_bytes"] / small["ranks"], s1, large["jsonl_bytes"] / large["ranks"])
    session_json = json0 + json1 * steps
    session_fold = fold1 * steps
    session_reduction = red0 + red1 * steps
    segments = max(1, -(-int(session_json) // SEGMENT_BYTES))  # files of a session
    per_batch = max(1, FOLD_BATCH_FILES // segments)  # sessions a worker parses at once
    serial = _plane(small, wide, large, lambda row: _serial(row["driver"]))
    memory = _plane(small, wide, large, lambda row: row["driver"]["rss_mib"])
    reading = _plane(small, wide, large, lambda row: row["driver"]["rss_loaded_mib"])
    serial_s = serial[0] + serial[1] * steps + serial[2] * pairs
    out: dict[str, Any] = {
        "ranks": ranks, "days": days, "steps": steps,
        "records_per_step": round(large["records"] / (large["ranks"] * s1), 2),
        "per_session": {
            "jsonl_gb": round(session_json / 1e9, 2), "segments": segments, "sessions_per_batch": per_batch,
            "fold_s": round(session_fold, 1), "fold_us_per_step": round(fold1 * 1e6, 2),
            "task_fixed_s": round(fold0, 3), "reduction_mb": round(session_reduction / 1e6, 1),
            "reduction_bytes_per_step": round(red1, 2), "task_rss_fixed_mib": round(rss0),
            "task_rss_kib_per_step": round(rss1 * 1024, 3),
        },
        "driver": {
            "serial_fixed_s": round(serial[0], 2), "serial_us_per_step": round(serial[1] * 1e6, 3),
            "serial_us_per_step_rank": round(serial[2] * 1e6, 4),
            "serial_s": round(serial_s), "serial_h": round(serial_s / 3600, 2),
            "reduction_in_gb": round(session_reduction * ranks / 1e9, 1),
            "rss_kib_per_step": round(memory[1] * 1024, 3), "rss_kib_per_step_rank": round(memory[2] * 1024, 4),
            "rss_gib": round((memory[0] + memory[1] * steps + memory[2] * pairs) / 1024, 1),
            # the same fitted on the peak reached by the end of the reading (before the analysis)
            "reading_rss_kib_per_step_rank": round(reading[2] * 1024, 4),
            "reading_rss_gib": round((reading[0] + reading[1] * steps + reading[2] * pairs) / 1024, 1),
        },
        "workers": {},
    }
    map_1 = fold0 + session_fold * ranks  # one worker: this process, one connection
    for count in workers:
        total_json = session_json * ranks
        tasks = 1 if count == 1 else min(ranks, max(count, min(count * TASKS_PER_WORKER, int(total_json // TASK_BYTES)),
                                                    -(-int(total_json) // TASK_MAX_BYTES)))
        per_task = -(-ranks // tasks)  # sessions
        task_s = fold0 + per_task * session_fold
        map_s = max(-(-tasks // count) * task_s, task_s)  # rounds of tasks; no faster than one task
        # one worker: this process folds a batch at a time into the driver's tables (on disk);
        # a task holds the tables of all its sessions in memory until it writes them
        held_steps = (min(per_batch, per_task) if count == 1 else per_task) * steps
        out["workers"][str(count)] = {
            "tasks": tasks, "sessions_per_task": per_task, "map_h": round(map_s / 3600, 2),
            "wall_h": round((map_s + serial_s) / 3600, 2),
            "speedup": round((map_1 + serial_s) / (map_s + serial_s), 2),
            "worker_rss_gib": round((rss0 + rss1 * held_steps) / 1024, 1),
        }
    out["speedup_bound"] = round((map_1 + serial_s) / serial_s, 1) if serial_s > 0 else None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 and 10,000 steps on 4 ranks (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    parser.add_argument("--steps", type=int, help="the smaller size's steps per rank (the larger is 10x)")
    parser.add_argument("--measure-ranks", type=int, help="ranks of the measured runs")
    parser.add_argument("--ranks", type=int, default=10_000, help="ranks of the job extrapolated to")
    parser.add_argument("--days", type=float, default=7.0)
    args = parser.parse_args()
    steps = args.steps or (1_000 if args.quick else 10_000)
    measure_ranks = args.measure_ranks or (4 if args.quick else 8)
    root = Path(tempfile.mkdtemp(prefix="goodtrace-week-"))
    try:
        load_before = os.getloadavg()[0]
        sizes = measure(root, measure_ranks, steps)
        result = extrapolate(sizes, args.ranks, args.days, [1, 16, 128])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result.update(measured=sizes, cores=len(os.sched_getaffinity(0)), load_before=load_before,
                  load_after=os.getloadavg()[0])
    _print(result)
    if args.json:
        print(json.dumps(result))


def _print(r: dict[str, Any]) -> None:
    m, s, d = r["measured"], r["per_session"], r["driver"]
    print(f"measured: {m['small']['ranks']} ranks x {m['small']['steps']:,} and x {m['large']['steps']:,} steps "
          f"(and {m['wide']['ranks']} ranks x {m['wide']['steps']:,} for the driver); {r['cores']} cores, "
          f"load {r['load_before']:.1f} before, {r['load_after']:.1f} after")
    for label in ("small", "wide", "large"):
        row = m[label]
        drv = row["driver"]
        one = row.get("one_session")
        every = row.get("all_sessions")
        task = (f"a session folds to {one['reduction_bytes']:,} B, a task of all {row['ranks']} in "
                f"{every['fold_s']:.2f} s, worker peak {every['rss_mib']:.0f} MiB; ") if one and every else ""
        print(f"  {row['ranks']:>3} x {row['steps']:>7,}: {task}driver on 2 workers: reduce {drv['reduce_s']:.2f} s, "
              f"rest of the reading {drv['load_other_s']:.2f} s, analysis {drv['analysis_s']:.2f} s, "
              f"JSON {drv['render_s']:.2f} s, peak {drv['rss_mib']:.0f} MiB ({drv['rss_loaded_mib']:.0f} by the end of "
              "the reading)")
    print(f"{r['ranks']:,} ranks x {r['steps']:,} steps ({r['days']:g} days at 1 step/s, {r['records_per_step']} "
          "records a step):")
    print(f"  per session: {s['jsonl_gb']} GB of JSON lines ({s['segments']} segments; {s['sessions_per_batch']} "
          f"sessions parsed at once), folded in {s['fold_s']:,} s ({s['fold_us_per_step']} us a step; a task "
          f"{s['task_fixed_s']} s more), reduced to {s['reduction_mb']:,} MB ({s['reduction_bytes_per_step']} B a "
          f"step); a task's peak {s['task_rss_fixed_mib']} MiB + {s['task_rss_kib_per_step']} KiB a session-step")
    print(f"  driver: receives {d['reduction_in_gb']:,} GB; serial part {d['serial_h']:,} h ({d['serial_fixed_s']} s + "
          f"{d['serial_us_per_step']} us a step + {d['serial_us_per_step_rank']} us a step and rank); peak "
          f"{d['rss_gib']:,} GiB ({d['rss_kib_per_step']} KiB a step + {d['rss_kib_per_step_rank']} KiB a step and rank), "
          f"{d['reading_rss_gib']:,} GiB of it reached by the end of the reading "
          f"({d['reading_rss_kib_per_step_rank']} KiB a step and rank): an upper bound, fitted where DuckDB's "
          "tables still fit its memory limit, which the reading's peak stops at (reader_memory.py)")
    for count, w in r["workers"].items():
        print(f"  {count:>4} worker(s): {w['tasks']:,} tasks of {w['sessions_per_task']:,} sessions, map "
              f"{w['map_h']:,} h, wall {w['wall_h']:,} h ({w['speedup']}x), worker peak {w['worker_rss_gib']:,} GiB")
    print(f"  the driver's serial part bounds the speed-up at {r['speedup_bound']}x, however many workers")


if __name__ == "__main__":
    main()
