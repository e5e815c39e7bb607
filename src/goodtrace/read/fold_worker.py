"""A local worker process of the reader's pool: ``python -m goodtrace.read.fold_worker`` reads
pickled tasks (:class:`~goodtrace.read.engine.PoolTask`: a :class:`~goodtrace.read.engine.FoldTask`,
or segments that ``goodtrace records`` counts) on stdin, calls each and writes its result on
stdout (each a length, then the pickle), until an empty one.

A fresh interpreter started by command, not by :mod:`multiprocessing`: nothing of the calling
program runs in it (a training script that reads its run at the end, unguarded module code),
and it imports the goodtrace the driver imported.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
from typing import IO, Any

from goodtrace.read.engine import PoolTask
from goodtrace.read.loaded import LoadError
from goodtrace.record.process import python_path

__all__ = ["WorkerProcess"]

_LENGTH = struct.Struct("<Q")


def _send(stream: IO[bytes], value: object) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL) if value is not None else b""
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> Any:
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError
    (size,) = _LENGTH.unpack(head)
    if size == 0:
        return None
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


class WorkerProcess:
    """One worker process, serving one task at a time."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=python_path())
        self.process = subprocess.Popen(
            [sys.executable, "-m", "goodtrace.read.fold_worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=env,
        )

    def run(self, task: PoolTask) -> Any:
        """The task's result; an exception the task raised is raised here."""
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            _send(self.process.stdin, task)
            reply = _receive(self.process.stdout)
        except (EOFError, BrokenPipeError):
            code = self.process.wait()
            raise LoadError(f"a worker process reading the run died (exit status {code}; out of memory?); "
                            "--workers 1 (or GOODTRACE_WORKERS=1) reads it in this process") from None
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def kill(self) -> None:
        self.process.kill()

    def close(self) -> None:
        """Ask the worker to exit (it finishes the task in hand first); kill it if it does not."""
        try:
            if self.process.stdin is not None:
                _send(self.process.stdin, None)
                self.process.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def serve(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    while True:
        try:
            task = _receive(stdin)
        except EOFError:
            return
        if task is None:
            return
        try:
            reply: object = task()
        except Exception as exc:  # the driver raises it
            reply = exc
        try:
            _send(stdout, reply)
        except (pickle.PicklingError, TypeError, AttributeError):
            _send(stdout, RuntimeError(f"{type(reply).__name__}: {reply}"))


if __name__ == "__main__":
    # The results get a descriptor of their own; whatever else writes on stdout (a library's
    # C code included) goes to stderr instead.
    results = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(sys.stdin.buffer, results)
