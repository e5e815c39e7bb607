"""The ``goodtrace`` command line run in this process: :func:`goodtrace` calls
``goodtrace.cli.main(argv)`` as the ``goodtrace`` script does and answers what a subprocess
would: the exit status, stdout and stderr.

A fresh interpreter per command costs its start-up (numpy, DuckDB, rich imported each time:
about a second here); the behaviour tested is the command's, so the tests call it here and only
a few start the real entry point (tests/cli/test_entry_point.py). What one run could leave behind
for the next is put back after each: the environment (``COLUMNS``, ``GOODTRACE_*``), the working
directory, ``sys.argv`` and the standard streams, the warnings filters and ``showwarning`` (the
CLI replaces it with its own), the root logger's handlers and level, and the signal handlers;
fsspec's cached filesystems (an S3 one keeps the endpoint and credentials of the environment it
was made in) are dropped before and after, so each command makes its own, as a process does.

The streams are what a pipe gives a process: UTF-8 with the error handlers this interpreter's
own stdout and stderr have (a child started beside it gets the same: ``surrogateescape`` and
``backslashreplace`` under a UTF-8 locale, so a lone surrogate goes no further than in a real
process), neither is a terminal, and stdin is empty unless ``stdin`` is given. An exception that escapes ``main`` is
printed as the interpreter prints it (``Traceback ...`` on stderr, exit status 1), and
``SystemExit`` (argparse's errors, ``--help``) ends the run with its code.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import sys
import traceback
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from goodtrace.cli import main

# What the tests' commands ran with as subprocesses: a fixed width, no progress bar.
DEFAULT_ENV = {"COLUMNS": "120", "GOODTRACE_PROGRESS": "0"}
_SIGNALS = [getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGPIPE", "SIGWINCH", "SIGALRM",
                                               "SIGUSR1", "SIGUSR2", "SIGCHLD") if hasattr(signal, name)]


# The error handlers of this process's own streams (pytest replaces sys.stdout, not these).
_ERRORS = {name: getattr(getattr(sys, f"__{name}__", None), "errors", None) or default
           for name, default in (("stdout", "strict"), ("stderr", "backslashreplace"))}


class Ran(NamedTuple):
    """One command's outcome, named as ``subprocess.CompletedProcess`` names it."""

    returncode: int
    stdout: str
    stderr: str


class _Pipe(io.TextIOWrapper):
    """A text stream over bytes, as a process's redirected stdout or stderr."""

    def __init__(self, errors: str) -> None:
        super().__init__(io.BytesIO(), encoding="utf-8", errors=errors, newline=None, write_through=True)

    def text(self) -> str:
        self.flush()
        raw = self.buffer
        assert isinstance(raw, io.BytesIO)
        return raw.getvalue().decode("utf-8")  # strictly, as subprocess.run(text=True) reads a pipe


def _exit_status(exc: SystemExit, err: _Pipe) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=err)  # sys.exit("message"): the interpreter prints it and exits 1
    return 1


def _forget_filesystems() -> None:
    spec = sys.modules.get("fsspec.spec")
    if spec is None:
        return
    classes = [spec.AbstractFileSystem]
    while classes:
        cls = classes.pop()
        cls.clear_instance_cache()
        classes.extend(cls.__subclasses__())


def goodtrace(*args: str | os.PathLike[str], env: Mapping[str, str | None] | None = None,
              cwd: str | os.PathLike[str] | None = None, stdin: str = "") -> Ran:
    """``goodtrace ARGS`` in this process. ``env``: variables set for the run over
    :data:`DEFAULT_ENV` and this process's environment (``None`` removes one); ``cwd``: the
    working directory it runs in; ``stdin``: what it reads there."""
    argv = [os.fspath(a) for a in args]
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_streams = sys.stdin, sys.stdout, sys.stderr
    saved_argv = sys.argv
    saved_signals = {number: signal.getsignal(number) for number in _SIGNALS}
    root = logging.getLogger()
    saved_logging = root.level, list(root.handlers), logging.root.manager.disable
    out, err = _Pipe(_ERRORS["stdout"]), _Pipe(_ERRORS["stderr"])
    code: int
    try:
        for name, value in {**DEFAULT_ENV, **(env or {})}.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if cwd is not None:
            os.chdir(Path(cwd))
        sys.argv = ["goodtrace", *argv]
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode("utf-8")), encoding="utf-8")
        sys.stdout, sys.stderr = out, err
        _forget_filesystems()
        with warnings.catch_warnings():
            try:
                code = main(argv)
            except SystemExit as exc:
                code = _exit_status(exc, err)
            except BaseException:  # what the interpreter does with an uncaught exception
                err.write(traceback.format_exc())
                code = 1
            for stream in (out, err):
                try:
                    stream.flush()
                except (OSError, ValueError, UnicodeError):
                    pass
    finally:
        _forget_filesystems()
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for number, handler in saved_signals.items():
            if handler is not None:
                signal.signal(number, handler)
        root.setLevel(saved_logging[0])
        root.handlers[:] = saved_logging[1]
        logging.disable(saved_logging[2])
    return Ran(code, out.text(), err.text())
