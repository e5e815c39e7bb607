"""``goodtrace watch RUN``: a live view of a running run from its files (path or fsspec URL).

Every flush interval (the run's, from its headers; ``--interval`` to choose) it reads only the
bytes appended since the previous look and redraws: goodput so far, each rank's last step and
how long ago it was seen, hang and slowdown alarms, the worst recent steps. It ends when every
process it saw has finished (or on Ctrl-C); ``--once`` draws one frame and ends.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator

# A rank's present (last step, hang, finish) is read from the line of its last PRESENT_STEPS step
# completions, first; the step times before, for the slowdown alarm, a part a look after
PRESENT_STEPS = 64
HISTORY_S = 0.5  # the least a look spends on the ranks' step histories, while some are left
ONCE_HISTORY_S = 5.0  # ... and one of --once, which draws no frame until they are read
MAX_INTERVAL_S = 3600.0  # the longest wait between looks (a run's flush interval may be longer)
HELP = "a live view of a running run: goodput so far, each rank's last step, hangs, slowdowns"


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0.05 <= value <= MAX_INTERVAL_S:
        raise argparse.ArgumentTypeError(f"expected 0.05 to {MAX_INTERVAL_S:.0f} seconds, got {text!r}")
    return value


def _rows(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of rows, got {text!r}") from None
    if not 1 <= value <= 100_000:
        raise argparse.ArgumentTypeError(f"expected 1 to 100000 rows, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run directory (path or fsspec URL)")
    parser.add_argument("--interval", type=_seconds, default=None, metavar="S",
                        help="seconds between looks (default: the run's flush interval)")
    parser.add_argument("--once", action="store_true", help="draw one frame and end")
    parser.add_argument("--rows", type=_rows, default=None, metavar="N",
                        help="ranks shown in the table; with more, those that most need a look (default: 32)")


@contextlib.contextmanager
def _not_a_run() -> Iterator[None]:
    from goodtrace.cli import CommandError
    from goodtrace.read.segments import NotARunError

    try:
        yield
    except NotARunError as exc:
        raise CommandError(str(exc)) from None


class View:
    """What ``watch`` reads of a run and shows: the follower of its files and the view's state.
    Opened at the cost of the shown rank's history and every rank's tail, whatever the run's
    length (:meth:`goodtrace.analysis.watching.WatchState.reading_plan`); each :meth:`look` reads
    what is new, and a part of a long history at a time."""

    def __init__(self, run_dir: str, *, tail_steps: int | None = None, present_steps: int = 0,
                 poll_bytes: int | None = None) -> None:
        """``tail_steps``: the step completions read of a rank's tail (default: what the view
        shows, :data:`~goodtrace.analysis.watching.RECENT_STEPS`, and one), the last
        ``present_steps`` (default :data:`PRESENT_STEPS`) of them first; ``poll_bytes``: the most
        a look reads of one session (:data:`~goodtrace.read.follow.POLL_BYTES`)."""
        from goodtrace.analysis.watching import RECENT_STEPS, WatchState
        from goodtrace.cli.analysed import alive_here
        from goodtrace.read.follow import POLL_BYTES, RunFollower

        self.follower, self.state = RunFollower(run_dir, poll_bytes=poll_bytes or POLL_BYTES), WatchState()
        self.state.alive = alive_here  # a process of this host that is gone is lost at once, as in the report
        with _not_a_run():
            self.whole, tail = self.state.reading_plan(self.follower.first_headers())
        steps, present = tail_steps or RECENT_STEPS + 1, present_steps or PRESENT_STEPS
        self.follower.start_sessions(self.whole, tail, min(steps, present), history=max(0, steps - present))

    def look(self, history_s: float | None = HISTORY_S) -> float | None:
        """Read what is new, then the ranks' step times before their tails for about as long
        as that took, and at least ``history_s`` (None: one part of them); the run's flush
        interval once known. (A look at thousands of ranks on a network filesystem takes
        seconds: the histories are read for a while between frames, not a part a look.)"""
        follower, state = self.follower, self.state
        start = time.monotonic()
        with _not_a_run():
            for _, header, record in follower.poll():
                state.add(header, record)
        until = time.monotonic() + max(history_s or 0.0, time.monotonic() - start)
        while follower.has_history:  # a part at least
            for _, header, record in follower.poll_history():
                state.add_history(header, record)
            if history_s is None or time.monotonic() >= until:
                break
        for session in follower.histories_ended:
            state.end_history(session)
        follower.histories_ended.clear()
        state.reading, state.history = follower.behind(), follower.history_behind()
        state.note_problems(follower.problems)
        follower.problems.clear()
        # headers checked by the readers' rule: a config is a dict, its interval a finite number above 0
        known = [config["flush_interval_s"] for h in follower.headers.values()
                 if "flush_interval_s" in (config := h.get("config") or {})]
        return min(min(known), MAX_INTERVAL_S) if known else None


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from goodtrace.cli import warn
    from goodtrace.cli.progress import progress_bar
    from goodtrace.renderers.watch import MAX_ROWS, render_watch

    view = View(args.run)
    console, rows = Console(), args.rows or MAX_ROWS
    if args.once:
        update, stop = progress_bar()
        try:
            view.look(ONCE_HISTORY_S)
            while view.follower.pending:
                if update is not None:
                    update("reading the history", round(1000 * view.state.read_so_far()), 1000)
                view.look(ONCE_HISTORY_S)
        finally:
            stop()
        console.print(render_watch(view.state, time.time_ns(), args.run, rows))
        for problem in view.state.problems:
            warn(args.command, problem)
        if view.state.problem_count > len(view.state.problems):
            warn(args.command, f"{view.state.problem_count - len(view.state.problems)} more problems (not listed)")
        return 0
    interval = view.look()
    every = args.interval or interval or 1.0
    try:
        with Live(render_watch(view.state, time.time_ns(), args.run, rows), console=console, auto_refresh=False) as live:
            while True:
                view.look()
                live.update(render_watch(view.state, time.time_ns(), args.run, rows), refresh=True)
                ranks = view.state.ranks()
                if ranks and all(r.finished for r in ranks) and not view.follower.pending:
                    return 0
                if not view.follower.pending:  # a long history is read a part between frames, without a pause
                    time.sleep(every)
    except KeyboardInterrupt:
        return 0
