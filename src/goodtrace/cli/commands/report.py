"""``goodtrace report RUN``: where the time of a job went (console, or ``--json``).

Loads the run with the DuckDB reader (a progress bar on a terminal), analyses it with
``goodtrace.analysis.analyze`` and renders it. User errors (not a run, a bad window, an
unknown accelerator) are one-line ``CommandError``s, never tracebacks.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any

from goodtrace.cli.time_range import (
    add_range_arguments,
    parse_duration,
    parse_window,
    range_options,
)

__all__ = ["HELP", "ReportError", "add_analysis_arguments", "add_arguments", "add_workers_argument", "analysed",
           "arguments", "parse_duration", "parse_window", "report", "run"]
from goodtrace.record.live.line import format_bytes

HELP = "goodput report of a run: buckets, attempts, step times, slowest steps, ranks (--json)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run directory (path or fsspec URL), or a directory of torchtitan's structured logs")
    parser.add_argument("--json", action="store_true", help="print the analysis as one JSON object")
    parser.add_argument("--brief", action="store_true",
                        help="a few lines: goodput, the verdict and the three largest losses")
    parser.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report to FILE")
    parser.add_argument("--gantt-steps", metavar="A:B",
                        help="--html: the gantt chart shows steps A to B, both included (also A:, :B or one "
                             "step A; default: 20 steps around the slowest step)")
    parser.add_argument("--window", metavar="A:B|D",
                        help="interval goodput for seconds A to B from the job start (negative: from "
                             "the end), or the last duration D (e.g. 1h)")
    parser.add_argument("--rolling", metavar="D", help="goodput over consecutive periods of duration D")
    add_range_arguments(parser)
    parser.add_argument("--every", metavar="D",
                        help="goodput over time per period D, aligned to the UTC clock (default: the one of 1s, 2s, 5s, "
                             "... 1m ... 1h ... 1d that cuts the run into 10 to 30 periods)")
    add_analysis_arguments(parser)
    parser.add_argument("--top", type=int, default=10, metavar="N",
                        help="how many slowest steps (and anomalies) the console report lists (the JSON: "
                             "10, and every step in its step table)")
    parser.add_argument("--no-steps", action="store_true", help="--json: leave out the full step table")
    add_workers_argument(parser)
    parser.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                        help="read the rank files as Ray tasks (pip install 'goodtrace[ray]'): without ADDRESS "
                             "on a local Ray started for the report, 'auto' on the cluster the environment names; "
                             "a path must be the same on every node; a URL is fetched by each task")


def add_analysis_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that choose how a run is analysed (the job, the ideal step, the data rule and
    MFU's inputs): ``report``'s, and each side's of ``diff``."""
    parser.add_argument("--job", type=int, metavar="N",
                        help="which job of a reused run directory (0 = the oldest; default the last)")
    parser.add_argument("--ideal-step", type=float, metavar="S", help="ideal step time in seconds")
    parser.add_argument("--data-rule", choices=("asynchronous", "synchronous"),
                        help="override how in-step data loading counts: all productive or all lost (default: "
                             "lost only where the device had run out of queued work)")
    parser.add_argument("--flops-per-step", type=float, metavar="F",
                        help="model FLOPs of one optimizer step, all devices together (for MFU)")
    parser.add_argument("--accelerator", metavar="NAME",
                        help="peak FLOP/s from the table: a100, h100, h200, b200, mi300x, tpu-v4, tpu-v5e, "
                             "tpu-v5p, tpu-v6e")
    parser.add_argument("--peak-tflops", type=float, metavar="T", help="peak TFLOP/s of one device (overrides)")
    parser.add_argument("--devices-per-rank", type=int, default=1, metavar="N",
                        help="accelerators each rank drives (for MFU: peak FLOP/s x devices x ranks; default 1)")


def add_workers_argument(parser: argparse.ArgumentParser) -> None:
    """``--workers``: how many local processes read the rank files (``report``, ``diff``)."""
    from goodtrace.read.engine import POOL_MIN_BYTES

    parser.add_argument("--workers", type=int, metavar="N",
                        help="local processes that read the rank files (default: one per core for a run of "
                             f"{POOL_MIN_BYTES // 2**20} MiB or more to read, else 1, or GOODTRACE_WORKERS; 1 reads "
                             "in this process)")


def run(args: argparse.Namespace) -> int:
    analysis = analysed(args)
    if args.json:
        from goodtrace.renderers.json_report import write_json

        write_json(analysis, sys.stdout, include_steps=not args.no_steps)  # the step table row by row
        print()
        return 0
    from rich.console import Console

    width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "120"))
    console = Console(width=width, highlight=False)
    if args.brief:
        from goodtrace.renderers.console import render_brief

        render_brief(analysis, console)
        return 0
    from goodtrace.renderers.console import render_console

    render_console(analysis, console, top=args.top)
    return 0


def analysed(args: argparse.Namespace, *, tune_process: bool = True) -> Any:
    """The analysis ``report`` shows for its parsed arguments (the HTML report written when
    ``--html`` asks for it): the one path from the options to the numbers, which the command,
    ``goodtrace diff`` and :func:`goodtrace.report` take. ``tune_process``: see
    :func:`goodtrace.cli.analysed.load_and_analyse`."""
    from goodtrace.cli import CommandError
    if getattr(args, "brief", False) and args.json:
        raise CommandError("--brief prints a few lines for people and --json the whole analysis: give one")
    try:
        window = parse_window(args.window) if args.window else None
        time_range = range_options(args)
        rolling = parse_duration(args.rolling) if args.rolling else None
        every = parse_duration(args.every) if args.every else None
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    if rolling is not None and rolling <= 0:
        raise CommandError("--rolling must be a positive duration")
    if every is not None and every <= 0:
        raise CommandError("--every must be a positive duration")
    if window is not None and time_range:
        raise CommandError("--window gives the buckets of one window and --since/--until select a time range "
                           "(with those buckets): give one or the other")
    gantt_steps = None
    if args.gantt_steps is not None:
        from goodtrace.cli.ranges import parse_steps

        if not args.html:
            raise CommandError("--gantt-steps chooses the steps of the HTML report's gantt chart: add --html FILE")
        try:
            gantt_steps = parse_steps(args.gantt_steps)
        except ValueError as exc:
            raise CommandError(f"--gantt-steps: {exc}") from None
    from goodtrace.cli.analysed import load_and_analyse

    for label, value in (("--flops-per-step", args.flops_per_step), ("--peak-tflops", args.peak_tflops),
                         ("--ideal-step", args.ideal_step)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise CommandError(f"{label} must be a positive number, got {value}")
    if args.top < 0:
        raise CommandError(f"--top must be 0 or more, got {args.top}")
    if args.devices_per_rank < 1:
        raise CommandError(f"--devices-per-rank must be at least 1, got {args.devices_per_rank}")
    from goodtrace.read.engine import Engine

    try:
        engine = Engine(workers=args.workers, ray=args.ray)
    except ValueError as exc:
        raise CommandError(f"--workers/--ray: {exc}") from None
    if args.workers is not None and args.ray is not None:
        raise CommandError("--workers and --ray choose where the run is read: give one")
    loaded, analysis = load_and_analyse(
        args.run,
        engine=engine,
        tune_process=tune_process,
        window=window,
        rolling_s=rolling,
        job=args.job,
        ideal_step_s=args.ideal_step,
        data_rule=args.data_rule,
        flops_per_step=args.flops_per_step,
        peak_flops=None if args.peak_tflops is None else args.peak_tflops * 1e12,
        accelerator=args.accelerator,
        devices_per_rank=args.devices_per_rank,
        every_s=every,
        keep_cuts=bool(args.html),  # the gantt chart draws every rank's cut; the numbers need none kept
        **time_range,
    )
    if args.html:
        _write_html(loaded, analysis, args.html, gantt_steps)
    return analysis


# options of the command that choose only how its output is written, not the analysis
_OUTPUT_ONLY = {
    "json": "the analysis's to_dict() is the JSON object",
    "no_steps": "to_dict(include_steps=False) leaves out the step table",
    "top": "slowest_steps(n) gives the n slowest",
    "brief": "the analysis's verdict and partition are what the brief report shows",
}


class ReportError(ValueError):
    """What :func:`goodtrace.report` raises where ``goodtrace report`` prints an error: a run
    that cannot be read, a bad option value (the message is the command's one line)."""


def report(path: str | os.PathLike[str], **options: Any) -> Any:
    """``goodtrace report PATH --OPTION VALUE ...`` in Python: the analysis (a
    :class:`goodtrace.analysis.RunAnalysis`) whose ``to_dict()`` is what ``--json`` prints.
    ``options`` are the command's options as keyword arguments, named as its long options with
    ``_`` for ``-`` (``since="step:100"``, ``every="10m"``, ``flops_per_step=1e15``,
    ``accelerator="h100"``, ``html="report.html"``, ...); a duration may be given as a number
    of seconds. Options that shape only the printed output (``json``, ``no_steps``, ``top``,
    ``brief``) are refused: the object holds all of it. Raises :class:`ReportError` where the
    command would print an error, ``TypeError`` for an option it does not have."""
    from goodtrace.cli import CommandError

    parser = _parser()
    args = parser.parse_args(["--", os.fspath(path)])
    actions = {action.dest: action for action in parser._actions}
    for name, value in options.items():
        action = actions.get(name)
        if name in _OUTPUT_ONLY:
            raise TypeError(f"report() has no option {name!r}: it shapes only the command's output "
                            f"({_OUTPUT_ONLY[name]})")
        if action is None or name in ("help", "run"):
            raise TypeError(f"report() got an unexpected keyword argument {name!r}")
        setattr(args, name, _option_value(name, value, action))
    try:
        return analysed(args, tune_process=False)
    except CommandError as exc:
        raise ReportError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="goodtrace report")
    add_arguments(parser)
    return parser


def arguments(path: str | os.PathLike[str], **values: Any) -> argparse.Namespace:
    """``report``'s parsed arguments for ``path``: its defaults, then ``values`` (each an
    option's value as argparse makes it)."""
    args = _parser().parse_args(["--", os.fspath(path)])
    for name, value in values.items():
        if not hasattr(args, name):
            raise TypeError(f"report has no option {name!r}")
        setattr(args, name, value)
    return args


def _option_value(name: str, value: Any, action: argparse.Action) -> Any:
    """``value`` for option ``name`` as argparse would have made it from its text."""
    if value is None:
        return action.default
    if isinstance(action, argparse._StoreTrueAction):
        return bool(value)
    kind: Any = action.type or str
    if kind is str:
        if name == "ray" and value is True:
            return action.const  # --ray alone: a local Ray
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = f"{value:g}" if isinstance(value, float) else str(value)  # seconds
        if not isinstance(value, str):
            raise TypeError(f"report() option {name!r} takes a string, got {type(value).__name__}")
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"report() option {name!r} takes a number, got {type(value).__name__}")
    else:
        if kind is int and not (math.isfinite(value) and value == int(value)):
            raise ReportError(f"--{name.replace('_', '-')} takes a whole number, got {value}")
        value = kind(value)
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(repr, action.choices))
        raise ReportError(f"--{name.replace('_', '-')}: {value!r} is not one of {choices}")
    return value


def _write_html(loaded: Any, analysis: Any, target: str, gantt_steps: tuple[int | None, int | None] | None) -> None:
    """The HTML report: drawn from the analysis; the gantt chart's spans read for its steps only."""
    from goodtrace.cli import CommandError, warn
    from goodtrace.cli.progress import progress_bar

    try:
        from goodtrace.renderers.html import html_page, report_data
    except ImportError as exc:
        raise CommandError(f"the HTML renderer is not available: {exc}") from None
    update, stop = progress_bar()
    try:
        data = report_data(analysis, loaded, gantt_steps=gantt_steps, progress=update)
    finally:
        stop()
    if gantt_steps is not None and data["gantt"] is None:
        first, last = ("" if v is None else v for v in gantt_steps)
        warn("report", f"--gantt-steps {first}:{last} holds no step of the run; the report has no gantt chart")
    page = html_page(data)
    try:
        with open(target, "w", encoding="utf-8") as handle:
            handle.write(page)
    except OSError as exc:
        raise CommandError(f"cannot write {target}: {exc}") from None
    print(f"wrote {target} ({format_bytes(len(page.encode()))})", file=sys.stderr)
