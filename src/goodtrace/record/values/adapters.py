"""Device-value adapters: how to tell whether a value is complete, wait for it, read a number.

An adapter is chosen by the value's type, once per type, without importing any framework:
Python numbers and NumPy values are host values (complete on arrival); torch tensors and JAX
arrays are handled by ``goodtrace.record.values.torch_values`` / ``goodtrace.record.values.jax_values``, imported only
when such a value is first passed. Any other type takes part through
:func:`register_value_type`, or through methods of its own (duck-typed):

- ``__goodtrace_wait__()`` blocks until the value is complete (required);
- ``__goodtrace_ready__()`` says without blocking whether it is (optional, but without it a
  completion is dated only when goodtrace waits for it); called from goodtrace's readiness
  thread, so it must be safe to call from any thread;
- ``__goodtrace_float__()`` returns it as a float, for metrics (optional: else ``float(v)``
  after waiting);
- ``__goodtrace_barrier__()`` waits for everything dispatched so far on the value's device
  (optional: used before a blocking span that starts before its step's ``complete_on``).
"""

from __future__ import annotations

import importlib
import math
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from goodtrace.record.values.protocol import COMPLETE, HostNumber, HostTimed, UnsupportedValue, ValueAdapter

__all__ = [
    "COMPLETE",
    "HostTimed",
    "UnsupportedValue",
    "ValueAdapter",
    "adapter_for",
    "finite_or_none",
    "join_completions",
    "register_value_type",
]

T = TypeVar("T")


class _NumpyValue(HostNumber):
    def to_float(self, handle: Any) -> float:
        size = getattr(handle, "size", 1)
        if size != 1:
            raise UnsupportedValue(f"a metric must be a scalar, got an array of size {size}")
        return float(handle.item() if hasattr(handle, "item") else handle)


class _ProtocolValue:
    host = False

    def prepare(self, value: Any) -> Any:
        return value

    def prepare_read(self, value: Any) -> Any:
        return value

    def ready(self, handle: Any) -> bool | None:
        probe = getattr(handle, "__goodtrace_ready__", None)
        return bool(probe()) if probe is not None else None

    def wait(self, handle: Any) -> None:
        handle.__goodtrace_wait__()

    def to_float(self, handle: Any) -> float:
        reader = getattr(handle, "__goodtrace_float__", None)
        if reader is not None:
            return float(reader())
        handle.__goodtrace_wait__()
        return float(handle)

    def barrier(self, handle: Any) -> bool:
        barrier = getattr(handle, "__goodtrace_barrier__", None)
        if barrier is None:
            return False
        barrier()
        return True


class _RegisteredValue:
    """A type made known with :func:`register_value_type`."""

    host = False

    def __init__(
        self, ready: Callable[[Any], bool], wait: Callable[[Any], None],
        to_float: Callable[[Any], float] | None, barrier: Callable[[Any], None] | None,
    ) -> None:
        self._ready = ready
        self._wait = wait
        self._to_float = to_float
        self._barrier = barrier

    def prepare(self, value: Any) -> Any:
        return value

    def prepare_read(self, value: Any) -> Any:
        return value

    def ready(self, handle: Any) -> bool | None:
        return bool(self._ready(handle))

    def wait(self, handle: Any) -> None:
        self._wait(handle)

    def to_float(self, handle: Any) -> float:
        if self._to_float is not None:
            return float(self._to_float(handle))
        self._wait(handle)
        return float(handle)

    def barrier(self, handle: Any) -> bool:
        if self._barrier is None:
            return False
        self._barrier(handle)
        return True


class _Sequence:
    """A tuple/list/dict of values: complete when every leaf is."""

    host = False

    def prepare(self, value: Any) -> Any:
        leaves = list(value.values()) if isinstance(value, dict) else list(value)
        handles = []
        for leaf in leaves:
            adapter = adapter_for(leaf)
            handle = adapter.prepare(leaf)
            if isinstance(handle, HostTimed):  # one leaf cannot be tested: nor can the whole
                return handle
            handles.append((_HOST, leaf) if handle is COMPLETE else (adapter, handle))
        return handles

    def prepare_read(self, value: Any) -> Any:
        return self.prepare(value)

    def ready(self, handle: Any) -> bool | None:
        states = [adapter.ready(leaf) for adapter, leaf in handle]
        if any(state is False for state in states):
            return False
        return True if all(state is True for state in states) else None

    def wait(self, handle: Any) -> None:
        for adapter, leaf in handle:
            adapter.wait(leaf)

    def to_float(self, handle: Any) -> float:
        raise UnsupportedValue("a metric must be a scalar, not a sequence")

    def barrier(self, handle: Any) -> bool:
        return any(adapter.barrier(leaf) for adapter, leaf in handle)


def join_completions(first: tuple[ValueAdapter, Any], second: tuple[ValueAdapter, Any]) -> tuple[ValueAdapter, Any]:
    """One completion from two of a step (a second ``complete_on`` in one step): complete
    when both are."""
    if first[0] is _JOINED:
        return (_JOINED, [*first[1], second])
    return (_JOINED, [first, second])


_HOST = HostNumber()
_JOINED = _Sequence()
_ADAPTERS: dict[type, ValueAdapter] = {int: _HOST, float: _HOST, bool: _HOST}
_LAZY_MODULES: tuple[tuple[str, str], ...] = (
    ("torch", "goodtrace.record.values.torch_values"),
    ("jax", "goodtrace.record.values.jax_values"),
    ("jaxlib", "goodtrace.record.values.jax_values"),
)


_REGISTERED: dict[type, ValueAdapter] = {}


def register_value_type(
    cls: type[T],
    *,
    ready: Callable[[T], bool],
    wait: Callable[[T], None],
    to_float: Callable[[T], float] | None = None,
    barrier: Callable[[T], None] | None = None,
) -> None:
    """Teach ``complete_on`` and ``metric`` a value type of your own (an array or future type).

    ``ready(v)`` says, without waiting, whether ``v`` is complete: goodtrace calls it from its
    readiness thread to date the step's completion, so it must be thread-safe and cheap.
    ``wait(v)`` blocks until ``v`` is complete. ``to_float(v)`` reads a scalar for metrics
    (default: ``wait(v)`` then ``float(v)``). ``barrier(v)`` waits for everything dispatched so
    far on ``v``'s device: goodtrace calls it, on a value of an earlier step, before a blocking
    span (checkpoint, eval) that starts in a step which has no completion value yet.

    Applies to ``cls`` and its subclasses, and takes precedence over the ``__goodtrace_*__``
    methods. Registering a type again replaces its functions. Raises TypeError for arguments
    that are not a class and callables (at set-up, never inside a recording call).
    """
    if not isinstance(cls, type):
        raise TypeError(f"register_value_type: cls must be a class, got {cls!r}")
    for label, function in (("ready", ready), ("wait", wait), ("to_float", to_float), ("barrier", barrier)):
        if function is not None and not callable(function):
            raise TypeError(f"register_value_type: {label} must be callable, got {function!r}")
    if ready is None or wait is None:
        raise TypeError("register_value_type: ready and wait are required")
    adapter = _RegisteredValue(ready, wait, to_float, barrier)
    _REGISTERED[cls] = adapter
    for known in list(_ADAPTERS):  # forget what subclasses were resolved to before
        if issubclass(known, cls):
            del _ADAPTERS[known]
    _ADAPTERS[cls] = adapter


def adapter_for(value: Any) -> ValueAdapter:
    """The adapter for ``value``'s type (cached per type). Raises UnsupportedValue."""
    kind = type(value)
    adapter = _ADAPTERS.get(kind)
    if adapter is None:
        adapter = _find_adapter(value)
        _ADAPTERS[kind] = adapter
    return adapter


def _find_adapter(value: Any) -> ValueAdapter:
    for registered, adapter in _REGISTERED.items():
        if isinstance(value, registered):
            return adapter
    if hasattr(value, "__goodtrace_wait__"):
        return _ProtocolValue()
    module = type(value).__module__ or ""
    root = module.split(".", 1)[0]
    for prefix, adapter_module in _LAZY_MODULES:
        if root == prefix:
            loaded = importlib.import_module(adapter_module)
            factory: Callable[[Any], ValueAdapter] = loaded.adapter_for_value
            return factory(value)
    if root == "numpy":
        return _NumpyValue()
    if isinstance(value, (int, float)):  # subclasses of int/float (IntEnum, ...)
        return _HOST
    if isinstance(value, (tuple, list, dict)):
        return _Sequence()
    if "jax" in sys.modules:  # a registered JAX pytree class (flax TrainState, equinox Module, ...)
        tree = importlib.import_module("goodtrace.record.values.jax_values").adapter_for_pytree(value)
        if tree is not None:
            return tree  # type: ignore[no-any-return]
    raise UnsupportedValue(
        f"goodtrace cannot wait on a value of type {module}.{type(value).__qualname__}; "
        "pass a Python number, NumPy value, torch tensor, JAX array, or register the type with "
        "goodtrace.register_value_type"
    )


def finite_or_none(number: float) -> float | None:
    """JSON has no NaN/inf: such metric values are written as null (and counted by readers)."""
    return number if math.isfinite(number) else None
