"""How logging scales with the number of ranks: N recorder processes writing one run into local
disk (the baseline, measured in the same run), an emulated network filesystem (one shared FUSE
server adding a round trip to every operation, at two latency profiles) and an S3-compatible
object store (moto in server mode on 127.0.0.1, through fsspec/s3fs).

Each process records a realistic step at 10 steps/s: 20 spans, 3 metrics, a completion, a tag
every 10 steps and a checkpoint span every 50 steps; the step's "device work" is a sleep, so
the training thread is idle the way it is while a GPU computes. Per backend and N:

  added/step   the training thread's time inside goodtrace calls per step (median of the
               ranks' means, and the worst rank's p99): must stay flat in N
  flush p50/p99  seconds per storage call of the writer's I/O thread (append, upload)
  ops/flush    filesystem operations per rank per flush interval, as the FUSE server counted
               them (create, open, getattr, write, fsync, flush/release), over the whole run
               (one-off costs included: mkdir, create, header, the final fsync and close) and in
               its steady middle (30% to 80% of the run); the physical limit is one write per
               flush interval and no open or getattr per flush
  req/min      requests per rank per minute on the object store (whole run, steady middle),
               and bytes uploaded per byte of records (an object store cannot append: the open
               segment is re-uploaded at every flush)
  dropped      records dropped (counted by the recorder)
  server op/s  the server's operations per second, all ranks together

Ratios are against local disk at the same N, measured in the same run.

Usage: python benchmarks/storage_scaling.py [--quick] [--json] [--ranks 1,2,4] [--seconds S]
       [--backends local,nfs-0.5ms,nfs-3ms,s3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from typing import Any

# The servers are the test suite's (tests/helpers/storage_servers.py): one implementation of each.
from _timing import load_file

_servers = load_file("storage_servers", "tests/helpers/storage_servers.py")
EmulatedNFS, S3Server, fuse_unavailable, s3_unavailable = (_servers.EmulatedNFS, _servers.S3Server,
                                                          _servers.fuse_unavailable, _servers.s3_unavailable)

FLUSH_INTERVAL_S = 1.0

CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    import goodtrace as gt
    run_dir, rank, world, seconds, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
    rec = gt.init(run_dir, rank=rank, world_size=world, flush_interval_s=%(flush)r)
    storage = rec.storage
    latencies = []
    for method in ("append", "put"):
        original = getattr(storage, method, None)
        if original is None:
            continue
        def timed(*args, _original=original, **kwargs):
            t = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                latencies.append(time.perf_counter() - t)
        setattr(storage, method, timed)
    open(go + ".ready." + str(rank), "w").close()
    while not os.path.exists(go):
        time.sleep(0.005)
    clock = time.perf_counter
    names = ["data", "forward", "backward", "optimizer", "allreduce"]
    added = []
    start = clock()
    step = 0
    while clock() - start < seconds:
        t0 = clock()
        with gt.step(step) as s:
            for i in range(20):
                with gt.span(names[i %% 5]):
                    pass
            gt.metric("loss", 1.0 / (step + 1))
            gt.metric("lr", 1e-3, reduce="last")
            gt.metric("tokens", 4096.0, reduce="sum")
            if step %% 10 == 0:
                gt.tag("log")
            s.complete_on(1.0)
        spent = clock() - t0
        if step %% 50 == 49:
            t1 = clock()
            with gt.span("checkpoint", category="checkpoint_save"):
                time.sleep(0.005)
            spent += clock() - t1 - 0.005
        added.append(spent)
        step += 1
        wake = start + step / 10.0
        delay = wake - clock()
        if delay > 0:
            time.sleep(delay)
    t_finish = clock()
    ok = gt.finish()
    finish_s = clock() - t_finish
    added.sort()
    print(json.dumps({
        "rank": rank, "steps": step, "seconds": clock() - start, "added_mean": sum(added) / len(added),
        "added_p99": added[int(0.99 * (len(added) - 1))], "latencies": latencies,
        "dropped": rec.dropped_records, "finish_ok": ok, "finish_s": finish_s,
    }))
    """
) % {"flush": FLUSH_INTERVAL_S}


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def run_ranks(
    run_dir: str, ranks: int, seconds: float, env: dict[str, str],
    snapshot: Callable[[], dict[str, Any]] | None = None,
) -> tuple[list[dict[str, Any]], tuple[dict[str, Any], dict[str, Any]] | None]:
    """N recorder processes, started together, each recording for ``seconds``; with ``snapshot``
    (the server's counters), two snapshots in the steady middle of the run (30% and 80%)."""
    with tempfile.TemporaryDirectory() as tmp:
        go = os.path.join(tmp, "go")
        children = [
            subprocess.Popen([sys.executable, "-c", CHILD, run_dir, str(rank), str(ranks), str(seconds), go],
                             stdout=subprocess.PIPE, text=True, env={**os.environ, **env})
            for rank in range(ranks)
        ]
        deadline = time.monotonic() + 300
        while sum(os.path.exists(f"{go}.ready.{r}") for r in range(ranks)) < ranks:  # all initialised
            if time.monotonic() > deadline or any(c.poll() is not None for c in children):
                raise RuntimeError("a recorder process did not start")
            time.sleep(0.05)
        open(go, "w").close()
        steady = None
        if snapshot is not None:
            time.sleep(0.3 * seconds)
            first = snapshot()
            time.sleep(0.5 * seconds)
            steady = (first, snapshot())
        results = []
        for child in children:
            out, _ = child.communicate(timeout=seconds + 120)
            lines = out.strip().splitlines()
            if child.returncode != 0 or not lines:
                raise RuntimeError(f"a recorder process failed (exit {child.returncode})")
            results.append(json.loads(lines[-1]))
    return results, steady


def summarise(backend: str, ranks: int, results: list[dict[str, Any]], server: dict[str, Any] | None,
              record_bytes: int | None,
              steady: tuple[dict[str, Any], dict[str, Any]] | None = None) -> dict[str, Any]:
    latencies = [x for r in results for x in r["latencies"]]
    seconds = statistics.mean(r["seconds"] for r in results)
    flushes = seconds / FLUSH_INTERVAL_S
    row: dict[str, Any] = {
        "backend": backend, "ranks": ranks, "seconds": round(seconds, 2),
        "added_ms_per_step": statistics.median(r["added_mean"] for r in results) * 1e3,
        "added_p99_ms": max(r["added_p99"] for r in results) * 1e3,
        "flush_p50_ms": _percentile(latencies, 0.5) * 1e3,
        "flush_p99_ms": _percentile(latencies, 0.99) * 1e3,
        "dropped": sum(int(r["dropped"]) for r in results),
        "finish_ok": all(r["finish_ok"] for r in results),
        "finish_max_s": max(r["finish_s"] for r in results),
    }
    if server is not None and "ops" in server:
        ops = server["ops"]
        total = sum(ops.values())
        per = ranks * flushes
        row["ops_per_rank_per_flush"] = round(total / per, 2)
        row["ops_detail_per_rank_per_flush"] = {k: round(v / per, 2) for k, v in sorted(ops.items())}
        row["server_ops_per_s"] = round(total / server["seconds"], 1)
    if steady is not None and "ops" in steady[0]:
        (a, b), span_s = steady, steady[1]["seconds"] - steady[0]["seconds"]
        delta = {k: v - a["ops"].get(k, 0) for k, v in b["ops"].items()}
        per = ranks * span_s / FLUSH_INTERVAL_S
        row["steady_ops_per_rank_per_flush"] = round(sum(delta.values()) / per, 2)
        row["steady_ops_detail"] = {k: round(v / per, 2) for k, v in sorted(delta.items()) if v}
    if steady is not None and "requests" in steady[0]:
        (a, b), span_s = steady, steady[1]["seconds"] - steady[0]["seconds"]
        total = sum(b["requests"].values()) - sum(a["requests"].values())
        row["steady_requests_per_rank_per_min"] = round(total / ranks / (span_s / 60), 1)
    if server is not None and "requests" in server:
        total = sum(server["requests"].values())
        row["requests_per_rank_per_min"] = round(total / ranks / (seconds / 60), 1)
        row["requests_detail"] = server["requests"]
        row["server_ops_per_s"] = round(total / server["seconds"], 1)
        if record_bytes:
            row["uploaded_per_record_byte"] = round(server["bytes_in"] / record_bytes, 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 1, 4; 3 s per run (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    parser.add_argument("--ranks", default=None, help="comma-separated N (default 1,2,4,8,16,32,64)")
    parser.add_argument("--seconds", type=float, default=None, help="recording time per run")
    parser.add_argument("--backends", default="local,nfs-0.5ms,nfs-3ms,s3")
    args = parser.parse_args()
    ranks = [int(x) for x in (args.ranks or ("1,4" if args.quick else "1,2,4,8,16,32,64")).split(",")]
    seconds = args.seconds or (3.0 if args.quick else 10.0)
    backends = args.backends.split(",")
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="goodtrace-storage-") as tmp:
        for backend in backends:
            workdir = os.path.join(tmp, backend)
            os.makedirs(workdir)
            if backend == "local":
                for n in ranks:
                    run_dir = os.path.join(workdir, f"run-{n}")
                    rows.append(summarise(backend, n, run_ranks(run_dir, n, seconds, {})[0], None, None))
                    print(_line(rows[-1]), file=sys.stderr, flush=True)
            elif backend.startswith("nfs-"):
                reason = fuse_unavailable()
                if reason:
                    skipped[backend] = reason
                    continue
                rtt = float(backend[4:].removesuffix("ms"))
                with EmulatedNFS(workdir, rtt_ms=rtt) as nfs:
                    for n in ranks:
                        run_dir = os.path.join(nfs.mountpoint, f"run-{n}")
                        os.makedirs(run_dir)
                        nfs.command("reset")
                        results, steady = run_ranks(run_dir, n, seconds, {}, nfs.stats)
                        rows.append(summarise(backend, n, results, nfs.stats(), None, steady))
                        print(_line(rows[-1]), file=sys.stderr, flush=True)
            elif backend == "s3":
                reason = s3_unavailable()
                if reason:
                    skipped[backend] = reason
                    continue
                with S3Server(workdir) as s3:
                    for n in ranks:
                        s3.reset()
                        results, steady = run_ranks(f"s3://{s3.bucket}/run-{n}", n, seconds, s3.env, s3.stats)
                        stats = s3.stats()
                        record_bytes = _s3_bytes(s3, f"{s3.bucket}/run-{n}")
                        rows.append(summarise(backend, n, results, stats, record_bytes, steady))
                        print(_line(rows[-1]), file=sys.stderr, flush=True)
            else:
                parser.error(f"unknown backend {backend!r}")
    baseline = {r["ranks"]: r for r in rows if r["backend"] == "local"}
    for row in rows:
        base = baseline.get(row["ranks"])
        if base:
            row["added_vs_local"] = round(row["added_ms_per_step"] / base["added_ms_per_step"], 2)
    _print_table(rows, skipped)
    if args.json:
        print(json.dumps({"flush_interval_s": FLUSH_INTERVAL_S, "seconds_per_run": seconds,
                          "nfs_profiles": {"nfs-0.5ms": "0.5 ms per round trip, 8 server slots",
                                           "nfs-3ms": "3 ms per round trip, 8 server slots"},
                          "skipped": skipped, "rows": rows}))


def _s3_bytes(s3: Any, prefix: str) -> int:
    import fsspec

    fs = fsspec.filesystem("s3", key="testing", secret="testing", endpoint_url=s3.endpoint)
    return sum(int(info["size"]) for info in fs.find(prefix, detail=True).values())


def _line(row: dict[str, Any]) -> str:
    return (f"{row['backend']:>10} N={row['ranks']:>3}: added {row['added_ms_per_step']:.3f} ms/step, "
            f"flush p50 {row['flush_p50_ms']:.2f} ms p99 {row['flush_p99_ms']:.2f} ms, dropped {row['dropped']}")


def _print_table(rows: list[dict[str, Any]], skipped: dict[str, str]) -> None:
    print(f"flush interval {FLUSH_INTERVAL_S} s; emulated NFS: one FUSE server, 8 slots, a round trip per op")
    print("| backend | N | added ms/step (p99) | vs local | flush p50 / p99 ms | ops/rank/flush: whole run "
          "(steady) | req/rank/min: whole run (steady) | dropped | server op/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ops = f"{r['ops_per_rank_per_flush']} ({r['steady_ops_per_rank_per_flush']})" if "steady_ops_per_rank_per_flush" \
            in r else ""
        req = f"{r['requests_per_rank_per_min']} ({r['steady_requests_per_rank_per_min']})" \
            if "steady_requests_per_rank_per_min" in r else ""
        print(f"| {r['backend']} | {r['ranks']} | {r['added_ms_per_step']:.3f} ({r['added_p99_ms']:.3f}) | "
              f"{r.get('added_vs_local', float('nan')):.2f}x | {r['flush_p50_ms']:.2f} / {r['flush_p99_ms']:.2f} | "
              f"{ops} | {req} | {r['dropped']} | {r.get('server_ops_per_s', '')} |")
    for backend, reason in skipped.items():
        print(f"skipped {backend}: {reason}")


if __name__ == "__main__":
    main()
