"""``goodtrace demo``: train a small GPT on CPU ranks with a crash and a restart, then report.

Thin: options are validated into :class:`goodtrace.demo.launcher.DemoConfig`, the launcher
runs the job, and the report, HTML report and Perfetto trace are written into the run
directory by the ``report`` and ``trace`` subcommands (each skipped, saying so, where that
subcommand is not installed).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

HELP = "train a small GPT on 2 CPU ranks with a checkpoint, an eval, a crash and a restart, then report"


def _crash_at(text: str) -> int | None:
    if text.strip().lower() in ("none", "no", "off", ""):
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a step number or 'none', got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", type=int, default=2, help="number of CPU ranks (default 2)")
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps in total (default 200)")
    parser.add_argument("--crash-at", type=_crash_at, default=140, metavar="STEP",
                        help="the last rank dies after this step in the first attempt; 'none' for no crash (default 140)")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="run directory (default: a new goodtrace-demo/run-<time> in the current directory)")
    parser.add_argument("--checkpoint-every", type=int, default=25, metavar="N", help="default 25")
    parser.add_argument("--eval-every", type=int, default=40, metavar="N", help="default 40")
    parser.add_argument("--log-every", type=int, default=20, metavar="N", help="live line every N steps (default 20)")
    parser.add_argument("--workers", type=int, default=1, metavar="N", help="DataLoader worker processes (default 1)")


def _has(name: str, option: str | None = None) -> bool:
    """Whether subcommand ``name`` is installed (and accepts ``option``)."""
    if importlib.util.find_spec(f"goodtrace.cli.commands.{name}") is None:
        return False
    if option is None:
        return True
    module = importlib.import_module(f"goodtrace.cli.commands.{name}")
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return option in parser._option_string_actions  # argparse has no public lookup


def _subcommand(name: str, arguments: list[str], option: str | None = None) -> subprocess.CompletedProcess[str] | None:
    """Run ``goodtrace NAME ...`` in a fresh interpreter; None when it is not installed."""
    if not _has(name, option):
        return None
    return subprocess.run([sys.executable, "-m", "goodtrace", name, *arguments], capture_output=True, text=True,
                          check=False)


def run(args: argparse.Namespace) -> int:
    from goodtrace.cli import CommandError

    if importlib.util.find_spec("torch") is None:
        raise CommandError("the demo needs PyTorch: pip install 'goodtrace[demo]'")
    from goodtrace.demo.launcher import DemoConfig, launch

    run_dir: Path = args.out if args.out is not None else Path("goodtrace-demo") / time.strftime("run-%Y%m%d-%H%M%S")
    if run_dir.exists() and any(run_dir.iterdir()):
        raise CommandError(f"{run_dir} is not empty; pass --out with a new directory (a run directory holds one job)")
    try:
        config = DemoConfig(
            run_dir=run_dir, ranks=args.ranks, steps=args.steps, crash_at=args.crash_at,
            checkpoint_every=args.checkpoint_every, eval_every=args.eval_every, log_every=args.log_every,
            workers=args.workers,
        )
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    run_dir.mkdir(parents=True, exist_ok=True)
    crash = f", crash after step {config.crash_at}" if config.crash_at is not None else ""
    print(f"goodtrace demo: {config.ranks} ranks, {config.steps} steps, checkpoint every "
          f"{config.checkpoint_every}, eval every {config.eval_every}{crash}; run directory {run_dir}", flush=True)
    started = time.monotonic()
    results = launch(config, echo=lambda text: print(text, flush=True))
    print(f"training finished in {time.monotonic() - started:.1f} s over {len(results)} attempt(s)", flush=True)
    if not results[-1].ok:
        raise CommandError(f"the demo job failed in every attempt; see the logs in {run_dir / 'logs'}")
    return _write_outputs(run_dir)


def _write_outputs(run_dir: Path) -> int:
    written: list[tuple[str, Path | None, str]] = []
    report_txt, report_html, trace_json = run_dir / "report.txt", run_dir / "report.html", run_dir / "trace.json"
    console = _subcommand("report", [str(run_dir)])
    if console is None:
        written.append(("console report", None, "not available yet: goodtrace.cli.commands.report is not installed"))
    elif console.returncode != 0:
        written.append(("console report", None, f"failed: {console.stderr.strip()[-500:]}"))
    else:
        report_txt.write_text(console.stdout, encoding="utf-8")
        print()
        print(console.stdout, end="" if console.stdout.endswith("\n") else "\n")
        written.append(("console report", report_txt, ""))
    html = _subcommand("report", [str(run_dir), "--html", str(report_html)], option="--html")
    if html is None:
        written.append(("HTML report", None, "not available yet: 'goodtrace report' has no --html option"))
    elif html.returncode != 0 or not report_html.exists():
        written.append(("HTML report", None, f"failed: {html.stderr.strip()[-500:]}"))
    else:
        written.append(("HTML report", report_html, ""))
    trace = _subcommand("trace", [str(run_dir), "-o", str(trace_json)])
    if trace is None:
        written.append(("Perfetto trace", None, "not available yet: goodtrace.cli.commands.trace is not installed"))
    elif trace.returncode != 0 or not trace_json.exists():
        written.append(("Perfetto trace", None, f"failed: {trace.stderr.strip()[-500:]}"))
    else:
        written.append(("Perfetto trace", trace_json, ""))
    print()
    for label, path, why in written:
        print(f"{label + ':':16} {path if path is not None else why}")
    return 0
