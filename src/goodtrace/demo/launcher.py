"""Start the demo's ranks as separate processes and restart them all when one fails.

Like ``torchrun`` with ``--max-restarts``: each attempt gets a fresh rendezvous port and the
restart counter in ``TORCHELASTIC_RESTART_COUNT``; when any rank exits with an error the others
are terminated (SIGTERM, then SIGKILL after 2 s) and a new attempt starts, resuming from the newest
checkpoint. Rank 0's output goes to the console; every rank's full output to
``RUN_DIR/logs/attempt-K-rank-R.log``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO


@dataclasses.dataclass(frozen=True, kw_only=True)
class DemoConfig:
    run_dir: Path
    ranks: int = 2
    steps: int = 200
    crash_at: int | None = 140
    checkpoint_every: int = 25
    eval_every: int = 40
    log_every: int = 20
    batch: int = 8
    workers: int = 1
    max_restarts: int = 2
    attempt_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if not 1 <= self.ranks <= 16:
            raise ValueError(f"--ranks must be between 1 and 16, got {self.ranks}")
        if not 1 <= self.steps <= 100_000:
            raise ValueError(f"--steps must be between 1 and 100000, got {self.steps}")
        if self.crash_at is not None and not 1 <= self.crash_at < self.steps:
            raise ValueError(f"--crash-at must be a step between 1 and {self.steps - 1} (or 'none'), got {self.crash_at}")
        for name in ("checkpoint_every", "eval_every", "log_every", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.workers < 0:
            raise ValueError(f"--workers must be 0 or more, got {self.workers}")


@dataclasses.dataclass(frozen=True)
class AttemptResult:
    attempt: int
    exit_codes: tuple[int | None, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(code == 0 for code in self.exit_codes)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank_command(config: DemoConfig, crash: bool) -> list[str]:
    command = [
        sys.executable, "-m", "goodtrace.demo.train", str(config.run_dir), "--steps", str(config.steps),
        "--checkpoint-every", str(config.checkpoint_every), "--eval-every", str(config.eval_every),
        "--log-every", str(config.log_every), "--batch", str(config.batch), "--workers", str(config.workers),
    ]
    if crash and config.crash_at is not None:
        command += ["--crash-at", str(config.crash_at)]
    return command


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + 2  # ranks stuck in a collective with a dead peer never get to exit
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_attempt(config: DemoConfig, attempt: int, echo: Callable[[str], None]) -> AttemptResult:
    logs = config.run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    started = time.monotonic()
    procs: list[subprocess.Popen[bytes]] = []
    files: list[IO[bytes]] = []
    try:
        for rank in range(config.ranks):
            env = dict(os.environ)
            env.update(
                RANK=str(rank), WORLD_SIZE=str(config.ranks), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(config.ranks),
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_RESTART_COUNT=str(attempt),
                PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
            )
            log: IO[bytes] = open(logs / f"attempt-{attempt}-rank-{rank}.log", "wb")  # noqa: SIM115 - closed below
            files.append(log)
            procs.append(subprocess.Popen(
                _rank_command(config, crash=attempt == 0), env=env, stderr=log,
                stdout=None if rank == 0 else log,
            ))
        failed: int | None = None
        while failed is None and any(p.poll() is None for p in procs):
            if time.monotonic() - started > config.attempt_timeout_s:
                echo(f"attempt {attempt} took longer than {config.attempt_timeout_s:.0f} s; stopping it")
                failed = -1
                break
            for rank, proc in enumerate(procs):
                code = proc.poll()
                if code not in (None, 0):
                    failed = rank
                    break
            time.sleep(0.02)
        if failed is not None and failed >= 0:
            code = procs[failed].returncode
            echo(f"rank {failed} exited with code {code}: stopping the other ranks "
                 f"(its log: {logs / f'attempt-{attempt}-rank-{failed}.log'})")
        _stop(procs)
    finally:
        _stop(procs)
        for handle in files:
            handle.close()
    return AttemptResult(attempt, tuple(p.returncode for p in procs), time.monotonic() - started)


def launch(config: DemoConfig, echo: Callable[[str], None] = print) -> list[AttemptResult]:
    """Run attempts until one succeeds or ``max_restarts`` restarts were spent."""
    results: list[AttemptResult] = []
    for attempt in range(config.max_restarts + 1):
        if attempt:
            echo(f"restarting all {config.ranks} ranks from the last checkpoint (attempt {attempt})")
        result = run_attempt(config, attempt, echo)
        results.append(result)
        if result.ok:
            break
    return results
