"""The hot path: ``span()`` and the span objects, reading module globals set by the recorder.

A span is a tuple appended to the active recorder's deque (atomic under the GIL, no lock, no
I/O); the writer thread turns tuples into JSON lines. The optional C fast path
(``_speedups.c``, built at install time where a compiler exists) implements the common case of
``span()`` and the span's ``with`` protocol; without it the same logic runs in Python
(``GOODTRACE_PURE_PYTHON=1`` selects it explicitly). :class:`goodtrace.record.recorder.Recorder`
points these globals at itself with :func:`bind` and releases them with :func:`unbind`.
"""

from __future__ import annotations

import collections
import contextvars
import functools
import inspect
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from goodtrace import schema
from goodtrace.record import fastpath
from goodtrace.record.arguments import MAX_NAME_CHARS, name_text
from goodtrace.record.errors import describe

if TYPE_CHECKING:
    from goodtrace.record.recorder import Recorder

F = TypeVar("F", bound=Callable[..., Any])

# The optional C fast path (built from _speedups.c at install time when a compiler is there).
_speedups: Any = fastpath.speedups
IMPLEMENTATION = fastpath.SPANS

_get_ident = threading.get_ident
_new: Callable[[type[Any]], Any] = object.__new__  # C-based spans: see below (cls.__new__)
_MAX_CATEGORY_CACHE = 10_000

# The hot path reads these module globals (LOAD_GLOBAL is the cheapest lookup there is); they
# are set when a Recorder becomes active and reset when it finishes. One recorder per process.
_RUNNING, _DISABLED, _NOT_STARTED = 0, 1, 2
_mode = _NOT_STARTED
_clock: Callable[[], int] = time.perf_counter_ns
_SINK: collections.deque[tuple[Any, ...]] = collections.deque(maxlen=1)
_append: Callable[[tuple[Any, ...]], None] = _SINK.append
# The ambient step: the one entered in this thread or task (a ContextVar: an asyncio task
# starts with its creator's), else, in a context that never entered one (another thread, a task
# made before the first step), the step entered last anywhere (``_step``). The hot path reads
# it as ``_get_step(_step)``: one C call. A fresh variable per recorder (``bind``), so no context
# keeps a previous recorder's step.
_step: int | None = None
_step_var: contextvars.ContextVar[int | None] = contextvars.ContextVar("goodtrace_step")
_get_step: Callable[[int | None], int | None] = _step_var.get
_keys: dict[Any, tuple[str, str, bool, type[Span]]] = {}
_active: Recorder | None = None


class _PySpanBase:
    """The reference implementation of a span's ``with`` protocol; ``_speedups.SpanBase`` is
    the same in C (used when it was built, unless ``GOODTRACE_PURE_PYTHON=1``)."""

    __slots__ = ("attrs", "key", "t0")

    key: tuple[str, str, bool, type[Span]]
    attrs: Mapping[str, Any] | None
    t0: int

    def __enter__(self) -> Span:
        self.t0 = _clock()
        return self  # type: ignore[return-value]

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        _append((self.key, self.t0, _clock(), _get_step(_step), _get_ident(), self.attrs, exc_type))


if TYPE_CHECKING:
    _SpanBase = _PySpanBase
else:
    _SpanBase = _PySpanBase if _speedups is None else _speedups.SpanBase


class Span(_SpanBase):
    """A timed interval on the calling thread; one object per ``with`` entry.

    In the buffer a span is ``(key, t0, t1, step, thread, attrs, exc_type)`` where
    ``key = (name, category, blocking, class)`` is shared by every span of that name.
    """

    __slots__ = ()

    @property
    def name(self) -> str:
        return self.key[0]

    @property
    def category(self) -> str:
        return self.key[1]

    def __call__(self, func: F) -> F:
        """Use as a decorator: each call of ``func`` runs in a fresh span of this name."""
        name, category, attrs = self.key[0], self.key[1], self.attrs
        return traced(lambda: span(name, category, attrs), func)


class OverheadSpan(Span):
    """A span of an overhead category: also tells the recorder's overhead-span listeners
    (live step-time splits). Compute spans never pay for this."""

    __slots__ = ()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        t1 = _clock()
        _append((self.key, self.t0, t1, _get_step(_step), _get_ident(), self.attrs, exc_type))
        if _active is not None and _active.overhead_span_listeners:
            _active.notify_overhead_span(self.key[1], self.t0, t1)


class BlockingSpan(OverheadSpan):
    """A span of a blocking category: on the training thread, pending step completions are
    observed before t0. On another thread (an asynchronous checkpoint writer) it only records:
    it never waits for the training thread's values, never runs the device barrier for its
    step, and is no phase of the training thread's (the hang watchdog's)."""

    __slots__ = ()

    def __enter__(self) -> Span:
        rec = _active
        if rec is None or _get_ident() != rec.main_thread:
            self.t0 = _clock()
            return self
        rec.settle(schema.SYNC_BLOCKING)
        self.t0 = _clock()
        if rec.blocking_span_listeners:  # the hang watchdog's phases
            for listener in rec.blocking_span_listeners:
                listener(self.key[1], self.t0)
        return self


class NamedBlockingSpan(BlockingSpan):
    """A blocking span whose category came from its name alone (``gt.span("save")``: the
    default table makes it ``checkpoint_save``), not from ``category=`` or ``init(categories=)``.
    The first time one waits on the training thread, goodtrace says so once for that name
    (the wait is the surprise: a span named ``eval`` settles the pending steps first), and its
    name's key becomes a plain :class:`BlockingSpan`: later spans of that name pay nothing."""

    __slots__ = ()

    def __enter__(self) -> Span:
        rec = _active
        if rec is not None and _get_ident() == rec.main_thread:
            _named_wait(rec, self.key)
        return BlockingSpan.__enter__(self)


def _named_wait(rec: Recorder, key: tuple[str, str, bool, type[Span]]) -> None:
    """The warning of a :class:`NamedBlockingSpan` that waits, once per name; its key's class
    is then :class:`BlockingSpan` for the spans made after it."""
    name, category = key[0], key[1]
    if _keys.get(name) is key:
        _keys[name] = (name, category, True, BlockingSpan)
    rec._warn(
        f"named-blocking:{name}",
        f"span {describe(name, 60)} is blocking: its name makes its category {category!r}, so goodtrace "
        f"waits for the pending steps (the device) before it starts; pass gt.span({describe(name, 60)}, "
        f"category={category!r}) to say so and silence this, or another category (e.g. 'compute') not to wait",
    )


def _span_py(name: Any, category: Any = None, attrs: Mapping[str, Any] | None = None) -> Any:
    """The hot path behind ``goodtrace.span`` (see there), in Python: ``_speedups.span`` does
    its common case (running, name already resolved) in C and calls this for the rest. Any
    argument is accepted: what is wrong with it is warned about once, when its key is made."""
    if _mode:
        if _mode == _DISABLED:
            return NOOP_SPAN
        if type(name) is not str and callable(name):  # bare @gt.span before init
            label = _label(name)
            return traced(lambda: span(label, category, attrs), name)
        return LateSpan(name, category, attrs)
    try:
        key = _keys[name if category is None else (name, category)]
    except KeyError:
        if type(name) is not str and callable(name):  # bare decorator: @gt.span
            label = _label(name)
            return traced(lambda: span(label, category, attrs), name)
        key = _new_key(name, category)
    except Exception:  # unhashable name or category, or a __hash__/__eq__ that raises
        key = _new_key(name, category)
    s = _new(key[3])
    s.key = key
    s.attrs = attrs
    return s


def _label(func: Any) -> str:
    """The span name of a bare-decorated function: its qualified name, else its repr."""
    try:
        label = func.__qualname__
    except Exception:
        label = None
    return label if type(label) is str else describe(func)


span = _span_py
if _speedups is not None:
    _new = _speedups.new_span
    _speedups.bind(globals(), _span_py)
    span = _speedups.span


def _new_key(name: Any, category: Any) -> tuple[str, str, bool, type[Span]]:
    """The key of a span name first seen (and warnings about its arguments, once)."""
    text, problem = name_text(name)
    rec = _active
    if rec is None:
        return (text, category if type(category) is str and category else schema.COMPUTE, False, Span)
    cut = isinstance(name, str) and len(name) > MAX_NAME_CHARS
    if cut:  # other names than strings keep their repr quietly, as they always did
        rec._warn("span-name-length", f"span {problem}")
    resolved, blocking = rec.resolve_category(text if isinstance(name, str) else None, category)
    # overhead spans (and data spans: the live goodput's data rule) tell the overhead-span listeners
    notify = resolved in rec.overhead_categories or resolved == schema.DATA
    kind = BlockingSpan if blocking else OverheadSpan if notify else Span
    if blocking and category is None and isinstance(name, str) and name not in rec.config.categories:
        kind = NamedBlockingSpan  # blocking because of its name alone: it says so when it first waits
    key = (text, resolved, blocking, kind)
    if len(_keys) < _MAX_CATEGORY_CACHE and not cut:  # a huge name is not kept alive by the cache
        try:
            _keys[name if category is None else (name, category)] = key
        except Exception:  # unhashable: resolved again at each use, warned about once
            pass
    return key


def span_key(name: str, category: str) -> tuple[str, str, bool, type[Span]]:
    """The key for an automatic span (gc, compile): never blocking, cached."""
    try:
        return _keys[(name, category)]
    except KeyError:
        key = (name, category, False, Span)
        if len(_keys) < _MAX_CATEGORY_CACHE:
            _keys[(name, category)] = key
        return key


class _NoopSpan:
    """The shared no-op: a context manager and a decorator that do nothing."""

    __slots__ = ()
    name = ""
    category = ""

    def __enter__(self) -> _NoopSpan:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        return None

    def complete_on(self, value: object) -> None:
        return None

    def __call__(self, func: F) -> F:
        return func  # recording is disabled for good: leave the function as it is


NOOP_SPAN = _NoopSpan()


class LateSpan:
    """Returned before ``init()``: a no-op ``with`` block that, used as a decorator, traces
    the function once recording starts (decorators usually run at import, before init)."""

    __slots__ = ("attrs", "category", "name")

    def __init__(self, name: Any, category: str | None, attrs: Mapping[str, Any] | None) -> None:
        self.name = name
        self.category = category
        self.attrs = attrs

    def __enter__(self) -> LateSpan:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        return None

    def complete_on(self, value: object) -> None:
        return None

    def __call__(self, func: F) -> F:
        name, category, attrs = self.name, self.category, self.attrs
        return traced(lambda: span(name, category, attrs), func)




def traced(span_factory: Callable[[], Any], func: F) -> F:
    """Wrap ``func`` so each call runs inside a fresh span (decorator support).

    A coroutine function's span times the coroutine to completion: it opens when the coroutine
    starts running (its first ``await``er drives it) and closes when it returns or raises, so
    it includes the time it waits. An async generator's span runs from its first item asked
    for to its end (exhausted, closed or raised). Calling either only creates it, as without
    the decorator."""
    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def run_coroutine(*args: Any, **kwargs: Any) -> Any:
            with span_factory():
                return await func(*args, **kwargs)

        return run_coroutine  # type: ignore[return-value]
    if inspect.isasyncgenfunction(func):

        @functools.wraps(func)
        async def run_generator(*args: Any, **kwargs: Any) -> Any:
            generator = func(*args, **kwargs)
            with span_factory():
                try:
                    request = generator.asend(None)
                    while True:
                        try:
                            item = await request
                        except StopAsyncIteration:
                            return
                        try:
                            sent = yield item
                        except GeneratorExit:  # closed early (aclose): an end, not an error
                            return
                        except BaseException as exc:  # athrow(): into the wrapped generator
                            request = generator.athrow(exc)
                        else:
                            request = generator.asend(sent)
                finally:
                    await generator.aclose()

        return run_generator  # type: ignore[return-value]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with span_factory():
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]



def bind(rec: Recorder) -> None:
    """Point the hot path at ``rec``: its buffer, its clock; no step yet."""
    global _mode, _clock, _append, _step, _step_var, _get_step, _active
    _keys.clear()
    _clock = rec.clock
    _append = rec.buffer.append
    _step = None
    _step_var = contextvars.ContextVar("goodtrace_step")
    _get_step = _step_var.get
    _active = rec
    _mode = _RUNNING


def unbind(rec: Recorder) -> None:
    """``rec`` stops recording: spans become late spans again (a later ``init`` may rebind)."""
    global _mode, _active, _append, _step
    if _active is rec:
        _mode = _NOT_STARTED
        _active = None
        _append = _SINK.append
        _step = None


def disable_after_fork(rec: Recorder, buffer: collections.deque[tuple[Any, ...]]) -> None:
    """In a forked child: spans are no-ops for good and never touch the parent's buffer."""
    global _mode, _active, _append
    _mode = _DISABLED
    _active = None
    _append = buffer.append


def set_disabled() -> None:
    """Recording is off for this process (``init(enabled=False)``): spans are the shared no-op."""
    global _mode
    _mode = _DISABLED


def set_step(number: int | None) -> None:
    """The ambient step of spans from now on, in this thread or task (and in contexts that
    never entered a step)."""
    global _step
    _step_var.set(number)
    _step = number


def active_recorder() -> Recorder | None:
    """The recorder spans go to now (None when not recording)."""
    return _active


def current_step(rec: object) -> int | None:
    """The ambient step of the calling thread or task, when ``rec`` is the active recorder."""
    return _get_step(_step) if _active is rec else None
