"""Load a run and analyse it, for the commands that show it: one-line errors, a progress bar."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import sys
import time
from collections.abc import Iterator
from typing import Any

from goodtrace.analysis import AnalysisError, RunAnalysis, analyze
from goodtrace.cli import CommandError
from goodtrace.cli.progress import progress_bar
from goodtrace.read.engine import Engine, workers_from_environment
from goodtrace.read.load import LoadError, NotARunError, load_run
from goodtrace.read.loaded import LoadedRun
from goodtrace.read.mirror import RemoteReadError
from goodtrace.read.torchtitan import (
    conversion_notes,
    converted_run,
    is_torchtitan_logs,
    recorded_beside,
    recorded_note,
)
from goodtrace.record.io.storage import is_url, local_path, missing_path
from goodtrace.record.process import pid_alive

__all__ = ["alive_here", "collect_less_often", "load_and_analyse", "reading_errors", "return_freed_memory"]


def alive_here(host: str, pid: int, start_wall_ns: int | None = None) -> bool | None:
    """Whether process ``pid`` of ``host`` is alive, when ``host`` is this machine; else None.

    A pid is reused (a container restarted with the same host name starts its processes at
    small pids again): the process now holding ``pid`` is that session's only when it started
    no later than the session's process start (``start_wall_ns``, the header's) allows
    (:func:`goodtrace.record.process.pid_alive`)."""
    if host != socket.gethostname() or pid <= 0:
        return None
    return pid_alive(pid, start_wall_ns)


@contextlib.contextmanager
def reading_errors(action: str, run_dir: str) -> Iterator[None]:
    """What reading a run can raise, as a one-line error (``cannot ACTION RUN: why`` for an OSError)."""
    try:
        yield
    except RemoteReadError as exc:  # the URL could not be read: the reason, not "not a run"
        raise CommandError(str(exc)) from None
    except NotARunError as exc:
        raise CommandError(f"{exc}: not a goodtrace run directory") from None
    except OSError as exc:
        raise CommandError(f"cannot {action} {run_dir!r}: {exc}") from None
    except LoadError as exc:
        raise CommandError(str(exc)) from None


def return_freed_memory() -> None:
    """Large numpy columns come and go while each session is read and cut; with glibc's
    default, the threshold for giving such blocks back to the system rises with every one
    freed, and a long run's report held twice the memory it used (measured: 665 MiB resident
    for 420 MiB in use on 2 ranks x 1 M steps). A fixed threshold returns them at once. The
    price is time: every such block is fresh memory, faulted in page by page (a re-report of
    that run: 2.4 s against 1.7 s with glibc's default; raised to 8 MiB, the synchronous
    loop's report peaked at 522 MiB against 468 MiB). Benchmarks of the report set it too."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD = 1 MiB
        except (OSError, AttributeError):
            pass  # not glibc: nothing to tune


def collect_less_often() -> None:
    """A report makes a few dozen container objects a session (its records, its cut, their
    columns' owners) and keeps many of them, so Python's cyclic collector, run every 700
    allocations by default, walked ever more of them: a fifth of the analysis of 10,000 ranks
    (10.4 s against 8.8 s without it). Young collections every 100,000 allocations instead:
    the command makes no cycles worth collecting sooner (numpy columns and dataclasses of
    them), and what it would collect later stays a few MB. Only the command's own process:
    the library called inside a job leaves the job's collector as it is."""
    import gc

    gc.set_threshold(100_000, 50, 100)


def load_and_analyse(run_dir: str, engine: Engine | None = None, *, tune_process: bool = True,
                     **options: Any) -> tuple[LoadedRun, RunAnalysis]:
    """The run and its analysis, read where ``engine`` says (``options``:
    :func:`goodtrace.analysis.analyze` keywords). The analysis's ``path`` is ``run_dir`` as
    given (what the user typed), not the local mirror of a URL or the conversion of torchtitan's
    logs that was read. ``tune_process``: tune this process's allocator and collector for one
    report (:func:`return_freed_memory`, :func:`collect_less_often`): the command's own
    process; :func:`goodtrace.report`, called in a notebook or a test, leaves them alone."""
    typed = run_dir
    if tune_process:
        return_freed_memory()
        collect_less_often()
    if not is_url(run_dir) and not os.path.exists(local_path(run_dir)):  # URLs: the loader mirrors them
        raise CommandError(missing_path(local_path(run_dir)))
    try:
        workers_from_environment()
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    notes: tuple[str, ...] = ()
    if not is_url(run_dir) and is_torchtitan_logs(local_path(run_dir)):
        recorded = recorded_beside(local_path(run_dir))
        if recorded is not None:  # goodtrace's handler recorded the trainer that wrote the logs: its run
            notes = (recorded_note(typed, recorded),)
            run_dir = recorded
        else:  # the logs, read as they are, converted once
            try:
                run_dir = converted_run(local_path(run_dir))
            except OSError as exc:
                raise CommandError(f"cannot convert torchtitan's logs in {run_dir!r}: {exc}") from None
            notes = conversion_notes(run_dir)
    update, stop = progress_bar()
    try:
        with reading_errors("read", run_dir):
            loaded = load_run(run_dir, progress=update, engine=engine)
    finally:
        stop()
    try:
        # the records are released as they are cut (a view that walks every rank's cut, the
        # HTML report or the trace, reads those the analysis did not keep in memory from its
        # temporary file, one rank at a time)
        with reading_errors("read", run_dir):  # the analysis fetches each session's columns as it goes
            analysis = analyze(loaded, now_wall_ns=time.time_ns(), alive=alive_here, release_records=True, **options)
    except AnalysisError as exc:
        raise CommandError(str(exc)) from None
    if notes:
        analysis = dataclasses.replace(analysis, warnings=(*notes, *analysis.warnings))
    if analysis.path != typed:
        analysis = dataclasses.replace(analysis, path=typed)
    return loaded, analysis
