"""``goodtrace records RUN``: list a run's sessions and attempts (the raw view, no extras).

Reads every line with the standard-library reader (:func:`goodtrace.read.sessions.read_run`):
each session with its record count, and every line that was skipped, named by file and line
(the first few of each file) and counted by reason. Run text is printed escaped; ``--json`` is
always valid JSON.
"""

from __future__ import annotations

import argparse
import json

HELP = "list the sessions, attempts and record counts of a run directory"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run directory (path or fsspec URL)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args: argparse.Namespace) -> int:
    from goodtrace.cli import CommandError
    from goodtrace.read.sessions import NotARunError, read_run
    from goodtrace.read.validate import describe_skipped
    from goodtrace.record.io.storage import is_url
    from goodtrace.renderers.text import printable

    try:
        loaded = read_run(_mirrored(args.run) if is_url(args.run) else args.run)
    except NotARunError as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"cannot read {args.run!r}: {exc.strerror or exc}") from None
    rows = []
    for session in loaded.sessions:
        finish = session.finish
        host, pid = session.header.get("host"), session.header.get("pid")
        rows.append(
            {
                "attempt": session.attempt,
                "rank": session.rank,
                "host": host if isinstance(host, str) else None,
                "pid": pid if type(pid) is int else None,
                "session": session.session_id,
                "records": len(session.records),
                "segments": session.segments,
                "ended": "finished" if finish and finish.get("completed") is True else
                ("exited" if finish else "no finish record (crashed or still running)"),
            }
        )
    if args.json:
        print(json.dumps({"sessions": rows, "skipped": loaded.skipped, "problems": loaded.problems}, indent=2,
                         allow_nan=False))
        return 0
    for row in rows:
        print(
            f"attempt {row['attempt']}  rank {row['rank']:>5}  {printable(row['host'] or '?')}:{row['pid'] or '?'}  "
            f"{row['records']:>8} records in {row['segments']} segment(s)  {row['ended']}"
        )
    for problem in loaded.problems:
        print(f"warning: {printable(problem)}")
    bad = {reason: count for reason, count in loaded.skipped.items() if reason != "torn_last_line" and count}
    if bad:
        print(f"warning: in all, {describe_skipped(bad)}")
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
