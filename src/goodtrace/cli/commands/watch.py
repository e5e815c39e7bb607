"""``goodtrace watch RUN``: a live view of a running run from its files (path or fsspec URL).

Every flush interval (the run's, from its headers; ``--interval`` to choose) it reads only the
bytes appended since the previous look and redraws: goodput so far, each rank's last step and
how long ago it was seen, hang and slowdown alarms, the worst recent steps. It ends when every
process it saw has finished (or on Ctrl-C); ``--once`` draws one frame and ends.
"""

from __future__ import annotations

import argparse
import time

HELP = "a live view of a running run: goodput so far, each rank's last step, hangs, slowdowns"


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0.05 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"expected 0.05 to 3600 seconds, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run directory (path or fsspec URL)")
    parser.add_argument("--interval", type=_seconds, default=None, metavar="S",
                        help="seconds between looks (default: the run's flush interval)")
    parser.add_argument("--once", action="store_true", help="draw one frame and end")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from goodtrace.analysis.watching import WatchState
    from goodtrace.cli import CommandError
    from goodtrace.read.follow import RunFollower
    from goodtrace.read.segments import NotARunError
    from goodtrace.renderers.watch import render_watch

    follower, state = RunFollower(args.run), WatchState()

    def look() -> float | None:
        """Read what is new; the run's flush interval once known."""
        try:
            for _, header, record in follower.poll():
                state.add(header, record)
        except NotARunError as exc:
            raise CommandError(str(exc)) from None
        intervals = [h.get("config", {}).get("flush_interval_s") for h in follower.headers.values()]
        known = [i for i in intervals if isinstance(i, (int, float)) and i > 0]
        return min(known) if known else None

    interval = look() or 1.0
    console = Console()
    if args.once:
        console.print(render_watch(state, time.time_ns(), args.run))
        return 0
    every = args.interval or interval
    try:
        with Live(render_watch(state, time.time_ns(), args.run), console=console, auto_refresh=False) as live:
            while True:
                look()
                live.update(render_watch(state, time.time_ns(), args.run), refresh=True)
                ranks = state.ranks()
                if ranks and all(r.finished for r in ranks):
                    return 0
                time.sleep(every)
    except KeyboardInterrupt:
        return 0
