"""Benchmark: where ``goodtrace report`` reads the rank files: 1 local worker (this process),
2 local workers, and Ray on this machine, on the same generated run.

Generates RANKS x STEPS steps (report_scale's run: 10 spans a step, heartbeats, checkpoints;
default 64 x 2,000, about 1.6 M records, 180 MiB), then in a fresh process for each case loads
and analyses it as ``report --json`` does and reports the wall time of the per-session map
(start to the end of the reading, discovery included) and of the whole report, the driver's
peak RSS and the largest local worker's. Cases: ``--workers 1`` (DuckDB on every core, as
without a pool), the same on one DuckDB thread (what each worker runs), ``--workers 2``,
``--ray ADDRESS`` on a 2-CPU Ray cluster this benchmark starts once (``ray.init(num_cpus=2)``,
shut down at the end: its start-up is not counted; a bare ``--ray`` adds it, measured apart as
``ray_local_start_s``). The pool's own start-up is measured on a 64-rank run of 10 steps
(``pool_start_s``). Each case runs ``--repeat`` times (the fastest map is kept); the reports
must be byte-identical. ``--quick``: 64 x 300 (about a minute); ``--json``: the last line is
one JSON object with every figure. ``--long STEPS``: instead, a long run of few ranks (2 x STEPS
steps in 64 MiB segments, the last of each rank open: ``report_incremental.py``'s writer), whose
sessions the pool splits between its tasks at file boundaries. The JSON report is made
without its step table (``report --json --no-steps``).
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
from report_scale import generate  # the sibling benchmark's run

_CASE = OWN_PEAK + r"""
import json, sys, time, resource
from goodtrace.analysis import analyze
from goodtrace.read.engine import Engine
from goodtrace.read.load import load_run
from goodtrace.renderers.json_report import render_json
run, workers, ray, out, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3] or None, sys.argv[4], int(sys.argv[5])
if threads:  # this process's DuckDB on that many threads (a worker's: 1)
    from goodtrace.read import duckdb_sql
    connect = duckdb_sql.connect
    def one_thread(*args, **kwargs):
        con = connect(*args, **kwargs)
        con.execute(f"SET threads={threads}")
        return con
    duckdb_sql.connect = one_thread
from goodtrace.read import engine, load
marks = {}
spent = {"fold_s": 0.0, "reduce_s": 0.0}
""" + CALL_TIMER + r"""timed(load, "fold_sessions", "fold_s")  # the map, the driver's reduction included
timed(engine, "_reduce", "reduce_s")  # the driver's reduction (pool and Ray)
def progress(label, done, total):
    if label == "summarising":
        marks.setdefault("map", time.perf_counter())
start = time.perf_counter()
loaded = load_run(run, engine=Engine(workers=None if ray else workers, ray=ray), progress=progress)
loaded_at = time.perf_counter()
analysis = analyze(loaded, now_wall_ns=1_800_000_000 * 10**9, release_records=True, keep_cuts=False)
analysed_at = time.perf_counter()
text = render_json(analysis, include_steps=False)  # as report --json --no-steps
end = time.perf_counter()
open(out, "w").write(text)
spent["fold_s"] -= spent["reduce_s"]
print(json.dumps({**spent, "load_other_s": loaded_at - start - spent["fold_s"] - spent["reduce_s"],
                  "analysis_s": analysed_at - loaded_at, "render_s": end - analysed_at,
                  "map_s": marks["map"] - start, "report_s": end - start,
                  "rss_mib": own_peak_kib() / 1024,
                  "worker_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def _case(run: Path, out: Path, workers: int = 1, ray: str = "", threads: int = 0) -> dict[str, float]:
    # every case folds the whole run: the segment cache (on by default) would hand the later
    # cases the first one's reductions
    env = dict(os.environ, GOODTRACE_PROGRESS="0", GOODTRACE_SEGMENT_CACHE="0")
    env.pop("GOODTRACE_WORKERS", None)
    done = subprocess.run([sys.executable, "-c", _CASE, str(run), str(workers), ray, str(out), str(threads)],
                          capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"case workers={workers} ray={ray!r} failed: {done.stderr[-2000:]}")
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def _best(run: Path, out: Path, repeat: int, **case: Any) -> dict[str, float]:
    runs = [_case(run, out, **case) for _ in range(repeat)]
    return min(runs, key=lambda r: r["map_s"])


def _ray_cluster(cpus: int) -> tuple[str, Any]:
    """A local Ray cluster started by this process (``ray.shutdown()`` stops it, and only it)."""
    import ray

    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    return ray.get_runtime_context().gcs_address, ray


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 ranks x 300 steps (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each case (the fastest is kept)")
    parser.add_argument("--no-ray", action="store_true", help="leave out the Ray cases")
    parser.add_argument("--long", type=int, metavar="STEPS",
                        help="a long run of 2 ranks x STEPS steps in 64 MiB segments instead")
    args = parser.parse_args()
    steps = args.steps or (300 if args.quick else 2_000)
    tmp = Path(tempfile.mkdtemp(prefix="goodtrace-workers-"))
    result: dict[str, Any] = {"ranks": args.ranks, "steps": steps, "cores": len(os.sched_getaffinity(0)),
                              "load_before": os.getloadavg()[0]}
    try:
        run, tiny = tmp / "run", tmp / "tiny"
        if args.long:
            from report_incremental import RankWriter

            writers = [RankWriter(run, rank, 2, 64 * 2**20) for rank in range(2)]
            for writer in writers:
                writer.steps(args.long)
            result.update(ranks=2, steps=args.long, segments=sum(w.segment + 1 for w in writers))
            result["records"] = sum(1 for p in run.rglob("*.jsonl") for _ in p.open("rb"))
        else:
            result["records"] = generate(run, args.ranks, steps, 10, jobs=2)
        generate(tiny, 64, 10, 10, jobs=1)
        result["run_mib"] = sum(p.stat().st_size for p in run.rglob("*.jsonl")) / 2**20
        cases: dict[str, dict[str, float]] = {}
        cases["workers_1"] = _best(run, tmp / "w1.json", args.repeat, workers=1)
        cases["workers_1_one_thread"] = _best(run, tmp / "w1t.json", args.repeat, workers=1, threads=1)
        cases["workers_2"] = _best(run, tmp / "w2.json", args.repeat, workers=2)
        same = [(tmp / name).read_bytes() == (tmp / "w1.json").read_bytes() for name in ("w2.json", "w1t.json")]
        tiny1 = _best(tiny, tmp / "t1.json", 3, workers=1)
        tiny2 = _best(tiny, tmp / "t2.json", 3, workers=2)
        result["pool_start_s"] = round(tiny2["map_s"] - tiny1["map_s"], 3)
        if not args.no_ray:
            address, ray = _ray_cluster(2)
            try:
                cases["ray_local"] = _best(run, tmp / "ray.json", args.repeat, ray=address)
                same.append((tmp / "ray.json").read_bytes() == (tmp / "w1.json").read_bytes())
                ray_tiny = _best(tiny, tmp / "rt.json", 1, ray=address)
            finally:
                ray.shutdown()
            started = _case(tiny, tmp / "rs.json", ray="local")
            result["ray_local_start_s"] = round(started["map_s"] - ray_tiny["map_s"], 3)
        result["cases"] = {k: {f: round(v, 3) for f, v in c.items()} for k, c in cases.items()}
        result["identical"] = all(same)
        base = cases["workers_1"]
        result["speedup_map_2_workers"] = round(base["map_s"] / cases["workers_2"]["map_s"], 2)
        result["speedup_report_2_workers"] = round(base["report_s"] / cases["workers_2"]["report_s"], 2)
        result["speedup_map_2_workers_vs_one_thread"] = round(
            cases["workers_1_one_thread"]["map_s"] / cases["workers_2"]["map_s"], 2)
        if "ray_local" in cases:
            result["speedup_map_ray_local"] = round(base["map_s"] / cases["ray_local"]["map_s"], 2)
        result["load_after"] = os.getloadavg()[0]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"run: {result['ranks']} ranks x {result['steps']} steps, {result['records']:,} records, {result['run_mib']:.0f} MiB; "
          f"{result['cores']} cores, load {result['load_before']:.1f} before, {result['load_after']:.1f} after")
    for name, c in result["cases"].items():
        worker = f"   largest worker {c['worker_rss_mib']:5.0f} MiB" if c["worker_rss_mib"] else ""
        print(f"  {name:20s} map {c['map_s']:7.2f} s   report {c['report_s']:7.2f} s   driver peak "
              f"{c['rss_mib']:6.0f} MiB{worker}")
        print(f"  {'':20s} fold {c['fold_s']:.2f} s, driver: reduce {c['reduce_s']:.2f} s + rest of the reading "
              f"{c['load_other_s']:.2f} s, analysis {c['analysis_s']:.2f} s, JSON {c['render_s']:.2f} s")
    print(f"  2 workers: {result['speedup_map_2_workers']}x on the map ({result['speedup_map_2_workers_vs_one_thread']}x "
          f"against one process on one DuckDB thread), {result['speedup_report_2_workers']}x on the report; "
          f"pool start {result['pool_start_s']} s; identical reports: {result['identical']}")
    if "ray_local_start_s" in result:
        print(f"  Ray (a running 2-CPU cluster): {result['speedup_map_ray_local']}x on the map; starting a local "
              f"Ray adds {result['ray_local_start_s']} s")
    if args.json:
        print(json.dumps(result))
    if not result["identical"]:
        raise SystemExit("the reports differ")


if __name__ == "__main__":
    main()
