"""Real ranks for the tests that need torch.distributed or JAX's distributed runtime: a free
local port for the rendezvous, and N spawned processes that must all exit cleanly."""

from __future__ import annotations

import multiprocessing
import socket
from typing import Any


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def leave_group() -> None:
    """A gloo rank's last call: every rank waits at a barrier, then the group is torn down. A
    rank that tore it down while the others still talked to it aborted once at exit in CI
    (``terminate called without an active exception``: a gloo thread left joinable). A DDP
    worker drops its model (the reducer) before calling this."""
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


def rank_context() -> Any:
    """Where rank processes come from: a fork server that imported torch and goodtrace once,
    so each rank starts in a fraction of a second instead of importing torch (3.5 s of CPU
    here) anew. A fork server's children are fresh processes as far as a test can tell (no
    threads, nothing of pytest's state); they inherit the server's environment and working
    directory (those of the session when it started), so a rank takes what it needs as an
    argument."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "goodtrace", "goodtrace.integrations.torch"])
    return ctx


def run_ranks(target: Any, world: int, *args: Any, timeout: float = 120) -> None:
    """``target(rank, world, port, *args)`` in ``world`` processes of :func:`rank_context`
    sharing one free port; waits up to ``timeout`` s for each, kills what is left, and requires
    every one to have exited with status 0."""
    ctx = rank_context()
    port = free_port()
    procs = [ctx.Process(target=target, args=(rank, world, port, *args)) for rank in range(world)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=timeout)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=10)
    assert [p.exitcode for p in procs] == [0] * world, f"exit statuses {[p.exitcode for p in procs]}"
