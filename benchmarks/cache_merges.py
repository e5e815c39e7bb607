"""Benchmark: what the segment cache writes over the many re-reports of a long run.

Each report of a growing run keeps the reduction of the segments closed since as a chunk;
chunks are merged so that a folder does not fill with them. Before, once a folder held
``MAX_CHUNKS`` (8) chunks the next report rewrote all of them into one, so every eighth report
rewrote the whole run's reduction, and the bytes written over n reports grew with n squared.
Now chunks merge by level (``SegmentCache.merging``: a level is a factor of ``MAX_CHUNKS`` in
size above ``MERGE_FLOOR``, and a level's chunks merge once there are ``MAX_CHUNKS`` of them), so
a file's rows are rewritten once per level.

The run: 2 ranks (``report_incremental.py``'s writer and step content) in segments of
``--segment-kib`` (256 KiB); before each report every rank writes ``--steps-per-report`` steps
(400: about one segment closes per rank each time). For n reports at two sizes an order of
magnitude apart (20 and 200; ``--quick``: 4 and 40 of 100 steps in 64 KiB segments), each
policy in turn on the same run: "by level" (this version) and "all at once" (the previous
policy, which is this one with ``MERGE_FLOOR`` above any chunk: every chunk on one level).
"By level" runs with ``MERGE_FLOOR`` scaled down with the run (``--floor-kib``: 16 KiB, 8 KiB
with ``--quick``, against the 1 MiB default), so that the levels of a week-long run's cache
(hundreds of MB: level 2 or 3) show in a run of minutes (a few MB). Every
report is ``load_run`` in this process, with one worker; it prints per policy the bytes the
cache wrote over the n reports (Parquet and indexes), the most chunks it held, the time of all
the reports and of the last, and the ratios "by level" / "all at once". The two policies'
last JSON reports must be identical (the script fails otherwise). ``--json``: the last line is
one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from goodtrace.analysis import analyze
from goodtrace.read import segment_cache
from goodtrace.read.engine import Engine
from goodtrace.read.load import load_run
from goodtrace.renderers.json_report import render_json
from report_incremental import NOW, RankWriter

ALL_AT_ONCE = 1 << 62  # a floor above any chunk: every chunk on level 0, the previous policy


def _files(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in folder.iterdir()} if folder.is_dir() else {}


def run_policy(root: Path, reports: int, steps: int, segment_bytes: int, floor: int) -> dict[str, Any]:
    segment_cache.MERGE_FLOOR = floor
    writers = [RankWriter(root, rank, 2, segment_bytes) for rank in range(2)]
    cache = root / "compact" / "cache"
    written = 0
    most = 0
    times: list[float] = []
    text = ""
    for k in range(reports):
        for writer in writers:
            writer.steps(steps)
            if writer.size >= segment_bytes:  # the writer rotates at a flush once over the size
                writer._rotate([])
        before = _files(cache)
        start = time.perf_counter()
        loaded = load_run(root, engine=Engine(workers=1))
        times.append(time.perf_counter() - start)
        after = _files(cache)
        written += sum(size for name, size in after.items() if name not in before)
        most = max(most, sum(1 for name in after if name.endswith(".json")))
        if k == reports - 1:
            text = render_json(analyze(loaded, now_wall_ns=NOW, release_records=True, keep_cuts=False), include_steps=False)
            text = text.replace(json.dumps(str(root))[1:-1], "RUN")  # the two policies' runs are in two folders
        else:
            loaded.close()
    jsonl = sum(p.stat().st_size for p in root.rglob("*.jsonl"))
    return {"written_mb": round(written / 1e6, 2), "jsonl_mb": round(jsonl / 1e6, 1),
            "cache_mb": round(sum(_files(cache).values()) / 1e6, 2), "most_chunks": most,
            "reports_s": round(sum(times), 2), "last_s": round(times[-1], 3),
            "segments": sum(w.segment + 1 for w in writers), "_text": text}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 and 40 reports of a smaller run (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    parser.add_argument("--reports", type=int, nargs="+", help="the sizes (reports of the growing run)")
    parser.add_argument("--steps-per-report", type=int, help="steps each rank writes before each report")
    parser.add_argument("--segment-kib", type=int, help="segment size in KiB")
    parser.add_argument("--floor-kib", type=int,
                        help="MERGE_FLOOR in KiB for 'by level' (default: 1/64 of the writer's 1 MiB, 1/128 with "
                             "--quick, as the run is smaller than a long run: see the docstring)")
    args = parser.parse_args()
    sizes = args.reports or ([4, 40] if args.quick else [20, 200])
    steps = args.steps_per_report or (100 if args.quick else 400)
    segment_bytes = (args.segment_kib or (64 if args.quick else 256)) * 1024
    policies = {"by level": (args.floor_kib or (8 if args.quick else 16)) * 1024, "all at once": ALL_AT_ONCE}
    default_floor = segment_cache.MERGE_FLOOR
    rows = []
    for reports in sizes:
        row: dict[str, Any] = {"reports": reports, "steps_per_report": steps, "segment_kib": segment_bytes // 1024,
                               "floor_kib": policies["by level"] // 1024}
        for policy, floor in policies.items():
            base = Path(tempfile.mkdtemp(prefix="goodtrace-merges-"))
            try:
                row[policy] = run_policy(base / "run", reports, steps, segment_bytes, floor)
            finally:
                shutil.rmtree(base, ignore_errors=True)
        texts = {row[policy].pop("_text") for policy in policies}
        if len(texts) != 1:
            raise SystemExit("the two policies' reports differ")
        new, old = row["by level"], row["all at once"]
        row["written_ratio"] = round(new["written_mb"] / old["written_mb"], 3)
        row["reports_time_ratio"] = round(new["reports_s"] / old["reports_s"], 3)
        rows.append(row)
        print(f"{reports} reports (+{steps} steps a rank each; {new['jsonl_mb']} MB of JSON lines in "
              f"{new['segments']} segments at the end): the cache wrote {new['written_mb']} MB by level against "
              f"{old['written_mb']} MB all at once ({row['written_ratio']}x), at most {new['most_chunks']} / "
              f"{old['most_chunks']} chunks, cache {new['cache_mb']} / {old['cache_mb']} MB; the reports took "
              f"{new['reports_s']} / {old['reports_s']} s ({row['reports_time_ratio']}x), the last "
              f"{new['last_s']} / {old['last_s']} s; identical JSON", flush=True)
    segment_cache.MERGE_FLOOR = default_floor
    if args.json:
        print(json.dumps({"benchmark": "cache_merges", "rows": rows}))


if __name__ == "__main__":
    main()
