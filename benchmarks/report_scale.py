"""Benchmark: ``goodtrace report`` and ``goodtrace compact`` on a large synthetic run.

Generates RANKS x STEPS steps with SPANS spans each (default 1,024 x 1,000 x 10: about 12
million records) through the real writer's encoder and file layout (rank-NNNNN/<session>.00000.jsonl,
a header line, heartbeats), then times, each in a fresh process with its peak RSS:

  1. ``goodtrace report RUN --json``  on the JSON-lines form;
  2. ``goodtrace compact RUN``;
  3. ``goodtrace report RUN --json``  on the compacted (Parquet) form.

It also feeds the equivalent rank-0 event sequence to ml-goodput-measurement's
``GoodputCalculator`` (through an injected in-memory logger) for the cases where both
definitions agree, and prints both goodputs and the time ratio. ``--quick`` runs a small
run (under a minute); ``--json`` makes the last line one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _timing import run_measured
from goodtrace import schema
from goodtrace.record.io.encoding import _Encoder
from goodtrace.record.spans import Span

WALL0 = 1_700_000_000 * 10**9
SECOND = 1_000_000_000

# (name, category, fraction of the step) of the spans inside a step; nested where the
# fractions say so (forward_backward holds forward, backward).
STEP_SPANS = (
    ("data", "data", 0.00, 0.04),
    ("h2d", "compute", 0.04, 0.06),
    ("forward_backward", "compute", 0.06, 0.80),
    ("forward", "compute", 0.06, 0.36),
    ("attention", "compute", 0.10, 0.20),
    ("backward", "compute", 0.36, 0.80),
    ("allreduce", "compute", 0.80, 0.90),
    ("optimizer", "compute", 0.90, 0.97),
    ("zero_grad", "compute", 0.97, 0.98),
    ("log", "log", 0.98, 0.99),
)


def _key(name: str, category: str) -> tuple[str, str, bool, type[Span]]:
    return (name, category, category in schema.BLOCKING_CATEGORIES, Span)


def header(rank: int, world: int, session: str, mono: int, proc_start: int) -> dict[str, Any]:
    """The header the recorder writes (same fields, see goodtrace.record.recorder.Recorder):
    ``init()`` ran half a second after the process started, the header (``mono``) is written
    at the first flush after it."""
    mono = max(mono, proc_start + SECOND // 2)
    return {
        "kind": "header", "schema": schema.SCHEMA_VERSION, "version": "bench", "session": session,
        "rank": rank, "world": world, "local_rank": rank % 8, "host": f"node{rank // 8:04d}",
        "pid": 10_000 + rank, "restart": None, "proc_start_mono": proc_start, "proc_start_source": "os",
        "init_mono": proc_start + SECOND // 2, "submit_wall": None, "main_tid": 1, "rank_source": "bench",
        "overhead_categories": [], "config": {"lag": 1}, "segment": 0, "wall": WALL0 + mono - proc_start,
        "mono": mono,
    }


def write_rank(root: Path, rank: int, world: int, steps: int, spans: int, seed: int) -> int:
    """One rank's file: init 3 s, steps of ~0.5 s (rank 3 is 8% slower), a checkpoint every
    100 steps, an eval every 250, a gc pause now and then, heartbeats each second, finish."""
    rng = random.Random(seed * 100_003 + rank)
    enc = _Encoder()
    mono0 = 5_000 * SECOND + rank * 7_919
    session = f"{WALL0:020d}-{10_000 + rank}-{rank:08x}"
    keys = [_key(n, c) for n, c, _, _ in STEP_SPANS[:spans]]
    fractions = [(a, b) for _, _, a, b in STEP_SPANS[:spans]]
    ckpt, evalk, gck = _key("checkpoint", "checkpoint_save"), _key("eval", "eval"), _key("gc", "gc")
    init = _key("init", "init")
    lines: list[str] = [json.dumps(header(rank, world, session, mono0, mono0), separators=(",", ":")) + "\n"]
    enc_append = lines.append
    encode = enc.encode
    t = mono0 + 3 * SECOND
    enc_append(encode((init, mono0 + SECOND // 2, t, None, 1, None, None)))
    next_heartbeat = mono0 + SECOND
    slow = 1.08 if rank == 3 else 1.0
    step_ns = int(0.5 * SECOND * slow)
    records = 1
    previous_sync = None
    for k in range(steps):
        length = int(step_ns * (1 + rng.random() * 0.02)) + (4 * SECOND if k == 0 else 0)
        for key, (a, b) in zip(keys, fractions, strict=True):
            enc_append(encode((key, t + int(a * length), t + int(b * length), k, 1, None, None)))
        if k % 97 == 13:
            enc_append(encode((gck, t + length // 2, t + length // 2 + 3_000_000, k, 1, None, None)))
            records += 1
        enc_append(encode((schema.STEP, k, t, t + length, k)))  # seq: execution k
        if previous_sync is not None:
            enc_append(encode((schema.SYNC, previous_sync[0], t + length, schema.SYNC_LAG, previous_sync[0])))
            records += 1
        previous_sync = (k, t + length)
        t += length
        records += spans + 1
        if k % 100 == 99:
            enc_append(encode((schema.SYNC, k, t + 1_000, schema.SYNC_BLOCKING, k)))
            previous_sync = None
            enc_append(encode((ckpt, t + 2_000, t + 2_000 + int(1.5 * SECOND), k, 1, None, None)))
            t += 2_000 + int(1.5 * SECOND)
            records += 2
        elif k % 250 == 249:
            enc_append(encode((schema.SYNC, k, t + 1_000, schema.SYNC_BLOCKING, k)))
            previous_sync = None
            enc_append(encode((evalk, t + 2_000, t + 2_000 + 3 * SECOND, k, 1, None, None)))
            t += 2_000 + 3 * SECOND
            records += 2
        while next_heartbeat <= t:
            enc_append(f'{{"kind":"heartbeat","wall":{WALL0 + next_heartbeat - mono0},'
                       f'"mono":{next_heartbeat},"dropped":0}}\n')
            next_heartbeat += SECOND
            records += 1
    if previous_sync is not None:
        t += SECOND // 10
        enc_append(encode((schema.SYNC, previous_sync[0], t, schema.SYNC_FINISH, previous_sync[0])))
        records += 1
    enc_append(encode((schema.FINISH, True, t + SECOND // 5, "finish")))
    records += 1
    rank_dir = root / f"rank-{rank:05d}"
    rank_dir.mkdir(parents=True, exist_ok=True)
    with open(rank_dir / f"{session}.00000.jsonl", "w", encoding="utf-8") as handle:
        handle.write("".join(lines))
    return records


def _write_ranks(args: tuple[str, range, int, int, int]) -> int:
    root, ranks, world, steps, spans = args
    return sum(write_rank(Path(root), r, world, steps, spans, seed=1) for r in ranks)


def generate(root: Path, ranks: int, steps: int, spans: int, jobs: int) -> int:
    """Every rank's file, ``jobs`` processes writing interleaved ranks; the number of records."""
    jobs = max(1, min(jobs, ranks))
    if jobs == 1:
        return _write_ranks((str(root), range(ranks), ranks, steps, spans))
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        parts = [(str(root), range(j, ranks, jobs), ranks, steps, spans) for j in range(jobs)]
        return sum(pool.map(_write_ranks, parts))


def _count_records(root: Path) -> int:
    """Lines of every segment but the header (what the generator counted)."""
    total = 0
    for path in root.rglob("*.jsonl"):
        with open(path, "rb") as handle:
            total += sum(chunk.count(b"\n") for chunk in iter(functools.partial(handle.read, 1 << 24), b"")) - 1
    return total


def timed(cmd: list[str]) -> tuple[float, float, str]:
    """(seconds, peak RSS MiB, stdout) of a command in a fresh process."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        seconds, peak, code = run_measured(cmd, env=dict(os.environ, GOODTRACE_PROGRESS="0"), stdout=out, stderr=err)
        if code != 0:
            err.seek(0)
            raise SystemExit(f"{' '.join(cmd)} failed ({code}): {err.read().decode(errors='replace')}")
        out.seek(0)
        return seconds, peak, out.read().decode()


def goodtrace_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "goodtrace", *args]


# ------------------------------------------------------------------------------------------
# ml-goodput-measurement on the rank-0 event sequence
# ------------------------------------------------------------------------------------------
class _MemoryLogger:
    """The logger object GoodputRecorder/GoodputCalculator accept instead of Cloud Logging."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self.job_start_time = None

    def write_cloud_logging_entry(self, entry: dict[str, Any]) -> None:
        self.entries.append(entry)

    def read_cloud_logging_entries(self, start_time: Any = None, end_time: Any = None,
                                   last_entry_info: Any = None) -> tuple[list[dict[str, Any]], Any]:
        return list(self.entries), None


def compare_with_mlgm(steps: int) -> dict[str, Any]:
    try:
        from ml_goodput_measurement.src import goodput as mlgm  # type: ignore[import-not-found]
    except ImportError:
        return {"skipped": "ml-goodput-measurement is not installed (pip install ml-goodput-measurement)"}
    from goodtrace.analysis import analyze
    from goodtrace.read.load import load_run

    cases = {
        # name: (startup s, step s, first step extra s, tail s)
        "clean, startup": (3.0, 0.5, 0.0, 0.0),
        "startup + slow first step": (3.0, 0.5, 4.0, 0.0),
        "idle tail (definitions differ)": (3.0, 0.5, 0.0, 60.0),
    }
    results: dict[str, Any] = {}
    ratios: list[float] = []
    analyze_ratios: list[float] = []
    for name, (startup, step_s, extra, tail) in cases.items():
        tmp = Path(tempfile.mkdtemp(prefix="goodtrace-mlgm-"))
        try:
            # goodtrace: one rank, host-synced steps (T_k = start of step k+1)
            enc = _Encoder()
            mono0 = 1_000 * SECOND
            lines = [json.dumps(header(0, 1, "mlgm", mono0, mono0), separators=(",", ":")) + "\n"]
            t = mono0 + int(startup * SECOND)
            starts = []
            for k in range(steps):
                length = int((step_s + (extra if k == 0 else 0.0)) * SECOND)
                starts.append(t)
                lines.append(enc.encode((schema.STEP, k, t, t + length)))
                lines.append(enc.encode((schema.SYNC, k, t + length, schema.SYNC_HOST)))
                t += length
            end = t + int(tail * SECOND)
            lines.append(enc.encode((schema.FINISH, True, end, "finish")))
            (tmp / "rank-00000").mkdir()
            (tmp / "rank-00000" / "mlgm.00000.jsonl").write_text("".join(lines))
            t0 = time.perf_counter()
            loaded = load_run(tmp)
            t1 = time.perf_counter()
            ours = analyze(loaded)
            ours_analyze_s = time.perf_counter() - t1
            ours_s = time.perf_counter() - t0
            # ml-goodput-measurement: the same instants as datetimes
            def dt(mono: int, origin: int = mono0) -> datetime.datetime:
                return datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(
                    microseconds=(mono - origin) / 1000)

            logger = _MemoryLogger()
            recorder = mlgm.GoodputRecorder("bench", "bench", True, logger)
            recorder.record_job_start_time(dt(mono0))
            for k, s in enumerate(starts):
                recorder.record_step_start_time(k, dt(s))
            recorder.record_job_end_time(dt(end))
            calculator = mlgm.GoodputCalculator("bench", "bench", logger, cache_dir=str(tmp))
            t0 = time.perf_counter()
            theirs, _, _ = calculator.get_job_goodput(include_badput_breakdown=True)
            theirs_s = time.perf_counter() - t0
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        results[name] = {
            "goodtrace_goodput_pct": round(ours.partition.goodput * 100, 4),
            "mlgm_goodput_pct": round(float(theirs), 4),
            "goodtrace_s": round(ours_s, 4),
            "goodtrace_analyze_s": round(ours_analyze_s, 4),
            "mlgm_s": round(theirs_s, 4),
        }
        ratios.append(ours_s / theirs_s if theirs_s > 0 else float("nan"))
        analyze_ratios.append(ours_analyze_s / theirs_s if theirs_s > 0 else float("nan"))
    # goodtrace's time includes reading the rank file with DuckDB; GoodputCalculator's entries
    # are already in memory. The analysis-only ratio compares the computations themselves.
    results["time_ratio_goodtrace_over_mlgm"] = round(sum(ratios) / len(ratios), 3)
    results["time_ratio_analysis_only"] = round(sum(analyze_ratios) / len(analyze_ratios), 3)
    results["steps"] = steps
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    parser.add_argument("--ranks", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--spans", type=int, default=10, choices=range(1, len(STEP_SPANS) + 1))
    parser.add_argument("--keep", metavar="DIR", help="write the run here and keep it")
    parser.add_argument("--reuse", metavar="DIR", help="measure a run an earlier --keep wrote (no generation; "
                        "--ranks/--steps must match it)")
    parser.add_argument("--skip-jsonl-report", action="store_true",
                        help="only compact and report on Parquet (the JSON-lines report of 10 k ranks takes long)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes writing the ranks' files")
    args = parser.parse_args()
    ranks = args.ranks or (32 if args.quick else 1024)
    steps = args.steps or (200 if args.quick else 1000)
    root = Path(args.reuse or args.keep or tempfile.mkdtemp(prefix="goodtrace-bench-"))
    keep = bool(args.keep or args.reuse)
    figures: dict[str, Any] = {"ranks": ranks, "steps": steps, "spans_per_step": args.spans, "quick": args.quick,
                               "cpus": os.cpu_count()}
    try:
        if args.reuse:
            shutil.rmtree(root / "compact", ignore_errors=True)
            figures["records"] = _count_records(root)
        else:
            t0 = time.perf_counter()
            figures["records"] = generate(root, ranks, steps, args.spans, args.jobs)
            figures["generate_s"] = round(time.perf_counter() - t0, 2)
        figures["jsonl_bytes"] = sum(p.stat().st_size for p in root.rglob("*.jsonl"))
        figures["files"] = sum(1 for _ in root.rglob("*.jsonl"))
        print(f"{'reused' if args.reuse else 'generated'} {figures['records']:,} records "
              f"({figures['jsonl_bytes'] / 1e6:.0f} MB) for {ranks} ranks x {steps} steps"
              + (f" in {figures['generate_s']} s" if "generate_s" in figures else ""), flush=True)
        jsonl_report: dict[str, Any] | None = None
        if not args.skip_jsonl_report:
            seconds, peak, out = timed(goodtrace_cmd("report", str(root), "--json", "--no-steps"))
            jsonl_report = json.loads(out)
            figures.update(report_jsonl_s=round(seconds, 2), report_jsonl_peak_mib=round(peak))
            print(f"report (JSON lines): {seconds:.2f} s, peak {peak:.0f} MiB, goodput "
                  f"{jsonl_report['goodput'] * 100:.2f}%", flush=True)
        seconds, peak, _ = timed(goodtrace_cmd("compact", str(root)))
        figures.update(compact_s=round(seconds, 2), compact_peak_mib=round(peak),
                       parquet_bytes=(root / "compact" / "records.parquet").stat().st_size)
        print(f"compact: {seconds:.2f} s, peak {peak:.0f} MiB, {figures['parquet_bytes'] / 1e6:.0f} MB Parquet",
              flush=True)
        seconds, peak, out = timed(goodtrace_cmd("report", str(root), "--json", "--no-steps"))
        parquet_report = json.loads(out)
        figures.update(report_parquet_s=round(seconds, 2), report_parquet_peak_mib=round(peak))
        figures["model_bytes"] = sum(p.stat().st_size for p in (root / "compact").glob("model-*.parquet"))
        print(f"report (Parquet): {seconds:.2f} s, peak {peak:.0f} MiB, goodput "
              f"{parquet_report['goodput'] * 100:.2f}%", flush=True)
        figures["goodput"] = parquet_report["goodput"]
        figures["ranks_analysed"] = parquet_report["spread"]["analysed"]
        figures["ranks_with_figures"] = len(parquet_report["spread"]["per_rank"])
        if jsonl_report is not None:
            figures["forms_agree"] = (
                jsonl_report["partition"] == parquet_report["partition"]
                and jsonl_report["spread"] == parquet_report["spread"]
            )
            figures["ratio_jsonl_over_parquet"] = round(figures["report_jsonl_s"] / figures["report_parquet_s"], 2)
        figures["buckets_s"] = {k: round(v["seconds"], 3) for k, v in parquet_report["partition"]["buckets"].items()
                                if v["ns"]}
        figures["stragglers"] = [s["rank"] for s in parquet_report["stragglers"]]
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    figures["mlgm"] = compare_with_mlgm(steps)
    for name, row in figures["mlgm"].items():
        if isinstance(row, dict):
            print(f"vs ml-goodput-measurement [{name}]: goodtrace {row['goodtrace_goodput_pct']:.3f}% "
                  f"({row['goodtrace_s']:.3f} s load+analyse, {row['goodtrace_analyze_s']:.3f} s analyse) / "
                  f"GoodputCalculator {row['mlgm_goodput_pct']:.3f}% "
                  f"({row['mlgm_s']:.3f} s)")
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
