"""goodtrace's threads in the training process leave the program's signals to the program.

The kernel hands a signal sent to the process (a scheduler's SIGTERM, a Ctrl-C) to any thread
that does not block it. Python runs its handlers in the main thread, but a signal that lands on
another thread only wakes the main thread when that next runs Python code: a main thread in a
long ``time.sleep``, a blocking read or a device wait would handle a preemption late. Every
thread goodtrace starts in the job therefore blocks these signals first (the native writer's
thread does the same in C), so they reach the program's own threads.
"""

from __future__ import annotations

import signal
import threading

PROGRAM_SIGNALS = frozenset(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM")
    if hasattr(signal, name)
)


def block_program_signals() -> None:
    """In the calling thread: block the signals a program handles (a thread initializer)."""
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, PROGRAM_SIGNALS)
    except (AttributeError, OSError, ValueError):  # no pthread_sigmask on this platform
        pass


class Thread(threading.Thread):
    """A ``threading.Thread`` that blocks the program's signals before it runs its target."""

    def run(self) -> None:
        block_program_signals()
        super().run()
