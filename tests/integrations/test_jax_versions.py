"""The JAX integration on the older APIs it declares (jax 0.4.30+), emulated on this JAX.

Read from the releases' sources (and run on jax 0.4.30): ``jax.monitoring`` has public
``unregister_*`` functions from 0.8.1 (``jax._src.monitoring`` had private ones all along),
and on CPU, processes can gather across each other only from 0.5.1 (CPU collectives by
default). Each test puts this JAX in the older shape and checks the feature works, or degrades
with one warning.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

import goodtrace as gt
from goodtrace.testing import capture

jax = pytest.importorskip("jax")
from goodtrace.integrations import jax as gj  # noqa: E402
from goodtrace.record.values import jax_compile  # noqa: E402


def test_listeners_come_off_without_the_public_unregister_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    from jax._src import monitoring

    # jax < 0.8.1: no public unregister_*, only jax._src.monitoring's private *_by_callback
    for public, private in (("unregister_event_duration_listener", "_unregister_event_duration_listener_by_callback"),
                            ("unregister_event_listener", "_unregister_event_listener_by_callback")):
        if not hasattr(monitoring, private):
            monkeypatch.setattr(monitoring, private, getattr(monitoring, public), raising=False)
        monkeypatch.delattr(jax.monitoring, public, raising=False)
    jax_compile.install()
    jax_compile.uninstall()
    assert not jax_compile.is_installed()
    callbacks = [getattr(listener, "callback", listener) for listener in monitoring.get_event_duration_listeners()]
    assert jax_compile._on_duration not in callbacks
    jax_compile.install()  # as the other tests expect it
    assert jax_compile.is_installed()


class _Client:
    """A coordination client whose every call fails (the clock alignment warns and goes on)."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError("no coordination service in this test")

        return fail


def test_no_gather_across_processes_turns_the_live_line_off_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(gj, "_client", lambda: _Client())

    def no_collectives(*args: Any, **kwargs: Any) -> None:  # what jaxlib < 0.5.1 says on CPU
        raise RuntimeError("INVALID_ARGUMENT: Multiprocess computations aren't implemented on the CPU backend.")

    monkeypatch.setattr(gj, "JaxTransport", no_collectives)
    with warnings.catch_warnings(record=True) as caught, capture(record_gc=False) as cap:
        warnings.simplefilter("always")
        integration = gj.instrument(log_every=1, printer=lambda line: None)
        for step in (1, 2, 3):
            with gt.step(step):
                gt.metric("loss", float(step))
    assert isinstance(integration, gj.JaxIntegration) and integration.aggregator is None
    live = [str(w.message) for w in caught if "the live line is off" in str(w.message)]
    assert len(live) == 1 and "jax_cpu_collectives_implementation" in live[0]
    assert [r["value"] for r in cap.records("metric") if r["name"] == "loss"] == [1.0, 2.0, 3.0]
