"""``goodtrace records RUN``: list a run's sessions and attempts (the raw view, no extras).

Reads every line with the standard-library reader (:func:`goodtrace.read.sessions.read_run`),
one record at a time, none held (a run of any length), the segments of a large run on a
process per core: each session with its record count, and every line that was skipped, named
by file and line (the first few of each file) and counted by reason. Run text is printed
escaped; ``--json`` is always valid JSON. ``--since``/``--until`` add each session's count of
records in the time range (the files read a second time, as the first:
:func:`goodtrace.read.sessions.count_in_range`).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from goodtrace.cli.time_range import add_range_arguments

if TYPE_CHECKING:
    from goodtrace.analysis.time_range import RangeEdge
    from goodtrace.read.loaded import Progress
    from goodtrace.read.sessions import Run

HELP = "list the sessions, attempts and record counts of a run directory"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run directory (path or fsspec URL)")
    from goodtrace.read.sessions import COUNT_POOL_MIN_BYTES

    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="local processes that read the segments (default: one per core for "
                             f"{COUNT_POOL_MIN_BYTES // 2**20} MiB of segments or more, else 1, or "
                             "GOODTRACE_WORKERS; 1 reads in this process)")
    add_range_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from goodtrace.cli import CommandError, warn
    from goodtrace.cli.progress import progress_bar
    from goodtrace.cli.time_range import range_options
    from goodtrace.read.loaded import LoadError
    from goodtrace.read.sessions import NotARunError, read_run
    from goodtrace.read.validate import describe_skipped
    from goodtrace.record.io.storage import is_url
    from goodtrace.renderers.text import printable

    try:
        time_range = range_options(args)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    if args.workers is not None and args.workers < 1:
        raise CommandError(f"--workers must be at least 1, got {args.workers}")
    path = _mirrored(args.run) if is_url(args.run) else args.run
    update, stop = progress_bar()  # a long run's segments take a while (2 x 1 M steps: about 30 s)
    try:
        try:
            loaded = read_run(path, keep_records=False, progress=update, workers=args.workers)
            in_range = (_counts_in_range(loaded, time_range.get("since"), time_range.get("until"), update,
                                         args.workers) if time_range else None)
        except (NotARunError, LoadError) as exc:  # LoadError: a worker process died
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"cannot read {args.run!r}: {exc.strerror or exc}") from None
    finally:
        stop()
    rows = []
    for number, session in enumerate(loaded.sessions):
        finish = session.finish
        host, pid = session.header.get("host"), session.header.get("pid")
        rows.append(
            {
                "attempt": session.attempt,
                "rank": session.rank,
                "host": host if isinstance(host, str) else None,
                "pid": pid if type(pid) is int else None,
                "session": session.session_id,
                "records": session.record_count,
                "segments": session.segments,
                "ended": "finished" if finish and finish.get("completed") is True else
                ("exited" if finish else "no finish record (crashed or still running)"),
            }
        )
        if in_range is not None:
            rows[-1]["records_in_range"] = in_range[number]
    if args.json:
        print(json.dumps({"sessions": rows, "skipped": loaded.skipped, "problems": loaded.problems}, indent=2,
                         allow_nan=False))
        return 0
    for row in rows:
        print(
            f"attempt {row['attempt']}  rank {row['rank']:>5}  {printable(row['host'] or '?')}:{row['pid'] or '?'}  "
            f"{row['records']:>8} records in {row['segments']} segment(s)  {row['ended']}"
            + (f"  ({row['records_in_range']} in the time range)" if "records_in_range" in row else "")
        )
    for problem in loaded.problems:
        warn(args.command, problem)
    bad = {reason: count for reason, count in loaded.skipped.items() if reason != "torn_last_line" and count}
    if bad:
        warn(args.command, f"in all, {describe_skipped(bad)}")
    return 0


def _mirrored(url: str) -> str:
    """A URL's local mirror (every segment: this view reads the JSON lines, never Parquet)."""
    from goodtrace.cli.progress import progress_bar
    from goodtrace.read.mirror import mirror_run

    update, stop = progress_bar()
    try:
        return mirror_run(url, progress=update, use_compact=False)
    finally:
        stop()


def _counts_in_range(run: Run, since: RangeEdge | None, until: RangeEdge | None,
                     progress: Progress | None = None, workers: int | None = None) -> list[int]:
    """Each session's records in the time range (the run's files read again, a record at a
    time). A UTC time or a duration selects by the record's time (a span record's start, else
    its time) on its session's wall clock; a duration counts from the run's first process start
    (negative: back from its last sign of life), since this view does not analyse the run;
    ``step:N`` selects by the record's step number."""
    from goodtrace.cli import CommandError
    from goodtrace.read.sessions import RecordRange, count_in_range

    sessions = run.sessions
    first = min(s.start_wall_ns for s in sessions)
    last = max(s.wall_ns(s.last_seen_mono) for s in sessions)

    def bound(edge: RangeEdge | None) -> int | None:
        if edge is None or edge.step is not None:
            return None
        if edge.wall_ns is not None:
            return edge.wall_ns
        assert edge.offset_s is not None
        if edge.offset_s in (float("inf"), float("-inf")):
            return last if edge.offset_s > 0 else first
        return (first if edge.offset_s >= 0 else last) + round(edge.offset_s * 1e9)

    a, b = bound(since), bound(until)
    if since is not None and a is not None and a >= last:
        raise CommandError(f"--since {since.describe()} is at or after the run's last record")
    if until is not None and b is not None and b <= first:
        raise CommandError(f"--until {until.describe()} is at or before the run's first process start")
    span = RecordRange(a, b, None if since is None else since.step, None if until is None else until.step)
    return count_in_range(run, span, progress=progress, workers=workers)
