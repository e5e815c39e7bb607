"""The recording API behind ``import goodtrace as gt``: one active recorder per process.

``init`` discovers this process's identity and starts the recorder (or the shared no-op one
when recording is off); the module-level functions forward to it. A SIGTERM handler (when the
program has none), an exception hook, an exit hook and a fork hook make sure a recorder never
outlives its process, says how the process ended, and never writes from a forked child. Only
``finish()`` called by the program waits for pending device values; every other ending tests
them once without waiting, so it is bounded even when the device never completes.
"""


from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from goodtrace.record.config import Config, ConfigError
from goodtrace.record.errors import warn
from goodtrace.record.io.storage import Storage
from goodtrace.record.noop import NOOP_RECORDER, NoopRecorder
from goodtrace.record.process import discover_identity
from goodtrace.record.recorder import Recorder, StepContext
from goodtrace.record.spans import active_recorder, set_disabled

F = TypeVar("F", bound=Callable[..., Any])


def _active() -> Recorder | NoopRecorder:
    """The one active recorder: the one the hot path appends to (``spans``), else the no-op one."""
    rec = active_recorder()
    return NOOP_RECORDER if rec is None else rec

_lock = threading.Lock()
_restore_hooks: Callable[[], None] | None = None  # puts back the exception hooks init replaced


def init(
    run_dir: str | os.PathLike[str],
    *,
    enabled: bool | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    ranks: Any = None,
    config: Config | None = None,
    clock: Callable[[], int] | None = None,
    storage: Storage | None = None,
    sinks: Sequence[Any] | None = None,
    **options: Any,
) -> Recorder | NoopRecorder:
    """Start recording this rank into ``run_dir`` (a path or an fsspec URL).

    Rank and world size come from the arguments, else from an initialised torch.distributed /
    JAX, else from launcher variables (torchrun, Slurm, Open MPI), else 0 of 1. ``ranks``
    (a collection of rank numbers) records only those ranks; others get the no-op recorder.
    Other keyword options are :class:`Config` fields (e.g. ``lag=2``, ``flush_interval_s=5``).
    ``sinks`` (names such as ``"tensorboard:runs/tb"`` or sink objects; default: the
    comma-separated ``GOODTRACE_SINKS``) receive the live lines and the run's summary
    (``goodtrace.record.live.sink_hub``); an unknown name is a :class:`ConfigError`.

    ``init`` is the one strict call for its keyword arguments (a bad value raises
    :class:`ConfigError` before anything is recorded) and lenient for the environment: a bad
    ``GOODTRACE_*`` variable (``GOODTRACE_LAG=x``, an unknown name in ``GOODTRACE_SINKS``) is
    warned about once and the default is used.
    """
    resolved = _resolve_sinks(sinks)
    if config is None:
        config = Config.from_env(enabled=enabled, **options)
    elif options or enabled is not None:
        raise ConfigError("pass either config= or individual options, not both")
    with _lock:
        current = active_recorder()
        if current is not None and not current.finished:
            raise RuntimeError(f"goodtrace is already recording into {current.run_dir!r}; call finish() first")
        if not config.enabled:
            set_disabled()
            return NOOP_RECORDER
        identity = discover_identity(rank=rank, world_size=world_size, local_rank=local_rank)
        _warn_default_rank(identity.rank_source, identity.world_size)
        if ranks is not None and identity.rank not in set(ranks):
            set_disabled()
            return NOOP_RECORDER
        kwargs: dict[str, Any] = {"storage": storage}
        if clock is not None:
            kwargs["clock"] = clock
        rec = Recorder(os.fspath(run_dir), config, identity, **kwargs)
        rec.activate()  # the active recorder from here on (spans.bind)
        if config.sigterm_handler:
            _install_sigterm_handler(rec)
        if config.exception_hooks:
            _install_exception_hooks(rec)
        if resolved:
            from goodtrace.record.live.sink_hub import attach_sinks

            try:
                attach_sinks(rec, resolved)
            except Exception as exc:  # a sink must never fail init
                warn(f"sinks disabled: {exc!r}")
        if "jax" in sys.modules:  # the program already uses JAX: record its compiles from step 0
            try:
                from goodtrace.record.values import jax_compile

                jax_compile.install()
            except Exception:  # an optional feature must never fail init
                pass
        return rec


_warned_default_rank = False


def _warn_default_rank(source: str, world_size: int) -> None:
    """Once per process: the rank is the default (no argument, no initialised process group,
    no launcher variable) in a process that ``multiprocessing`` started (``mp.spawn``, with
    ``init`` before the process group) in a program that imported torch or JAX: its siblings
    may all claim rank 0. A single process (the usual one-host script) is rank 0 rightly."""
    global _warned_default_rank
    if source != "default" or _warned_default_rank:
        return
    mp = sys.modules.get("multiprocessing")  # never imported here
    if mp is None or mp.parent_process() is None:
        return
    frameworks = [name for name in ("torch", "jax") if name in sys.modules]  # never imported here
    if frameworks:
        _warned_default_rank = True
        warn(f"init(): rank 0 of {world_size} by default (no rank=, no initialised {' or '.join(frameworks)} process group, "
             "no launcher variable such as RANK): if this is one of several processes, each records as rank 0; "
             "call init() after the process group is initialised, or pass rank= and world_size=",
             stacklevel=3)  # the program's init() call


def _resolve_sinks(sinks: Sequence[Any] | None) -> list[Any]:
    """Sink objects from names/objects, or from ``GOODTRACE_SINKS`` when ``sinks`` is None."""
    if sinks is None:
        text = os.environ.get("GOODTRACE_SINKS", "")
        if not text.strip():
            return []
        from goodtrace.record.live.sink_hub import parse_specs, resolve

        resolved = []
        for spec in parse_specs(text):  # the launcher's: a bad name is warned about, never fatal
            try:
                resolved.append(resolve(spec))
            except ConfigError as exc:
                warn(f"GOODTRACE_SINKS: {spec[:200]!r} ignored ({exc})", stacklevel=4)
        return resolved
    if isinstance(sinks, (str, bytes)):
        raise ConfigError(f"sinks must be a list of sink names or objects, got the string {sinks!r}")
    if not sinks:
        return []
    from goodtrace.record.live.sink_hub import resolve

    return [resolve(sink) for sink in sinks]


def finish(completed: bool | None = None) -> bool:
    """Settle pending steps, write the finish record, flush and close the files.

    The ending is inferred by default: called while an exception propagates (``try: ...
    finally: gt.finish()``), the attempt crashed, with the exception's type; otherwise it
    completed. ``completed=False`` says the job is stopping early; an explicit ``True`` while an
    exception propagates is overruled by the exception (with a warning).
    Returns True when every record reached storage within ``finish_timeout_s``.
    """
    with _lock:
        rec = _active()  # stays active (spans, metrics from other threads) until its finish unbinds it
    try:
        return rec.finish(completed)
    finally:
        _restore_exception_hooks()


def flush(timeout: float | None = None) -> bool:
    """Write everything buffered now; True when it reached storage within ``timeout``."""
    return _active().flush(timeout)


def recorder() -> Recorder | NoopRecorder:
    """The active recorder (the shared no-op one when not recording)."""
    return _active()


def is_enabled() -> bool:
    return _active().enabled


def current_step() -> int | None:
    return _active().current_step


def step(number: int) -> StepContext:
    """``with gt.step(n) as s:``: the ambient step for spans, tags and metrics."""
    return _active().step(number)  # type: ignore[no-any-return,unused-ignore]


def complete_on(value: object, step: int | None = None) -> None:
    """The (current) step is complete when ``value`` is; observed with the lag, never earlier."""
    _active().complete_on(value, step)


def metric(name: str, value: object, reduce: str = "mean", step: int | None = None) -> None:
    """A named value at the (current) step, reduced across ranks with ``reduce``."""
    _active().metric(name, value, reduce, step)


def tag(name: str, step: int | None = None) -> None:
    """Label the (current) step, e.g. ``gt.tag("lr_drop")``."""
    _active().tag(name, step)


def event(name: str, **attrs: Any) -> None:
    """A named instant with attributes, e.g. ``gt.event("preempted", signal=15)``."""
    _active().event(name, attrs or None)


def _install_sigterm_handler(rec: Recorder) -> None:
    """On SIGTERM (how schedulers preempt), record it and flush, then die as the signal says.

    Only when the program has no SIGTERM handler of its own and we are in the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def on_sigterm(signum: int, frame: object) -> None:
        if rec.finishing_thread == threading.get_ident():
            # It interrupted this thread's own finish: let that finish end, then die of it.
            rec.deferred_signal = signum
            return
        try:
            if rec.finishing_thread is not None:  # another thread is finishing: wait for it (bounded)
                rec.wait_finished(rec.config.finish_timeout_s)
            else:
                rec.event("preempted", {"signal": signum})
                rec.finish(False, "signal")
        finally:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, on_sigterm)


def _qualified_name(kind: type[BaseException]) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def _install_exception_hooks(rec: Recorder) -> None:
    """An uncaught exception in the main thread ends the session with a finish record naming
    it (``sys.excepthook``; the previous hook then runs as before). One in another thread does
    not end the process: it becomes an ``uncaught_exception`` event. Both hooks are restored
    by ``finish()`` (unless someone replaced them meanwhile); until then, once ``rec`` has
    finished they only pass the exception on."""
    global _restore_hooks
    _restore_exception_hooks()
    previous_sys = sys.excepthook
    previous_threading = threading.excepthook

    def on_exception(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        try:
            if not rec.finished:
                rec.finish(False, "exception", exception=_qualified_name(kind))
        except Exception:
            pass
        previous_sys(kind, value, tb)

    def on_thread_exception(args: Any) -> None:
        try:
            if not rec.finished and args.exc_type is not SystemExit:
                thread = args.thread
                rec.event("uncaught_exception", {
                    "exception": _qualified_name(args.exc_type),
                    "thread": None if thread is None else thread.name,
                })
        except Exception:
            pass
        previous_threading(args)

    def restore() -> None:
        if sys.excepthook is on_exception:
            sys.excepthook = previous_sys
        if threading.excepthook is on_thread_exception:
            threading.excepthook = previous_threading

    sys.excepthook = on_exception
    threading.excepthook = on_thread_exception
    _restore_hooks = restore


def _restore_exception_hooks() -> None:
    global _restore_hooks
    restore, _restore_hooks = _restore_hooks, None
    if restore is not None:
        restore()


def _at_exit() -> None:
    rec = _active()
    if isinstance(rec, Recorder):
        try:
            rec.finish(None, "exit")
        except Exception:
            pass


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    _active().after_fork_in_child()  # and it is no longer active


atexit.register(_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)
