"""A child process that reports on its stdout, line by line, while a test watches it: started,
waited for until its first report (its interpreter start and imports take seconds on a
loaded machine), and killed hard."""

from __future__ import annotations

import signal
import subprocess
import threading
import time


class ReportingChild:
    """``args`` run with their stdout read into ``lines`` by a thread; returns once the child
    has reported once (asserts that it did, within two minutes)."""

    def __init__(self, args: list[str]) -> None:
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self.lines.extend, args=(self.process.stdout,), daemon=True)
        self._reader.start()
        started = time.monotonic()
        while not self.lines and self.process.poll() is None and time.monotonic() - started < 120:
            time.sleep(0.01)
        assert self.lines, f"the child never reported (exit status {self.process.poll()})"

    def kill(self) -> None:
        """SIGKILL, then every line it wrote before it died read."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)
        self._reader.join(timeout=30)
        assert self.process.stdout is not None
        self.process.stdout.close()
