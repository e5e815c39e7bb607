"""The ``goodtrace`` command line in one long-lived process, for the fuzz tests.

Reads one JSON array of arguments per line on stdin, runs ``goodtrace.cli.main`` on it exactly
as the ``goodtrace`` script does, and answers one JSON line: the exit status (``"traceback"``
when an exception escaped ``main``: what the script would print as a traceback), stdout and
stderr. Starting a process per command would cost the interpreter and DuckDB start-up each time;
a crash or a hang of this process is seen by the caller, which starts a new one.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import traceback

from goodtrace.cli import main as goodtrace_main


def serve() -> None:
    answer = sys.stdout
    for line in sys.stdin:
        argv = json.loads(line)
        out, err = io.StringIO(), io.StringIO()
        code: int | str
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = goodtrace_main(argv)
        except SystemExit as exc:  # argparse
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            err.write(traceback.format_exc())
            code = "traceback"
        answer.write(json.dumps({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()},
                                ensure_ascii=True) + "\n")
        answer.flush()


if __name__ == "__main__":
    serve()
