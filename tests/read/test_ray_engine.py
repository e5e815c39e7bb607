"""The reader's per-session fold as Ray tasks on a real local Ray cluster (``ray.init(num_cpus=2)``)
gives the report one process gives, to the byte: on a run with a crash and a restart (the golden
``restart_2ranks``) and on a generated 64-rank run; and ``goodtrace report --ray ADDRESS`` joins
a running cluster. Slow to start (about 10 s): marked ``ray`` (``-m ray`` / ``-m 'not ray'``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from goodtrace.read.engine import Engine
from goodtrace.read.environment import run_cache_dir
from goodtrace.read.segment_cache import ENV_SEGMENT_CACHE
from helpers.many_ranks import report_read_by as report
from helpers.many_ranks import write_many_ranks

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.processes, pytest.mark.ray, pytest.mark.xdist_group("ray")]  # one cluster

RESTART = Path(__file__).resolve().parents[1] / "data" / "runs" / "restart_2ranks"


@pytest.fixture(scope="module")
def cluster(ray_cluster: str) -> str:
    """The folder's local Ray cluster of 2 CPUs (tests/read/conftest.py); its address."""
    return ray_cluster


def test_ray_gives_the_one_process_report(cluster: str, tmp_path: Path) -> None:
    run = write_many_ranks(tmp_path / "run", ranks=64)
    for source in (RESTART, run):
        labels: list[str] = []
        on_ray = report(source, Engine(ray="local"), labels)
        assert "reading rank files on Ray" in labels
        assert on_ray == report(source, Engine(workers=1))


def test_report_cli_joins_a_ray_cluster(cluster: str) -> None:
    env = dict(os.environ, GOODTRACE_PROGRESS="0", COLUMNS="120")

    def cli(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "goodtrace", "report", str(RESTART), "--json", *args],
                              capture_output=True, text=True, env=env, timeout=240, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert cli("--ray", cluster) == cli("--workers", "1")


def test_an_address_nothing_answers_at_is_one_error_at_once() -> None:
    """Ray retries a cluster address that nothing answers at for some 12 minutes before it fails;
    the report tries it once and says why in one line: an address, Ray Client's form of it, and
    ``auto`` where RAY_ADDRESS names a cluster that is gone."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]  # free once closed: nothing listens there
    env = dict(os.environ, GOODTRACE_PROGRESS="0", GOODTRACE_SEGMENT_CACHE="0", RAY_ADDRESS=f"127.0.0.1:{port}")
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}", "auto"):
        done = subprocess.run([sys.executable, "-m", "goodtrace", "report", str(RESTART), "--json", "--ray", address],
                              capture_output=True, text=True, env=env, timeout=240, check=False)
        assert (done.returncode, done.stdout) == (2, "")
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith(f"goodtrace report: error: cannot connect to the Ray cluster {address!r}: "
                                   "nothing answers at "), lines[0]
        assert lines[0].endswith("Connection refused)"), lines[0]


def test_ray_with_the_segment_cache_gives_the_cold_report(
    cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The driver takes the closed segments from the cache and sends Ray only the others: the
    first report (which fills the cache) and the next one (which reads it) are the cold one."""
    run = write_many_ranks(tmp_path / "run", ranks=16, long_line=True)
    monkeypatch.setenv(ENV_SEGMENT_CACHE, "0")
    cold = report(run, Engine(workers=1))
    monkeypatch.setenv(ENV_SEGMENT_CACHE, "1")
    assert report(run, Engine(ray="local")) == cold
    assert list(Path(run_cache_dir(str(run), "segments")).glob("*.json"))
    labels: list[str] = []
    assert report(run, Engine(ray="local"), labels) == cold
    assert "reading rank files on Ray" in labels  # the segments never closed (crashed sessions)
