"""Spans in asynchronous code: a decorated coroutine or async generator is timed to its end,
and the ambient step is the one of the thread or task that entered it (a ContextVar), so a
task keeps the step it was started in. A fake clock moves only where the code says, so every
time is exact; the C fast path and the pure-Python one are both run."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from typing import Any

import pytest

import goodtrace as gt
from goodtrace.record import fastpath
from goodtrace.testing import FakeClock, capture


def _spans(cap: Any) -> list[tuple[str, int, int | None, bool]]:
    """The program's spans (not gc pauses, which may happen anywhere)."""
    return [(r["name"], r["t1"] - r["t0"], r["step"], r["err"]) for r in cap.records("span") if r["cat"] != "gc"]


def _run(main: Any) -> None:
    """``asyncio.run`` in a thread where Playwright's sync API (the session's shared Chromium,
    when a browser test ran earlier on this worker) left its own loop marked as running."""
    playwright_loop = asyncio.events._get_running_loop()
    asyncio.events._set_running_loop(None)
    try:
        asyncio.run(main)
    finally:
        asyncio.events._set_running_loop(playwright_loop)


def test_a_decorated_coroutine_is_timed_until_it_returns() -> None:
    clock = FakeClock()

    @gt.span("fetch")
    async def fetch() -> int:
        await asyncio.sleep(0)
        clock.advance(0.2)  # the 200 ms it awaits
        await asyncio.sleep(0)
        return 7

    @gt.span
    async def failing() -> None:
        clock.advance(0.05)
        await asyncio.sleep(0)
        raise ValueError("no")

    async def main() -> None:
        pending = fetch()  # created: not running yet, so not timed yet
        clock.advance(1.0)
        assert await pending == 7
        with pytest.raises(ValueError):
            await failing()

    with capture(rank=0, world_size=1, clock=clock) as cap:
        _run(main())
    label = failing.__qualname__
    assert _spans(cap) == [("fetch", 200_000_000, None, False), (label, 50_000_000, None, True)]


def test_a_decorated_async_generator_is_timed_from_its_first_item_to_its_end() -> None:
    clock = FakeClock()

    @gt.span("batches")
    async def batches() -> Any:
        for k in range(3):
            clock.advance(0.01)
            received = yield k
            if received is not None:
                yield received * 10

    async def main() -> None:
        assert [b async for b in batches()] == [0, 1, 2]
        items = batches()
        assert await items.__anext__() == 0
        assert await items.asend(4) == 40  # asend reaches the wrapped generator
        await items.aclose()  # closed early: the span ends here

    with capture(rank=0, world_size=1, clock=clock) as cap:
        _run(main())
    assert _spans(cap) == [("batches", 30_000_000, None, False), ("batches", 10_000_000, None, False)]


def test_a_task_keeps_the_step_it_was_started_in() -> None:
    """The old process global gave a task started in step 0 the step the loop was in when the
    task's span ended (1); another thread that never entered a step still sees the loop's."""
    seen: dict[str, int | None] = {}

    async def main() -> None:
        release = asyncio.Event()

        async def writer() -> None:
            await release.wait()
            with gt.span("upload"):
                pass

        with gt.step(0):
            task = asyncio.create_task(writer())
        with gt.step(1):
            release.set()
            await task
            with gt.span("compute"):
                pass
            thread = threading.Thread(target=lambda: seen.update(other=gt.current_step()))
            thread.start()
            thread.join()
            seen["task"] = await asyncio.create_task(_current())

    async def _current() -> int | None:
        return gt.current_step()

    with capture(rank=0, world_size=1) as cap:
        _run(main())
    assert [(name, step) for name, _, step, _ in _spans(cap)] == [("upload", 0), ("compute", 1)]
    assert seen == {"other": 1, "task": 1}


@pytest.mark.processes
def test_the_pure_python_spans_read_the_same_steps() -> None:
    """The same module under GOODTRACE_PURE_PYTHON=1 (its own process: the choice is made at import)."""
    if fastpath.SPANS == "python":
        pytest.skip("this process already runs the pure-Python spans")
    code = "import pytest, sys; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-m', 'not processes', __file__]))"
    done = subprocess.run([sys.executable, "-c", code.replace("__file__", repr(__file__))],
                          capture_output=True, text=True, timeout=120, env={**__import__("os").environ,
                                                                           "GOODTRACE_PURE_PYTHON": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
