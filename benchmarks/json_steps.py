"""Benchmark: the step table of ``goodtrace report --json``, against the standard library's
encoder writing the same rows.

``report --json`` writes the report object and then its step table a row at a time (a week of
steps is never held as one string), indented by 2 as ``json.dumps(..., indent=2)`` writes it.
Python's C encoder takes no indent before 3.13, so the standard library writes indented JSON
with its pure-Python encoder; the report writes it with ``renderers/json_text.py`` (the same
bytes). Writes one rank of 100,000 and 1,000,000 steps (``--quick``: 10,000 and 100,000;
``report_incremental.py``'s writer: three spans a step, its sync point, a loss metric, a tag
every 100 steps, a checkpoint every 1,000), reads and analyses it once, then times in this
process, alternated ``--repeat`` times (the medians):

  report: the report's text with its step table (``iter_json``: the table's blocks of columns
          written, no row made);
  baseline: the same text with every piece written by ``json.dumps(..., indent=2)`` (the
            report object, then each row's object, as the report wrote them before; the
            rows made by the table's walk, from the same blocks).

The two texts must be identical (the script fails otherwise). It prints per size the seconds
of each, the time per row, their ratio (report / baseline) and the time per row against the
smaller size's (1.0: linear); ``--json``: the last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from goodtrace.analysis import analyze
from goodtrace.read.engine import Engine
from goodtrace.read.load import load_run
from goodtrace.renderers.json_report import iter_json, report_object
from report_incremental import NOW, RankWriter


def _report(analysis: Any) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    for piece in iter_json(analysis, include_steps=True):
        digest.update(piece.encode())
        size += len(piece)
    return digest.hexdigest(), size


def _baseline(analysis: Any) -> tuple[str, int]:
    """``iter_json``'s pieces, each written by ``json.dumps(..., indent=2)``."""
    digest, size = hashlib.sha256(), 0

    def put(piece: str) -> None:
        nonlocal size
        digest.update(piece.encode())
        size += len(piece)

    head = json.dumps(report_object(analysis, include_steps=False), indent=2, allow_nan=False)
    inner = "\n    "
    put(head[:-2] + ",\n  " + '"steps": [')
    rows = 0
    for rows, row in enumerate(analysis.steps, start=1):
        put(("," if rows > 1 else "") + inner + json.dumps(row.to_dict(), indent=2, allow_nan=False).replace("\n", inner))
    put(("\n  ]" if rows else "]") + "\n}")
    return digest.hexdigest(), size


def measure(work: Path, steps: int, repeat: int) -> dict[str, Any]:
    root = work / f"run-{steps}"
    writer = RankWriter(root, 0, 1, 64 * 2**20)
    writer.steps(steps)
    analysis = analyze(load_run(root, engine=Engine(workers=1)), now_wall_ns=NOW, release_records=True)
    times: dict[str, list[float]] = {"report": [], "baseline": []}
    texts: dict[str, tuple[str, int]] = {}
    for _ in range(repeat):
        for name, write in (("report", _report), ("baseline", _baseline)):
            start = time.perf_counter()
            texts[name] = write(analysis)
            times[name].append(time.perf_counter() - start)
    if texts["report"] != texts["baseline"]:
        raise SystemExit(f"at {steps} steps the report's text differs from json.dumps's")
    shutil.rmtree(root, ignore_errors=True)
    rows = len(analysis.steps)
    report_s, baseline_s = statistics.median(times["report"]), statistics.median(times["baseline"])
    return {"steps": steps, "rows": rows, "text_mb": round(texts["report"][1] / 1e6, 1),
            "report_s": round(report_s, 2), "baseline_s": round(baseline_s, 2),
            "report_us_per_row": round(report_s / rows * 1e6, 2), "baseline_us_per_row": round(baseline_s / rows * 1e6, 2),
            "report_over_baseline": round(report_s / baseline_s, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=None, help="run sizes (default 100000 1000000)")
    parser.add_argument("--repeat", type=int, default=1, help="alternated runs of each variant (medians)")
    parser.add_argument("--quick", action="store_true", help="10,000 and 100,000 steps (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    args = parser.parse_args()
    sizes = args.steps or ([10_000, 100_000] if args.quick else [100_000, 1_000_000])
    work = Path(tempfile.mkdtemp(prefix="goodtrace-json-steps-"))
    try:
        rows = [measure(work, steps, args.repeat) for steps in sizes]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for row in rows:
        row["us_per_row_vs_smallest"] = round(row["report_us_per_row"] / rows[0]["report_us_per_row"], 3)
        print(f"{row['steps']:>10,} steps ({row['rows']:,} rows, {row['text_mb']} MB): report {row['report_s']} s "
              f"({row['report_us_per_row']} us a row), json.dumps {row['baseline_s']} s "
              f"({row['baseline_us_per_row']} us a row): {row['report_over_baseline']}x; "
              f"per row vs the smallest {row['us_per_row_vs_smallest']}x")
    if args.json:
        print(json.dumps({"benchmark": "json_steps", "python": sys.version.split()[0], "sizes": rows}))


if __name__ == "__main__":
    main()
