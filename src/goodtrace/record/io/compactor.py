"""The rank's own compactor (optional, off by default): a process that reduces the session's
closed segments for reports while the job runs (``Config.compact_interval_s``).

The recorder starts it when it opens a session on a local or NFS run directory and the
reader's extra is installed, as a fresh interpreter (``goodtrace.read.rank_compact`` run as
``python -m`` runs it, not :mod:`multiprocessing`: nothing of the training program runs in it),
at the lowest CPU priority (nice 19 and, where the OS has it, ``SCHED_IDLE``: set before anything
is imported), ignoring SIGINT (a Ctrl-C of the job does not cut its last pass).
The job never waits for it: its standard input is a pipe whose end the recorder closes at
``finish()`` (or the kernel closes when the process dies), after which it reads the session's
files a last time and exits. Starting it is the only thing done here; what it does is
:mod:`goodtrace.read.rank_compact`'s.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable

from goodtrace.record.io.storage import is_url, local_path
from goodtrace.record.process import python_path

__all__ = ["Compactor", "start_compactor"]

COMPACTOR_MODULE = "goodtrace.read.rank_compact"
# The lowest CPU priority first, before the reader's imports (a preexec_fn would be unsafe in a
# process with threads); then the module runs as ``python -m`` would run it.
# SCHED_IDLE where the OS has it: it runs only on a core nothing else wants. A Ctrl-C of the
# job does not cut its last pass (it is in the job's process group, and so in its scheduling
# group: a session of its own would be a group of its own where the kernel groups by session,
# sched_autogroup, and get a fair share of the machine beside the whole job whatever its nice).
_BOOTSTRAP = ("import os, runpy, signal, sys\n"
              "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
              "try:\n    os.nice(19)\nexcept OSError:\n    pass\n"
              "try:\n    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
              "except (AttributeError, OSError):\n    pass\n"
              "sys.argv = sys.argv[1:]\n"
              "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n")


class Compactor:
    """The running compactor of one session: :meth:`stop` tells it the session ended."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process

    def stop(self) -> None:
        """Close this process's end of its pipe; never waits. Once every copy is closed (a child
        forked with one closes its own, :meth:`Recorder.after_fork_in_child`) the compactor reads
        the session's files once more and exits. Through the file object, so that the descriptor
        is never closed twice (a bare close would leave the object to close, later, whatever file
        was opened under that number since)."""
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()


def start_compactor(
    run_dir: str, rank_dir: str, session: str, interval_s: float, warn: Callable[[str], None],
) -> Compactor | None:
    """Start the compactor of ``session`` (files ``run_dir/rank_dir/session.*.jsonl``); None, with
    one warning, where it cannot run."""
    if is_url(run_dir):
        warn("compact_interval_s: a rank compacts its own segments only on a local or NFS run directory; "
             "not started (run `goodtrace compact` where the run is mirrored)")
        return None
    try:
        missing = importlib.util.find_spec("duckdb") is None or importlib.util.find_spec("numpy") is None
    except (ImportError, ValueError):  # a module of that name that is no package, or half imported
        missing = True
    if missing:
        warn("compact_interval_s: compacting a rank's segments needs the reader "
             "(pip install 'goodtrace[report]'); not started")
        return None
    root = os.path.abspath(local_path(run_dir))
    env = dict(os.environ, PYTHONPATH=python_path())
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP, COMPACTOR_MODULE, root, rank_dir, session, repr(float(interval_s)),
             str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True, env=env,
        )
    except (OSError, ValueError) as exc:
        warn(f"compact_interval_s: the rank's compactor could not be started ({exc}); the job goes on without it")
        return None
    return Compactor(process)
