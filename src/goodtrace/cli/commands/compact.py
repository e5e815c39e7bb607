"""``goodtrace compact RUN``: reduce every segment of the run once, and keep its records as Parquet.

Writes ``RUN/compact/records.parquet``, the reduction of every segment extracted from it
(``RUN/compact/model-*.parquet``: one chunk of the segment cache,
:mod:`goodtrace.read.segment_cache`) and a manifest; the JSON-lines segments stay where they
are. ``goodtrace report`` then takes each segment's reduction from there while the segment is
unchanged, and reads JSON only for segments that changed or appeared since.
"""

from __future__ import annotations

import argparse

from goodtrace.record.live.line import format_bytes

HELP = "reduce every segment of a run once and keep its records as Parquet (faster reports on large runs)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run directory")


def run(args: argparse.Namespace) -> int:
    import os

    from goodtrace.cli import CommandError, warn
    from goodtrace.cli.analysed import reading_errors
    from goodtrace.cli.progress import progress_bar
    from goodtrace.read.load import compact_run
    from goodtrace.record.io.storage import missing_path

    if not os.path.exists(args.run):
        raise CommandError(missing_path(args.run))
    update, stop = progress_bar()
    try:
        with reading_errors("compact", args.run):
            result = compact_run(args.run, progress=update)
    finally:
        stop()
    print(
        f"wrote {result.path}: {result.records:,} records from {result.files} segment file(s), "
        f"{format_bytes(result.json_bytes)} of JSON lines -> {format_bytes(result.parquet_bytes)} of Parquet"
    )
    from goodtrace.read.validate import describe_skipped

    for problem in result.problems:
        warn(args.command, problem)
    if result.skipped:
        warn(args.command, f"{describe_skipped(result.skipped)}; they are not in the compacted copy's records")
    return 0
