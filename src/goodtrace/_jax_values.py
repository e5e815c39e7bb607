"""Adapter for JAX arrays; imported only when the program passes one to goodtrace.

Readiness is ``Array.is_ready()`` (non-blocking); waiting is ``jax.block_until_ready``. Both
work on every backend, CPU included, where dispatch is asynchronous too.
"""

from __future__ import annotations

from typing import Any

import jax

from goodtrace._values import UnsupportedValue


class _JaxArray:
    host = False

    def prepare(self, value: Any) -> Any:
        return value

    def ready(self, handle: Any) -> bool | None:
        probe = getattr(handle, "is_ready", None)
        return bool(probe()) if probe is not None else None

    def wait(self, handle: Any) -> None:
        jax.block_until_ready(handle)

    def to_float(self, handle: Any) -> float:
        if getattr(handle, "size", 1) != 1:
            raise UnsupportedValue(f"a metric must be a scalar, got shape {getattr(handle, 'shape', '?')}")
        return float(handle)


def adapter_for_value(value: Any) -> Any:
    return _JaxArray()
