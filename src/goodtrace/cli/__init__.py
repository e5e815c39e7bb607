"""The ``goodtrace`` command line: a thin dispatcher over ``goodtrace.cli.commands.<name>``.

Each subcommand is a module in ``goodtrace/cli/commands`` exposing ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``. Modules are imported only when their
subcommand runs, so ``goodtrace --help`` stays fast and needs no optional dependency.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import warnings
from collections.abc import Sequence
from typing import TextIO

from goodtrace.cli import commands


class CommandError(Exception):
    """A user-facing error: printed as one line (control characters escaped), exit status 2.
    No traceback."""


def _command_names() -> list[str]:
    return sorted(
        info.name for info in pkgutil.iter_modules(commands.__path__) if not info.name.startswith("_")
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="goodtrace", description="Where did the time of my training job go?"
    )
    parser.add_argument("--version", action="version", version=f"goodtrace {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _command_names():
        module = importlib.import_module(f"goodtrace.cli.commands.{name}")
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(_module=module)
    return parser


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("goodtrace")
    except Exception:
        return "unknown"


def warn(command: str, text: object, file: TextIO | None = None) -> None:
    """One warning of the command ``command`` as its line on stderr: ``goodtrace report:
    warning: ...`` (one line, control characters escaped), as its errors are."""
    from goodtrace.renderers.text import one_line

    try:
        print(f"goodtrace {command}: warning: {one_line(text).removeprefix('goodtrace: ')}", file=file or sys.stderr)
    except OSError:  # stderr gone: as Python's own showwarning, nothing to say it on
        pass


def _show_warnings(command: str) -> None:
    """goodtrace's own warnings as the command's lines (:func:`warn`), not Python's form (the
    module's path and line, then the source line that issued it); any other warning as Python
    shows it."""
    from goodtrace.record.errors import GoodtraceWarning

    default = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: TextIO | None = None, line: str | None = None) -> None:
        if not issubclass(category, GoodtraceWarning):
            default(message, category, filename, lineno, file, line)
            return
        warn(command, message, file)

    warnings.showwarning = show


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    _show_warnings(args.command)
    try:
        return int(args._module.run(args) or 0)
    except CommandError as exc:
        from goodtrace.renderers.text import one_line

        print(f"goodtrace {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0

