"""``goodtrace export RUN --to tensorboard DIR | mlflow [URI] | wandb [PROJECT]``: replay a run.

For runs recorded without sinks: the step table (one point per step execution; with
``--since``/``--until`` those whose interval overlaps the time range) and the job's summary (goodput,
every bucket, attempts), both from ``goodtrace.analysis.analyze``, written through the same
sink classes that record live. User errors are one-line ``CommandError``s.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from goodtrace.cli.time_range import add_range_arguments

if TYPE_CHECKING:
    from goodtrace.sinks import ScalarSink

HELP = "replay a recorded run into TensorBoard, MLflow or Weights & Biases (steps and summary)"

TARGETS = {
    "tensorboard": ("DIR", True),
    "mlflow": ("URI", False),
    "wandb": ("PROJECT", False),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run directory")
    parser.add_argument("--to", nargs="+", required=True, metavar="SINK",
                        help="tensorboard DIR | mlflow [TRACKING_URI] | wandb [PROJECT]")
    parser.add_argument("--job", type=int, metavar="N",
                        help="which job of a reused run directory (0 = the oldest; default the last)")
    add_range_arguments(parser)
    parser.add_argument("--name", help="the run's name in MLflow / W&B (default: the run directory's name)")
    parser.add_argument("--wandb-mode", choices=("online", "offline"),
                        help="W&B mode (default: W&B's own setting, WANDB_MODE)")
    parser.add_argument("--wandb-dir", metavar="DIR", help="where W&B keeps its files (default: W&B's own)")


def _sink(args: argparse.Namespace) -> ScalarSink:
    from goodtrace.cli import CommandError

    kind, *rest = args.to
    kind = kind.lower()
    if kind not in TARGETS:
        raise CommandError(f"--to {kind}: expected one of {', '.join(TARGETS)}")
    what, required = TARGETS[kind]
    if len(rest) > 1:
        raise CommandError(f"--to {kind} takes one {what}, got {' '.join(rest)}")
    if required and not rest:
        raise CommandError(f"--to {kind} needs a {what}")
    target = rest[0] if rest else None
    try:
        if kind == "tensorboard":
            from goodtrace.sinks.tensorboard import TensorBoardSink

            return TensorBoardSink(str(target))
        if kind == "mlflow":
            from goodtrace.sinks.mlflow import MlflowSink

            return MlflowSink(target, run_name=args.name)
        from goodtrace.sinks.wandb import WandbSink

        return WandbSink(target, mode=args.wandb_mode, dir=args.wandb_dir, name=args.name, use_active_run=False)
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    from goodtrace.cli import CommandError
    from goodtrace.cli.time_range import range_options

    try:
        time_range = range_options(args)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    sink = _sink(args)
    from goodtrace.cli.analysed import load_and_analyse
    from goodtrace.sinks import replay

    # read as ``report`` reads it (a path or a URL, torchtitan's logs, the progress bar, the
    # same errors); the step rows are the reference rank's, so no other rank's cut is kept
    _, analysis = load_and_analyse(args.run, job=args.job, keep_cuts=False, **time_range)
    kind = args.to[0].lower()
    try:
        rows = replay(analysis, sink)
    except ImportError as exc:
        raise CommandError(f"{exc.name or exc}: not installed (pip install 'goodtrace[{kind}]')") from None
    except Exception as exc:  # the backend refused (a bad URI, a full disk): one line, no traceback
        raise CommandError(f"export to {kind} failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    print(f"exported {rows} step rows and the summary of {args.run} to {' '.join(args.to)}")
    return 0
