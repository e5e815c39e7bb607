"""Adapter for JAX values; imported only when the program passes one to goodtrace.

A ``jax.Array`` is ready when ``Array.is_ready()`` says so (a non-blocking probe); waiting is
``Array.block_until_ready()``. Both work on every backend, CPU included, where dispatch is
asynchronous too. A pytree of arrays (``JaxTree``, or any value JAX flattens) is ready when
every leaf is. The device barrier (before a blocking span in a step with no completion value
yet) is :func:`device_barrier`. Importing this module also installs the JAX compile listeners
(:func:`goodtrace.record.values.jax_compile.install`), so compilations are recorded from then on even
when the program never calls ``install()`` itself.
"""

from __future__ import annotations

from typing import Any

import jax

from goodtrace.record.values import jax_compile
from goodtrace.record.values.protocol import UnsupportedValue


def device_barrier() -> None:
    """Wait for everything JAX has dispatched so far: its ordered effects
    (``jax.effects_barrier()``), then every live array that is not ready yet (a test of each
    live array, a wait only for those still being computed)."""
    jax.effects_barrier()  # type: ignore[no-untyped-call]
    for array in jax.live_arrays():  # type: ignore[no-untyped-call]
        try:
            if not array.is_ready():
                array.block_until_ready()
        except Exception:  # deleted or donated meanwhile: nothing to wait for
            continue


def _array_ready(leaf: Any) -> bool | None:
    probe = getattr(leaf, "is_ready", None)
    return bool(probe()) if probe is not None else None


def _scalar(handle: Any) -> float:
    if getattr(handle, "size", 1) != 1:
        raise UnsupportedValue(f"a metric must be a scalar, got shape {getattr(handle, 'shape', '?')}")
    if getattr(handle, "is_fully_addressable", True) is False:
        # A global array spread over processes: every process holds the (replicated) scalar.
        handle = handle.addressable_data(0)
    return float(handle)


class JaxArrayAdapter:
    """One ``jax.Array``: the handle is the array itself (no copy, no device work)."""

    host = False

    def prepare(self, value: Any) -> Any:
        if isinstance(value, jax.core.Tracer):
            raise UnsupportedValue(
                "got a JAX tracer: call complete_on/metric outside jit-compiled functions, "
                "on the values they return"
            )
        return value

    def prepare_read(self, value: Any) -> Any:
        return self.prepare(value)

    def ready(self, handle: Any) -> bool | None:
        return _array_ready(handle)

    def wait(self, handle: Any) -> None:
        handle.block_until_ready()

    def to_float(self, handle: Any) -> float:
        return _scalar(handle)

    def barrier(self, handle: Any) -> bool:
        device_barrier()
        return True


class JaxTreeAdapter:
    """A pytree: the handle is its list of array leaves; ready when every leaf is."""

    host = False

    def prepare(self, value: Any) -> Any:
        tree = value.tree if isinstance(value, JaxTree) else value
        return [leaf for leaf in jax.tree_util.tree_leaves(tree) if isinstance(leaf, jax.Array)]

    def prepare_read(self, value: Any) -> Any:
        return self.prepare(value)

    def ready(self, handle: Any) -> bool | None:
        return all(_array_ready(leaf) is not False for leaf in handle)

    def wait(self, handle: Any) -> None:
        for leaf in handle:
            leaf.block_until_ready()

    def to_float(self, handle: Any) -> float:
        if len(handle) != 1:
            raise UnsupportedValue(f"a metric must be a scalar, got a pytree of {len(handle)} arrays")
        return _scalar(handle[0])

    def barrier(self, handle: Any) -> bool:
        device_barrier()
        return True


class JaxTree:
    """Wraps any pytree (a flax ``TrainState``, an optax state, nested dicts) for goodtrace:
    ``s.complete_on(JaxTree(state))`` completes the step when every array leaf is ready.
    Plain dicts/lists/tuples of arrays work without it; custom pytree classes need it."""

    __slots__ = ("_handle", "tree")

    def __init__(self, tree: Any) -> None:
        self.tree = tree
        self._handle = _TREE.prepare(tree)  # flatten once, on the caller's thread

    def __goodtrace_ready__(self) -> bool:
        return _TREE.ready(self._handle) is True

    def __goodtrace_wait__(self) -> None:
        _TREE.wait(self._handle)

    def __goodtrace_float__(self) -> float:
        return _TREE.to_float(self._handle)

    def __goodtrace_barrier__(self) -> None:
        device_barrier()


_ARRAY = JaxArrayAdapter()
_TREE = JaxTreeAdapter()


def adapter_for_value(value: Any) -> JaxArrayAdapter | JaxTreeAdapter:
    """The adapter for a value whose type lives in ``jax``/``jaxlib`` (chosen once per type)."""
    if isinstance(value, jax.Array):
        return _ARRAY
    return _TREE


def adapter_for_pytree(value: Any) -> JaxTreeAdapter | None:
    """The pytree adapter when ``value`` is a registered JAX pytree node (a flax
    ``TrainState``, an equinox module, ...) holding at least one ``jax.Array``; else None.
    For :mod:`goodtrace.record.values.adapters` to try before giving up on an unknown type."""
    leaves = jax.tree_util.tree_leaves(value)
    if len(leaves) == 1 and leaves[0] is value:
        return None  # not a container: JAX treats it as a leaf
    return _TREE if any(isinstance(leaf, jax.Array) for leaf in leaves) else None


try:
    jax_compile.install()  # compilations are recorded from the first JAX value on
except Exception:  # an optional feature must never break reading a value
    pass
