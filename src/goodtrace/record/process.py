"""Who this process is: rank, world size, host, launcher restart counter, OS start time.

Everything here is read once at ``init()``. Nothing imports torch or jax: a framework is asked
only when the user's program has already imported it (looked up in ``sys.modules``).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time
from collections.abc import Mapping
from typing import Any

from goodtrace import schema

_IMPORT_MONO_NS = time.perf_counter_ns()


def python_path() -> str:
    """``PYTHONPATH`` for a process goodtrace starts (a reader's worker, a rank's compactor): the
    directory this goodtrace was imported from first, so that it runs this goodtrace."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.pathsep.join([root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])


@dataclasses.dataclass(frozen=True)
class ProcessIdentity:
    rank: int
    world_size: int
    local_rank: int
    host: str
    pid: int
    restart: int | None
    rank_source: str


def _env_int(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        raw = env.get(name)
        if raw is None or raw.strip() == "":
            continue
        try:
            return int(raw)
        except ValueError:
            continue
    return None


def _framework_rank() -> tuple[int, int, int | None, str] | None:
    """Rank/world from torch.distributed or JAX, if the program already initialised them."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                return int(dist.get_rank()), int(dist.get_world_size()), None, "torch.distributed"
        except Exception:
            pass
    jax = sys.modules.get("jax")
    if jax is not None:
        try:
            from jax._src import distributed as jax_distributed

            state = jax_distributed.global_state
            if getattr(state, "client", None) is not None:
                return int(jax.process_index()), int(jax.process_count()), None, "jax.distributed"
        except Exception:
            pass
    return None


def discover_identity(
    *,
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> ProcessIdentity:
    """Explicit arguments, else an initialised framework, else launcher variables, else 0 of 1."""
    env = os.environ if environ is None else environ
    source = "argument"
    found_rank, found_world, found_local = rank, world_size, local_rank
    if found_rank is None:
        framework = _framework_rank()
        if framework is not None:
            found_rank, fw_world, _, source = framework
            found_world = found_world if found_world is not None else fw_world
    if found_rank is None:
        found_rank = _env_int(env, "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "JAX_PROCESS_ID")
        source = "environment" if found_rank is not None else "default"
    if found_world is None:
        found_world = _env_int(env, "WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "JAX_NUM_PROCESSES")
    if found_local is None:
        found_local = _env_int(env, "LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
    final_rank = found_rank if found_rank is not None else 0
    final_world = found_world if found_world is not None else max(1, final_rank + 1)
    if final_rank < 0 or final_world < 1 or final_rank >= final_world:
        raise ValueError(f"invalid rank {final_rank} for world size {final_world} (from {source})")
    restart = None
    for name in schema.RESTART_COUNTER_ENV:
        restart = _env_int(env, name)
        if restart is not None:
            break
    return ProcessIdentity(
        rank=final_rank,
        world_size=final_world,
        local_rank=found_local if found_local is not None else 0,
        host=socket.gethostname(),
        pid=os.getpid(),
        restart=restart,
        rank_source=source,
    )


def process_start_mono_ns(pid: int | None = None) -> tuple[int, str]:
    """When this process started, on the ``time.perf_counter_ns()`` clock.

    On Linux this comes from the OS (``/proc/<pid>/stat`` start time, measured since boot),
    so interpreter start-up, imports and launcher time before ``init()`` are visible; the
    resolution is one clock tick (10 ms). Elsewhere it falls back to when goodtrace was
    imported and says so (second item: ``"os"`` or ``"import"``).
    """
    try:
        with open(f"/proc/{pid or 'self'}/stat", "rb") as handle:
            stat = handle.read().decode("ascii", "replace")
        # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
        fields = stat[stat.rindex(")") + 2 :].split()
        start_ticks = int(fields[19])  # field 22 of the full line
        ticks_per_s = os.sysconf("SC_CLK_TCK")
        boot_now = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        mono_now = time.perf_counter_ns()
        age_ns = boot_now - start_ticks * 1_000_000_000 // ticks_per_s
        if age_ns < 0 or age_ns > 10 * 365 * 86400 * 10**9:
            raise ValueError("implausible process age")
        return mono_now - age_ns, "os"
    except (OSError, ValueError, IndexError, AttributeError):
        return _IMPORT_MONO_NS, "import"


# How much later than a session's recorded start the OS may date the process now holding its pid
# and still be that process: both read the same OS start time (one clock tick, 10 ms), so this
# only absorbs the wall clock being stepped in between.
PID_REUSE_SLACK_NS = 10**9


def process_start_wall_ns(pid: int) -> int | None:
    """When process ``pid`` started (wall-clock ns), from the OS; None where it cannot say."""
    mono, source = process_start_mono_ns(pid)
    if source != "os":
        return None
    return time.time_ns() - (time.perf_counter_ns() - mono)


def pid_alive(pid: int, started_by_wall_ns: int | None = None) -> bool:
    """Whether the process of this host with ``pid`` may still be running: False only when it
    surely ended (no process has the pid, or the one that has it started after
    ``started_by_wall_ns``: the pid was used again). Unsure (a pid not ours to signal, no start
    time from the OS, ``pid <= 0``) is alive."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # not ours to signal, but it exists
        pass
    if started_by_wall_ns is not None:
        started = process_start_wall_ns(pid)
        if started is not None and started > started_by_wall_ns + PID_REUSE_SLACK_NS:
            return False
    return True


def submit_wall_ns(environ: Mapping[str, str] | None = None) -> int | None:
    """Job submission time (wall ns) when known: ``GOODTRACE_SUBMIT_TIME``, else Slurm's
    ``SLURM_JOB_SUBMIT_TIME`` (seconds since the Unix epoch); None otherwise."""
    env = os.environ if environ is None else environ
    raw = env.get("GOODTRACE_SUBMIT_TIME") or env.get("SLURM_JOB_SUBMIT_TIME")
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        return None
    return int(seconds * 1e9) if seconds > 0 else None


def describe(identity: ProcessIdentity) -> dict[str, Any]:
    return dataclasses.asdict(identity)
