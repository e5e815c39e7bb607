"""The reader's per-session fold as Ray tasks on a real local Ray cluster (``ray.init(num_cpus=2)``)
gives the report one process gives, to the byte: on a run with a crash and a restart (the golden
``restart_2ranks``) and on a generated 64-rank run; and ``goodtrace report --ray ADDRESS`` joins
a running cluster. Slow to start (about 10 s): marked ``ray`` (``-m ray`` / ``-m 'not ray'``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from goodtrace.read.compact import COMPACT_DIR
from goodtrace.read.engine import Engine
from goodtrace.read.segment_cache import CACHE_DIR, ENV_SEGMENT_CACHE
from helpers.many_ranks import report_read_by as report
from helpers.many_ranks import write_many_ranks

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray

RESTART = Path(__file__).resolve().parents[1] / "data" / "runs" / "restart_2ranks"


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A local Ray cluster of 2 CPUs, started in this process; its address."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


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
    assert list((run / COMPACT_DIR / CACHE_DIR).glob("*.json"))
    labels: list[str] = []
    assert report(run, Engine(ray="local"), labels) == cold
    assert "reading rank files on Ray" in labels  # the segments never closed (crashed sessions)
