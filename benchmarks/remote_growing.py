"""Benchmark: re-reporting a live run on object storage, whose open segments grow.

The run: ``--ranks`` ranks (2) of ``report_incremental.py``'s writer and step content, with
20,000 and 200,000 steps a rank (``--quick``: 2,000 and 20,000) in 64 MiB segments, the last
of each rank open, uploaded to moto's S3 on 127.0.0.1 (the test suite's server,
``tests/helpers/storage_servers.py``). A first report mirrors it and
keeps the segment cache; then every rank writes 1% more steps (``--grow``) into its open
segment, which is uploaded again whole (an object is rewritten, as an uploader of an open
segment does), and the run is reported again, in this process (``load_run`` with one worker,
the analysis and the JSON without the step table):

  appended  this version: a grown object is fetched as its new bytes, appended to the mirrored
            file (its inode kept), so the cache's prefix of the open segment holds and only the
            new lines are parsed;
  whole     the previous behaviour, measured in the same run: every grown object fetched whole
            (``mirror._APPEND_FROM`` above any size), a new file, parsed whole.

Per size and case: the bytes the S3 server sent (``bytes_out``) and its requests, the bytes of
JSON lines the report parsed (``LoadedRun.read_bytes``), the time of the mirror and load and of
the whole report, and the ratios appended / whole. The two cases' JSON reports must be
identical (the script fails otherwise). ``--json``: the last line is one JSON object with every
figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from _timing import load_file
from goodtrace.analysis import analyze
from goodtrace.read import mirror
from goodtrace.read.engine import Engine
from goodtrace.read.load import load_run
from goodtrace.renderers.json_report import render_json
from report_incremental import NOW, RankWriter

_servers = load_file("storage_servers", "tests/helpers/storage_servers.py")
CASES = {"appended": mirror._APPEND_FROM, "whole": 1 << 62}


def comparable(text: str) -> str:
    """A report without what names the case's URL and mirror."""
    found = json.loads(text)
    found.pop("path")
    found["warnings"] = [w for w in found["warnings"] if not w.startswith("read from a local mirror of ")]
    return json.dumps(found)


def report(url: str) -> tuple[str, dict[str, Any]]:
    start = time.perf_counter()
    loaded = load_run(url, engine=Engine(workers=1))
    loaded_s = time.perf_counter() - start
    text = render_json(analyze(loaded, now_wall_ns=NOW, release_records=True, keep_cuts=False), include_steps=False)
    return text, {"load_s": round(loaded_s, 3), "report_s": round(time.perf_counter() - start, 3),
                  "parsed_mb": round(loaded.read_bytes / 1e6, 3)}


def measure(work: Path, s3: Any, fs: Any, steps: int, ranks: int, grow: float, case: str) -> dict[str, Any]:
    mirror._APPEND_FROM = CASES[case]
    local = work / f"{case}-{steps}" / "run"
    writers = [RankWriter(local, rank, ranks, 64 * 2**20) for rank in range(ranks)]
    for writer in writers:
        writer.steps(steps)
    url = f"s3://{s3.bucket}/{case}-{steps}/run"
    fs.put(str(local) + "/", url, recursive=True)
    os.environ["GOODTRACE_CACHE_DIR"] = str(work / f"cache-{case}-{steps}")
    report(url)  # the first report: mirrors the run, keeps the cache
    more = max(1, int(steps * grow))
    grown: list[Path] = []
    for writer in writers:
        writer.steps(more)
        grown.append(writer.dir / f"{writer.session}.{writer.segment:05d}.jsonl")
    for segment in grown:
        fs.put_file(str(segment), f"{url}/{segment.parent.name}/{segment.name}")
    s3.reset()
    text, row = report(url)
    stats = s3.stats()
    row.update(steps=steps, more_steps=more, open_mb=round(sum(p.stat().st_size for p in grown) / 1e6, 1),
               fetched_mb=round(stats["bytes_out"] / 1e6, 3), requests=stats["operations"],
               jsonl_mb=round(sum(p.stat().st_size for p in local.rglob("*.jsonl")) / 1e6, 1), _text=text)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 and 20,000 steps a rank (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, nargs="+", help="the sizes (steps per rank)")
    parser.add_argument("--grow", type=float, default=0.01, help="steps appended, as a share of the run (0.01)")
    args = parser.parse_args()
    if (missing := _servers.s3_unavailable()) is not None:
        raise SystemExit(missing)
    sizes = args.steps or ([2_000, 20_000] if args.quick else [20_000, 200_000])
    work = Path(tempfile.mkdtemp(prefix="goodtrace-remote-growing-"))
    rows = []
    try:
        with _servers.S3Server(str(work)) as s3:
            os.environ.update(s3.env)
            import s3fs

            s3fs.S3FileSystem.clear_instance_cache()
            fs = s3fs.S3FileSystem()
            for steps in sizes:
                row: dict[str, Any] = {"steps": steps, "ranks": args.ranks}
                for case in CASES:
                    row[case] = measure(work, s3, fs, steps, args.ranks, args.grow, case)
                    shutil.rmtree(work / f"{case}-{steps}", ignore_errors=True)
                texts = [comparable(row[case].pop("_text")) for case in CASES]
                if texts[0] != texts[1]:
                    raise SystemExit("the two cases' reports differ")
                new, old = row["appended"], row["whole"]
                for key in ("fetched_mb", "parsed_mb", "load_s", "report_s"):
                    row[f"{key[:-3] if key.endswith('_mb') else key[:-2]}_ratio"] = round(new[key] / old[key], 4)
                rows.append(row)
                print(f"{steps:,} steps x {args.ranks} ranks ({new['jsonl_mb']} MB, open segments {new['open_mb']} MB), "
                      f"+{new['more_steps']:,} steps: fetched {new['fetched_mb']} MB appended against "
                      f"{old['fetched_mb']} MB whole ({row['fetched_ratio']}x; requests {new['requests']} / "
                      f"{old['requests']}), parsed {new['parsed_mb']} / {old['parsed_mb']} MB, load "
                      f"{new['load_s']} / {old['load_s']} s ({row['load_ratio']}x), report {new['report_s']} / "
                      f"{old['report_s']} s ({row['report_ratio']}x); identical JSON", flush=True)
    finally:
        mirror._APPEND_FROM = CASES["appended"]
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps({"benchmark": "remote_growing", "rows": rows}))


if __name__ == "__main__":
    main()
