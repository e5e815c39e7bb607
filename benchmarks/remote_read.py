"""Reading a run from a shared filesystem and from object storage, against local disk.

Writes a synthetic run (``report_scale.py``'s generator: the real encoder and file layout, one
segment per rank) at two or more sizes, then times ``goodtrace report RUN --json`` and
``goodtrace trace RUN --steps A:B -o FILE``, each in a fresh process with its peak RSS, from:

  local        the run on local disk (the baseline, measured in the same run);
  nfs-R ms     the emulated network filesystem of ``tests/helpers/storage_servers.py`` (one FUSE
               server adding R ms to every operation the kernel forwards, attribute caching
               off), at two latency profiles: the report reads the mount path like a local one;
  s3, s3-L ms  moto's S3 on 127.0.0.1 through fsspec/s3fs, as it answers and with L ms added to
               every request (a real store's time to first byte; requests are served
               concurrently): the reader mirrors the run into a
               local cache (``GOODTRACE_CACHE_DIR``) and reads the mirror. ``cold`` is the first
               read (everything fetched), ``warm`` a second read with nothing changed, ``grown``
               after one rank's segment grew, then the same after ``goodtrace compact`` (the
               compacted copy uploaded beside the segments, as a user would sync it):
               ``compacted-warm`` (the mirror of the JSON lines already there) and
               ``compacted-cold`` (an empty cache).

The compacted run is also read from local disk (its baseline) and from the emulated NFS.

Per row: seconds and peak RSS of each command, the ratio to local disk at the same size, the
FUSE operations or S3 requests per segment file (LIST, GET, HEAD, ...), the bytes fetched, and
whether the report's JSON equals the local one (minus the path and the mirror's note). The load
average is printed before and after: on a shared machine, read the ratios, not the seconds.

Usage: python benchmarks/remote_read.py [--quick] [--json] [--ranks 16,256] [--steps N]
       [--rtt-ms 0.5,3] [--s3-latency-ms 0,20] [--backends local,nfs,s3] [--keep DIR]

--quick: 4 and 40 ranks x 20 steps, NFS at 0.5 ms and S3 at 20 ms only (under a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _timing import load_file, run_measured
from report_scale import write_rank

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The servers are the test suite's (tests/helpers/storage_servers.py): one implementation of each.
_servers = load_file("storage_servers", "tests/helpers/storage_servers.py")
EmulatedNFS, S3Server, fuse_unavailable, s3_unavailable = (_servers.EmulatedNFS, _servers.S3Server,
                                                          _servers.fuse_unavailable, _servers.s3_unavailable)

MIRROR_NOTE = "read from a local mirror of "


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(seconds, peak RSS MiB, stdout) of a command in a fresh process."""
    # started from a small fresh interpreter: this process grows with s3fs and the uploads
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        seconds, peak, code = run_measured(cmd, env={**os.environ, "GOODTRACE_PROGRESS": "0", **env},
                                           stdout=out, stderr=err)
        if code != 0:
            err.seek(0)
            raise SystemExit(f"{' '.join(cmd)} failed ({code}): {err.read().decode(errors='replace')[-2000:]}")
        out.seek(0)
        return seconds, peak, out.read().decode()


def goodtrace(*args: str) -> list[str]:
    return [sys.executable, "-m", "goodtrace", *args]


def comparable(report: dict[str, Any]) -> dict[str, Any]:
    """The report minus what differs by where it was read from (path, the mirror's note)."""
    out = {k: v for k, v in report.items() if k != "path"}
    out["warnings"] = [w for w in report.get("warnings", []) if not w.startswith(MIRROR_NOTE)]
    return out


class Size:
    """One synthetic run on local disk and its local figures."""

    def __init__(self, work: Path, ranks: int, steps: int) -> None:
        self.ranks, self.steps = ranks, steps
        self.name = f"run-{ranks}x{steps}"
        self.local = work / "local" / self.name
        self.compacted = work / "local-compacted" / self.name  # the same run, after goodtrace compact
        t0 = time.perf_counter()
        self.records = sum(write_rank(self.local, r, ranks, steps, 10, seed=1) for r in range(ranks))
        self.generate_s = time.perf_counter() - t0
        self.files = sum(1 for _ in self.local.rglob("*.jsonl"))
        self.jsonl_bytes = sum(p.stat().st_size for p in self.local.rglob("*.jsonl"))
        middle = steps // 2
        self.steps_arg = f"{max(middle - 10, 0)}:{middle + 9}"
        self.reference: dict[str, Any] | None = None
        self.reference_compacted: dict[str, Any] | None = None
        self.baseline: dict[str, dict[str, float]] = {}

    def describe(self) -> dict[str, Any]:
        return {"ranks": self.ranks, "steps": self.steps, "files": self.files, "records": self.records,
                "jsonl_bytes": self.jsonl_bytes, "trace_steps": self.steps_arg,
                "generate_s": round(self.generate_s, 2)}


def run_commands(size: Size, run: str, work: Path, env: dict[str, str], *, trace: bool = True,
                 before: Any = None, after: Any = None) -> dict[str, Any]:
    """report (and trace) of ``run``; ``before``/``after`` bracket the report for server counts."""
    row: dict[str, Any] = {}
    if before is not None:
        before()
    seconds, peak, out = timed(goodtrace("report", run, "--json"), env)
    if after is not None:
        row.update(after())
    report = json.loads(out)
    row.update(report_s=round(seconds, 3), report_peak_mib=round(peak), form=report.get("form"))
    row["_report"] = report
    if trace:
        target = work / "trace.json"
        if before is not None:
            before()
        seconds, peak, _ = timed(goodtrace("trace", run, "--steps", size.steps_arg, "-o", str(target)), env)
        if after is not None:
            row["trace_counts"] = after()
        row.update(trace_s=round(seconds, 3), trace_peak_mib=round(peak), trace_bytes=target.stat().st_size)
        target.unlink()
    return row


def finish_row(size: Size, backend: str, row: dict[str, Any], *, compacted: bool = False) -> dict[str, Any]:
    report = row.pop("_report")
    reference = size.reference_compacted if compacted else size.reference
    row = {"backend": backend, "ranks": size.ranks, "steps": size.steps, **row}
    if reference is not None:
        row["agrees_with_local"] = comparable(report) == comparable(reference)
    base = size.baseline.get("compacted" if compacted else "jsonl", {})
    for what in ("report_s", "trace_s"):
        if what in row and base.get(what):
            row[what.replace("_s", "_vs_local")] = round(row[what] / base[what], 2)
    return row


def nfs_ops(nfs: Any, files: int) -> dict[str, Any]:
    ops = nfs.stats()["ops"]
    total = sum(ops.values())
    return {"fuse_ops": total, "fuse_ops_per_file": round(total / files, 1),
            "fuse_ops_by_kind_per_file": {k: round(v / files, 2) for k, v in sorted(ops.items())}}


def s3_counts(s3: Any, files: int) -> dict[str, Any]:
    stats = s3.stats()
    operations = stats.get("operations", stats["requests"])
    total = sum(operations.values())
    return {"requests": total, "requests_per_file": round(total / files, 2), "operations": operations,
            "bytes_fetched": stats.get("bytes_out")}


def print_row(row: dict[str, Any]) -> None:
    parts = [f"{row['backend']:<22} {row['ranks']:>4} ranks: report {row['report_s']:6.2f} s "
             f"{row['report_peak_mib']:5} MiB"]
    if "report_vs_local" in row:
        parts.append(f"({row['report_vs_local']:.2f}x local)")
    if "trace_s" in row:
        parts.append(f"| trace {row['trace_s']:6.2f} s {row['trace_peak_mib']:5} MiB")
        if "trace_vs_local" in row:
            parts.append(f"({row['trace_vs_local']:.2f}x)")
    if "fuse_ops_per_file" in row:
        parts.append(f"| {row['fuse_ops_per_file']} FUSE ops/file")
        if "trace_counts" in row:
            parts.append(f"(trace {row['trace_counts']['fuse_ops_per_file']})")
    if "requests_per_file" in row:
        parts.append(f"| {row['requests_per_file']} req/file {row['operations']}")
    if row.get("form") not in (None, "jsonl"):
        parts.append(f"| form {row['form']}")
    if row.get("agrees_with_local") is False:
        parts.append("| DIFFERS FROM LOCAL")
    print(" ".join(parts), flush=True)


def bench_local(size: Size, work: Path, rows: list[dict[str, Any]]) -> None:
    row = run_commands(size, str(size.local), work, {})
    size.reference = row["_report"]
    size.baseline["jsonl"] = {"report_s": row["report_s"], "trace_s": row["trace_s"]}
    rows.append(finish_row(size, "local", row))
    print_row(rows[-1])
    shutil.copytree(size.local, size.compacted)
    seconds, peak, _ = timed(goodtrace("compact", str(size.compacted)), {})
    print(f"compact {size.ranks} ranks: {seconds:.2f} s, peak {peak:.0f} MiB", flush=True)
    row = run_commands(size, str(size.compacted), work, {})
    size.reference_compacted = row["_report"]
    size.baseline["compacted"] = {"report_s": row["report_s"], "trace_s": row["trace_s"]}
    rows.append(finish_row(size, "local compacted", row, compacted=True))
    print_row(rows[-1])


def bench_nfs(sizes: list[Size], work: Path, rtt_ms: float, rows: list[dict[str, Any]]) -> None:
    with EmulatedNFS(str(work / f"nfs-{rtt_ms}"), rtt_ms=rtt_ms) as nfs:
        for size in sizes:
            for source, suffix in ((size.local, ""), (size.compacted, " compacted")):
                # Placed straight into the served directory: the write path is storage_scaling.py's.
                name = os.path.join(suffix.strip() or "jsonl", size.name)
                shutil.copytree(source, os.path.join(nfs.serve_dir, name))
                row = run_commands(size, os.path.join(nfs.mountpoint, name), work, {},
                                   before=lambda nfs=nfs: nfs.command("reset"),
                                   after=lambda nfs=nfs, size=size: nfs_ops(nfs, size.files))
                rows.append(finish_row(size, f"nfs-{rtt_ms:g}ms{suffix}", row, compacted=bool(suffix)))
                print_row(rows[-1])


def upload(fs: Any, local: Path, remote: str) -> None:
    fs.put(str(local) + "/", remote, recursive=True)


def bench_s3(sizes: list[Size], work: Path, latency_ms: float, rows: list[dict[str, Any]]) -> None:
    label = "s3" if latency_ms == 0 else f"s3-{latency_ms:g}ms"
    folder = work / label
    folder.mkdir()
    with S3Server(str(folder), latency_ms=latency_ms) as s3:
        os.environ.update(s3.env)
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
        fs = s3fs.S3FileSystem()
        for size in sizes:
            url = f"s3://{s3.bucket}/{size.name}"
            t0 = time.perf_counter()
            upload(fs, size.local, url)
            print(f"uploaded {size.files} files to {url} in {time.perf_counter() - t0:.1f} s", flush=True)
            cache = {"GOODTRACE_CACHE_DIR": str(folder / f"cache-{size.name}")}

            def count(s3: Any = s3, size: Size = size) -> dict[str, Any]:
                return s3_counts(s3, size.files)

            for phase, trace in (("cold", False), ("warm", True)):
                row = run_commands(size, url, work, cache, trace=trace, before=s3.reset, after=count)
                rows.append(finish_row(size, f"{label} {phase}", row))
                print_row(rows[-1])
            # One rank's open segment grows (a live run): a heartbeat line appended and re-uploaded,
            # then the original put back.
            segment = sorted((size.local / "rank-00000").glob("*.jsonl"))[0]
            key = f"{url}/rank-00000/{segment.name}"
            fs.pipe_file(key, segment.read_bytes() + b'{"kind":"heartbeat","wall":1700000000000000000,"mono":1,"dropped":0}\n')
            row = run_commands(size, url, work, cache, trace=False, before=s3.reset, after=count)
            rows.append(finish_row(size, f"{label} grown", row))
            rows[-1].pop("agrees_with_local", None)  # the local run did not grow
            print_row(rows[-1])
            fs.put_file(str(segment), key)
            # Compacted: its compact/ uploaded beside the segments, as a user would sync it.
            fs.put(str(size.compacted / "compact") + "/", f"{url}/compact", recursive=True)
            for phase, fresh in (("compacted-warm", False), ("compacted-cold", True)):
                env = {"GOODTRACE_CACHE_DIR": str(folder / f"cache-{size.name}-cold")} if fresh else cache
                row = run_commands(size, url, work, env, trace=fresh, before=s3.reset, after=count)
                rows.append(finish_row(size, f"{label} {phase}", row, compacted=True))
                print_row(rows[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small runs (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    parser.add_argument("--ranks", help="comma-separated rank counts (default 16,256; --quick 4,40)")
    parser.add_argument("--steps", type=int, help="steps per rank (default 200; --quick 20)")
    parser.add_argument("--rtt-ms", help="round trips of the emulated NFS, comma-separated (default 0.5,3; "
                                         "--quick 0.5)")
    parser.add_argument("--s3-latency-ms",
                        help="delay of every S3 request (time to first byte), comma-separated (default 0,20; "
                             "--quick 20)")
    parser.add_argument("--backends", default="local,nfs,s3", help="any of local,nfs,s3 (local always runs)")
    parser.add_argument("--keep", metavar="DIR", help="work in DIR and keep it")
    args = parser.parse_args()
    ranks = [int(x) for x in (args.ranks or ("4,40" if args.quick else "16,256")).split(",")]
    s3_latencies = [float(x) for x in (args.s3_latency_ms or ("20" if args.quick else "0,20")).split(",")]
    rtts = args.rtt_ms or ("0.5" if args.quick else "0.5,3")
    steps = args.steps or (20 if args.quick else 200)
    backends = set(args.backends.split(","))
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="goodtrace-remote-read-"))
    work.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {"quick": args.quick, "cpus": os.cpu_count(), "load_before": load_average()}
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    print(f"load average {figures['load_before']} on {os.cpu_count()} CPUs", flush=True)
    started = time.perf_counter()
    try:
        sizes = [Size(work, r, steps) for r in ranks]
        for size in sizes:
            print(f"generated {size.records:,} records for {size.ranks} ranks x {size.steps} steps "
                  f"({size.files} files, {size.jsonl_bytes / 1e6:.1f} MB)", flush=True)
            bench_local(size, work, rows)
        if "nfs" in backends:
            reason = fuse_unavailable()
            if reason:
                skipped["nfs"] = reason
            else:
                for rtt in (float(x) for x in rtts.split(",")):
                    bench_nfs(sizes, work, rtt, rows)
        if "s3" in backends:
            reason = s3_unavailable()
            if reason:
                skipped["s3"] = reason
            else:
                for latency in s3_latencies:
                    bench_s3(sizes, work, latency, rows)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    for what, reason in skipped.items():
        print(f"skipped {what}: {reason}", flush=True)
    figures.update(sizes=[s.describe() for s in sizes], rows=rows, skipped=skipped,
                   load_after=load_average(), seconds=round(time.perf_counter() - started, 1))
    print(f"load average {figures['load_after']}; {figures['seconds']} s in all", flush=True)
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
