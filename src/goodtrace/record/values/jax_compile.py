"""JAX compile spans from JAX's own listeners (``jax.monitoring``), for the recording layer.

:func:`install` (idempotent; run by ``goodtrace.init`` when the program already imported JAX,
and when goodtrace first sees a JAX value) registers listeners with ``jax.monitoring``. Every
compile phase JAX reports (tracing, lowering to MLIR, XLA compilation, persistent-cache reads)
becomes a span of category ``compile`` that ends when JAX reports it and lasts exactly the
duration JAX measured, attributed to the ambient step, which is tagged ``compile``. Nothing is
inferred from step times. Importing this module imports jax. The span's ``fun`` attribute (the
jitted function's name) is there when JAX passes ``fun_name`` to its listeners (newer
releases than 0.4.30 do).
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Mapping
from typing import Any, Final

import jax

from goodtrace import schema
from goodtrace.record import spans

__all__ = ["COMPILE_EVENTS", "CompileStats", "compile_stats", "install", "is_installed", "uninstall"]


#: JAX duration events that are compile phases of this process, and the span names they get.
COMPILE_EVENTS: Final[Mapping[str, str]] = {
    "/jax/core/compile/jaxpr_trace_duration": "jax.trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "jax.lower",
    "/jax/core/compile/backend_compile_duration": "jax.compile",
    "/jax/compilation_cache/cache_retrieval_time_sec": "jax.cache_read",
}
_COMPILE_PREFIX: Final = "/jax/core/compile/"  # phases a newer JAX adds are recorded too
_SAVED_EVENT: Final = "/jax/compilation_cache/compile_time_saved_sec"  # not a span: time *not* spent
_CACHE_EVENTS: Final[Mapping[str, str]] = {
    "/jax/compilation_cache/cache_hits": "hit",
    "/jax/compilation_cache/cache_misses": "miss",
}


@dataclasses.dataclass
class CompileStats:
    """What the listeners saw in this process since :func:`install` (all recorders)."""

    spans: int = 0
    seconds: float = 0.0
    cache_hits: int = 0
    cache_misses: int = 0


class _State(threading.local):
    cache: str | None = None
    saved_s: float | None = None


_install_lock = threading.Lock()
_installed = False
_stats = CompileStats()
_thread_state = _State()
# each recorder's step last tagged "compile", held weakly: keyed by the recorder itself, not by
# its id(), which a later recorder of the same process (a restart without a new process) may be
# given once the first is gone, and whose first compiling step would then go untagged
_tagged: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def _on_duration(event: str, duration_secs: float, **kwargs: str | int) -> None:
    """``jax.monitoring`` duration listener: called at the end of each phase, on its thread."""
    try:
        name = COMPILE_EVENTS.get(event)
        if name is None:
            if event == _SAVED_EVENT:
                _thread_state.saved_s = float(duration_secs)
            elif event.startswith(_COMPILE_PREFIX):
                name = "jax." + event[len(_COMPILE_PREFIX) :].removesuffix("_duration")
            if name is None:
                return
        _stats.spans += 1
        _stats.seconds += float(duration_secs)
        rec = spans.active_recorder()
        if rec is None or rec.finished:
            return
        t1 = rec.clock()
        t0 = t1 - max(0, round(float(duration_secs) * 1e9))
        fun = kwargs.get("fun_name")
        attrs: dict[str, Any] = {} if fun is None else {"fun": str(fun)}
        if name == "jax.compile":
            if _thread_state.cache is not None:
                attrs["cache"] = _thread_state.cache
                _thread_state.cache = None
            if _thread_state.saved_s is not None:
                attrs["saved_s"] = round(_thread_state.saved_s, 6)
                _thread_state.saved_s = None
        rec.record_span(name, schema.COMPILE, t0, t1, attrs)  # live aggregators hear of it too
        step = rec.current_step
        if step is not None and _tagged.get(rec) != step:
            _tagged[rec] = step
            rec.tag(schema.COMPILE, step)
    except Exception:
        pass


def _on_event(event: str, **kwargs: str | int) -> None:
    """``jax.monitoring`` event listener: persistent-cache hits and misses."""
    try:
        outcome = _CACHE_EVENTS.get(event)
        if outcome is None:
            return
        _thread_state.cache = outcome
        if outcome == "hit":
            _stats.cache_hits += 1
        else:
            _stats.cache_misses += 1
    except Exception:  # never raise into JAX's compilation
        pass


def install() -> None:
    """Record JAX compilations as ``compile`` spans from now on (idempotent, thread-safe).

    Compilations happen whether or not goodtrace is recording; while it is not, the
    listeners only count them (:func:`compile_stats`). Call this before the first jitted call
    so the first step's compilation is captured (``goodtrace`` does it by itself only when it
    first sees a JAX value, which is usually after that call).
    """
    global _installed
    with _install_lock:
        if _installed:
            return
        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        jax.monitoring.register_event_listener(_on_event)
        _installed = True


def uninstall() -> None:
    """Remove the listeners (tests, or a program that wants JAX's listeners to itself)."""
    global _installed
    with _install_lock:
        if not _installed:
            return
        _unregister("unregister_event_duration_listener", "_unregister_event_duration_listener_by_callback",
                    _on_duration)
        _unregister("unregister_event_listener", "_unregister_event_listener_by_callback", _on_event)
        _installed = False


def _unregister(public: str, private: str, listener: Any) -> None:
    """JAX made unregistering public in 0.8.1; before, only ``jax._src.monitoring`` has it."""
    remove = getattr(jax.monitoring, public, None)
    if remove is None:
        from jax._src import monitoring

        remove = getattr(monitoring, private)
    remove(listener)


def is_installed() -> bool:
    return _installed


def compile_stats() -> CompileStats:
    """A copy of the compile counters of this process."""
    return dataclasses.replace(_stats)


# ------------------------------------------------------------------------------ processes
