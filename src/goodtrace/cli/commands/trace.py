"""``goodtrace trace RUN [-o FILE]``: a Perfetto/Chrome trace of a run (``.json`` or ``.json.gz``;
default ``RUN_NAME.trace.json.gz`` in the current directory).

Every rank is a process, every thread a track, step intervals with their overhead split on a
track of their own; ``--steps`` (or ``--since``/``--until``), ``--ranks`` and ``--attempt`` select a
slice. Without ``--steps`` or ``--since``/``--until``, a run whose whole trace would be past
``--limit-mb`` (1,200 MB of JSON; the Perfetto UI opens about 300) is written as the steps
around its slowest step, about 240 MB of them, and the command says so. Open the file at
https://ui.perfetto.dev (it stays in the browser) or in ``chrome://tracing``.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from goodtrace.cli.time_range import add_range_arguments
from goodtrace.record.live.line import format_bytes

HELP = "write a Perfetto/Chrome trace of all ranks (open it in ui.perfetto.dev)"
LIMIT_MB = 1_200.0  # past this a whole-run trace is written as a slice (unless --limit-mb 0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run directory (path or fsspec URL), or a directory of torchtitan's structured logs")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="trace file to write: .json, or .json.gz for a compressed one "
                             "(default: RUN_NAME.trace.json.gz in the current directory)")
    parser.add_argument("--steps", metavar="A:B",
                        help="only steps A to B, both included (also A:, :B, or one step A)")
    add_range_arguments(parser)
    parser.add_argument("--ranks", metavar="LIST", help="only these ranks, e.g. 0,3,8-15")
    parser.add_argument("--attempt", type=int, metavar="K", help="only attempt K (0 = the first launch)")
    parser.add_argument("--job", type=int, metavar="N",
                        help="which job of a reused run directory (0 = the oldest; default the last)")
    parser.add_argument("--limit-mb", type=float, default=LIMIT_MB, metavar="MB",
                        help="without --steps or --since/--until, write the steps around the slowest one "
                             "when the whole run would make a trace of more than MB megabytes of JSON "
                             f"(default {LIMIT_MB:,.0f}: the Perfetto UI opens about 300); 0: every step always")


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from goodtrace.cli import CommandError, warn
    from goodtrace.cli.analysed import load_and_analyse
    from goodtrace.cli.progress import progress_bar
    from goodtrace.cli.ranges import format_ranks, parse_ranks, parse_steps
    from goodtrace.cli.time_range import range_options
    from goodtrace.renderers.perfetto import PerfettoRenderer, Selection

    try:
        selection = Selection(
            steps=parse_steps(args.steps) if args.steps else None,
            ranks=parse_ranks(args.ranks) if args.ranks else None,
            attempt=args.attempt,
        )
        time_range = range_options(args)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    if time_range and args.steps:
        raise CommandError("--steps and --since/--until both choose the steps of the trace: give one")
    # One derivation: the steps track is the analysis's; the spans are read for the slice only.
    loaded, analysis = load_and_analyse(args.run, job=args.job, **time_range)
    output = args.output or default_output(args.run)
    if time_range:  # the steps whose executions overlap the time range, on every rank
        steps = analysis.steps.intervals().steps
        if not len(steps):
            raise CommandError("no step execution overlaps --since/--until: the trace would be empty")
        selection = dataclasses.replace(selection, steps=(int(steps.min()), int(steps.max())))
    if args.limit_mb < 0 or not math.isfinite(args.limit_mb):
        raise CommandError(f"--limit-mb must be 0 or more, got {args.limit_mb}")
    if not args.steps and not time_range and args.limit_mb:
        selection = _slice_when_too_big(selection, analysis, args.limit_mb * 1e6)
    if args.steps and selection.steps is not None:
        _check_steps(args.steps, selection.steps, analysis)
    if args.attempt is not None and args.attempt not in analysis.attempts_by_index():
        raise CommandError(f"the run has no attempt {args.attempt} (it has {sorted(analysis.attempts_by_index())})")
    ranks = {analysis.sessions[i].rank for i in analysis.cuts}
    if selection.ranks is not None and not ranks & selection.ranks:
        raise CommandError(f"the run has no rank in {args.ranks!r} (it has ranks {format_ranks(ranks)})")
    renderer = PerfettoRenderer(selection)
    update, stop = progress_bar()
    try:
        summary = renderer.write(analysis, loaded, output, update)
    except OSError as exc:
        raise CommandError(f"cannot write {output}: {exc}") from None
    finally:
        stop()
    for problem in loaded.warnings:
        warn(args.command, problem)
    if summary.processes == 0:
        warn(args.command, "the selection matched no rank with records; the trace is empty")
    if summary.warning:
        warn(args.command, summary.warning)
    print(
        f"wrote {summary.path}: {summary.processes} rank(s), {summary.spans} spans, "
        f"{summary.events} events, {format_bytes(summary.bytes_written)}"
    )
    return 0


def _slice_when_too_big(selection: Any, analysis: Any, limit_bytes: float) -> Any:
    """The selection, or the steps around the slowest step when the whole selection would
    make a trace past ``limit_bytes`` (estimated from its sessions' records, before reading
    any): so many steps that the slice is about 80% of the limit or of what the Perfetto UI
    opens, the smaller. Says so."""
    import dataclasses

    from goodtrace.analysis.selection import RANGE_STEPS, choose_range
    from goodtrace.renderers.trace_events import COMFORTABLE_TRACE_BYTES, TRACE_BYTES_PER_RECORD

    estimate = sum(analysis.sessions[i].records for i in selection.sessions(analysis)) * TRACE_BYTES_PER_RECORD
    steps = len(analysis.steps)
    if estimate <= limit_bytes or steps <= RANGE_STEPS:
        return selection
    target = 0.8 * min(limit_bytes, COMFORTABLE_TRACE_BYTES)  # under what the UI opens, with room
    width = max(RANGE_STEPS, int(steps * target / estimate))
    chosen = choose_range(analysis, None, selection.attempt, width=width)
    if chosen is None:
        return selection
    _, first, last = chosen
    print(f"note: every step would make a trace of about {estimate / 1e6:,.0f} MB of JSON, past --limit-mb "
          f"{limit_bytes / 1e6:g} (the Perfetto UI opens about {COMFORTABLE_TRACE_BYTES / 1e6:.0f} MB): "
          f"writing steps {first}:{last}, the {width:,} steps "
          "around the slowest one. Choose others with --steps A:B or --since/--until, or every step with "
          "--limit-mb 0.", file=sys.stderr)
    return dataclasses.replace(selection, steps=(first, last))


def default_output(run: str) -> str:
    """``NAME.trace.json.gz`` in the current directory, NAME the run's last path component."""
    name = run.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1].split("://")[-1]
    return f"{name if name and name not in ('.', '..') else 'run'}.trace.json.gz"


def _check_steps(text: str, steps: tuple[int | None, int | None], analysis: Any) -> None:
    """``--steps`` that names no step of the run is an error, like ``--ranks`` naming no rank."""
    from goodtrace.cli import CommandError

    executed = [steps_ for steps_ in analysis.executed_steps.values() if len(steps_)]  # sorted, per attempt
    if not executed:
        return
    first, last = steps
    low, high = min(int(s[0]) for s in executed), max(int(s[-1]) for s in executed)
    if (first is not None and first > high) or (last is not None and last < low):
        raise CommandError(f"the run has no step in {text!r} (its steps run from {low} to {high})")
