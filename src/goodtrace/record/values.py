"""Device-value adapters: how to tell whether a value is complete, wait for it, read a number.

An adapter is chosen by the value's type, once per type, without importing any framework:
Python numbers and NumPy values are host values (complete on arrival); torch tensors and JAX
arrays are handled by ``goodtrace.record.torch_values`` / ``goodtrace.record.jax_values``, imported only
when such a value is first passed. Any other object can take part through the protocol below.

Protocol (duck-typed): ``__goodtrace_wait__()`` blocks until the value is complete;
``__goodtrace_ready__()`` (optional) says without blocking whether it is;
``__goodtrace_float__()`` (optional) returns it as a float (for metrics).
"""

from __future__ import annotations

import importlib
import math
import sys
from collections.abc import Callable
from typing import Any

from goodtrace.record.value_types import HostNumber, UnsupportedValue, ValueAdapter

__all__ = ["UnsupportedValue", "ValueAdapter", "adapter_for", "finite_or_none"]


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


class _Sequence:
    """A tuple/list/dict of values: complete when every leaf is."""

    host = False

    def prepare(self, value: Any) -> Any:
        leaves = list(value.values()) if isinstance(value, dict) else list(value)
        return [(adapter_for(leaf), adapter_for(leaf).prepare(leaf)) for leaf in leaves]

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


_HOST = HostNumber()
_ADAPTERS: dict[type, ValueAdapter] = {int: _HOST, float: _HOST, bool: _HOST}
_LAZY_MODULES: tuple[tuple[str, str], ...] = (
    ("torch", "goodtrace.record.torch_values"),
    ("jax", "goodtrace.record.jax_values"),
    ("jaxlib", "goodtrace.record.jax_values"),
)


def adapter_for(value: Any) -> ValueAdapter:
    """The adapter for ``value``'s type (cached per type). Raises UnsupportedValue."""
    kind = type(value)
    adapter = _ADAPTERS.get(kind)
    if adapter is None:
        adapter = _find_adapter(value)
        _ADAPTERS[kind] = adapter
    return adapter


def _find_adapter(value: Any) -> ValueAdapter:
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
        tree = importlib.import_module("goodtrace.record.jax_values").adapter_for_pytree(value)
        if tree is not None:
            return tree  # type: ignore[no-any-return]
    raise UnsupportedValue(
        f"goodtrace cannot wait on a value of type {module}.{type(value).__qualname__}; "
        "pass a Python number, NumPy value, torch tensor, JAX array, or an object with "
        "__goodtrace_wait__()"
    )


def finite_or_none(number: float) -> float | None:
    """JSON has no NaN/inf: such metric values are written as null (and counted by readers)."""
    return number if math.isfinite(number) else None
