"""Shared test setup: ``helpers`` (record builders, the headless browser) importable from every
layer's test folder. Tests are grouped by the package layer they exercise: ``record/``,
``read/``, ``analysis/``, ``renderers/``, ``integrations/``, ``cli/`` (and ``test_layers.py``)."""

from __future__ import annotations

import functools
import json
import multiprocessing.process
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from helpers import browser as browser_helpers
from helpers import storage_servers
from helpers.storage_servers import EmulatedNFS, S3Server, fuse_unavailable, s3_server


@pytest.fixture(scope="session", autouse=True)
def _reader_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Readers keep their caches in ``GOODTRACE_CACHE_DIR``: one of this session's (its child
    processes inherit it), never the user's."""
    saved = os.environ.get("GOODTRACE_CACHE_DIR")
    os.environ["GOODTRACE_CACHE_DIR"] = str(tmp_path_factory.mktemp("goodtrace-cache"))
    yield
    if saved is None:
        os.environ.pop("GOODTRACE_CACHE_DIR", None)
    else:
        os.environ["GOODTRACE_CACHE_DIR"] = saved


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A local S3 server (moto) for the tests of one module; skipped where it cannot start."""
    yield from s3_server(tmp_path_factory, "s3")


@pytest.fixture(scope="module")
def nfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedNFS]:
    """The emulated NFS (FUSE, 0.5 ms per operation) for one module; skipped where FUSE is not
    permitted."""
    reason = fuse_unavailable()
    if reason:
        pytest.skip(reason)
    with EmulatedNFS(str(tmp_path_factory.mktemp("nfs")), rtt_ms=0.5) as server:
        yield server


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    """One headless Chromium (Playwright) for the whole session; each test opens its own pages
    (``helpers.browser.new_page``: a fresh context each)."""
    with browser_helpers.browser() as instance:
        yield instance


# ---------------------------------------------------------------------------------------------
# Parallel runs (pytest-xdist, ``-n auto --dist loadgroup`` in the README's command): a module's
# tests go to one worker together, so that its module fixtures (the demo run, a local S3
# server, the emulated NFS) start once; tests marked ``xdist_group(NAME)`` go together under
# NAME instead (the Ray cluster's modules; the fuzz test's parts, each a group of its own).


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadGroupScheduling

    class ModuleOrGroup(LoadGroupScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            group = super()._split_scope(nodeid)  # the xdist_group's name, else the test itself
            return group if group != nodeid else nodeid.split("::", 1)[0]

    return ModuleOrGroup(config, log)


# ---------------------------------------------------------------------------------------------
# Markers: every test is a unit test unless it uses one of the slower real parts below; the
# README's command runs them all, ``-m unit`` only the fast ones (see README, "Running parts of
# the suite"). A test is classified by its module's ``pytestmark`` or its own ``pytest.mark``
# (``processes``, ``slow``, ...), and by the fixtures it uses (``FIXTURE_MARKS``). What a test
# really did is watched while it runs (``_Watch``): a test classified unit that starts a process,
# a browser, FUSE or the S3 server fails, and one that takes longer than UNIT_BUDGET_S is listed
# at the end, so an unmarked slow test is visible.

PART_MARKS = ("processes", "browser", "fuse", "s3", "slow", "ray")
UNIT_BUDGET_S = 2.0
FIXTURE_MARKS = {"s3": "s3", "nfs": "fuse", "chromium": "browser"}
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for name, mark in FIXTURE_MARKS.items():
            if name in getattr(item, "fixturenames", ()):
                item.add_marker(mark)
        if not any(item.get_closest_marker(name) for name in PART_MARKS):
            item.add_marker("unit")


class _Watch:
    """What the running test really used: processes started from its thread, FUSE, S3, Chromium."""

    def __init__(self) -> None:
        self.used: set[str] = set()
        self.detail: list[str] = []
        self.thread: int | None = None

    def saw(self, what: str, detail: str) -> None:
        if threading.get_ident() == self.thread:
            self.used.add(what)
            self.detail.append(detail)


_WATCH = _Watch()
_SLOW_UNITS: list[tuple[str, float]] = []


def _wrap(owner: Any, name: str, what: str, describe: Callable[..., str]) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def watched(*args: Any, **kwargs: Any) -> Any:
        _WATCH.saw(what, describe(*args, **kwargs))
        return original(*args, **kwargs)

    setattr(owner, name, watched)


def pytest_configure(config: pytest.Config) -> None:
    _wrap(subprocess.Popen, "__init__", "processes", lambda self, args, *a, **k: f"process {str(args)[:80]}")
    _wrap(multiprocessing.process.BaseProcess, "start", "processes", lambda self: f"process {self.name}")
    _wrap(storage_servers.EmulatedNFS, "__enter__", "fuse", lambda self: "the emulated NFS (FUSE)")
    _wrap(storage_servers.S3Server, "__enter__", "s3", lambda self: "the S3 server")
    _wrap(browser_helpers, "require_browser", "browser", lambda: "Chromium")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _WATCH.used, _WATCH.detail, _WATCH.thread = set(), [], threading.get_ident()
    started = time.perf_counter()
    yield
    seconds = time.perf_counter() - started
    _WATCH.thread = None
    profile = os.environ.get("GOODTRACE_TEST_PROFILE")
    if profile:
        with open(profile, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"test": item.nodeid, "s": round(seconds, 3), "used": sorted(_WATCH.used),
                                     "worker": os.environ.get("PYTEST_XDIST_WORKER"), "at": round(time.time(), 1),
                                     "marks": sorted(m.name for m in item.iter_markers())}) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A unit test's time over UNIT_BUDGET_S goes with its teardown report (to the controller,
    under pytest-xdist), which pytest_runtest_logreport collects for the summary."""
    if call.when == "setup":
        item.stash[_STARTED] = call.start
    outcome = yield
    if call.when == "teardown" and item.get_closest_marker("unit"):
        seconds = call.stop - item.stash.get(_STARTED, call.start)
        if seconds > UNIT_BUDGET_S:
            outcome.get_result().user_properties.append(("goodtrace_slow_unit", seconds))


_STARTED = pytest.StashKey[float]()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for name, value in report.user_properties:
        if name == "goodtrace_slow_unit":
            _SLOW_UNITS.append((report.nodeid, float(value)))
        elif name == "goodtrace_mismarked":
            _MISMARKED.append(str(value))


@pytest.fixture(autouse=True)
def _unit_tests_stay_unit(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test classified unit that starts a process, FUSE, S3 or Chromium fails (an error in its
    teardown) and is named in the summary: mark it, so that `-m unit` stays fast."""
    yield
    if request.node.get_closest_marker("unit") and _WATCH.used:
        line = (f"{request.node.nodeid} is classified unit but used {'; '.join(sorted(set(_WATCH.detail)))}: "
                f"mark it ({', '.join(sorted(_WATCH.used))}) in the module (pytestmark) or on the test")
        request.node.user_properties.append(("goodtrace_mismarked", line))  # for the summary
        pytest.fail(line, pytrace=False)


_MISMARKED: list[str] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _MISMARKED:
        terminalreporter.section("tests classified unit that start processes, FUSE, S3 or Chromium")
        for line in _MISMARKED:
            terminalreporter.write_line(line)
    if _SLOW_UNITS:
        terminalreporter.section("unit tests over the unit budget")
        terminalreporter.write_line(
            f"these tests are classified unit but took over {UNIT_BUDGET_S} s: mark them slow "
            "(@pytest.mark.slow on the test) or make them faster")
        for nodeid, seconds in sorted(_SLOW_UNITS, key=lambda x: -x[1]):
            terminalreporter.write_line(f"  {seconds:6.2f} s  {nodeid}")
