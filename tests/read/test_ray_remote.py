"""A run on object storage (a real local S3 server, ``helpers.storage_servers``) read as Ray
tasks on a cluster: each task fetches its own sessions' files from the URL (the driver's mirror
is on the driver only), and the JSON report is the one one process gives, to the byte, with a
long line and torn last lines among the files. A local Ray reads the driver's mirror, as the
pool does. Marked ``ray`` (a real local Ray cluster, ``ray.init(num_cpus=2)``)."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from goodtrace.read.engine import Engine
from goodtrace.read.mirror import RemoteReadError, fetch_files, mirror_run
from helpers.growing import RESTART, beats
from helpers.many_ranks import report_read_by as report
from helpers.many_ranks import write_many_ranks
from helpers.storage_servers import S3Server

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]  # one cluster


@pytest.fixture(scope="module")
def s3(ray_s3: S3Server) -> S3Server:
    """The S3 server whose credentials the cluster's workers have (tests/read/conftest.py)."""
    return ray_s3


@pytest.fixture(scope="module")
def cluster(ray_cluster: str) -> str:
    return ray_cluster


@pytest.fixture
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[S3Server]:
    import s3fs

    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("GOODTRACE_CACHE_DIR", str(tmp_path / "cache"))
    s3fs.S3FileSystem.clear_instance_cache()
    yield s3
    s3fs.S3FileSystem.clear_instance_cache()


def _upload(run: Path, s3: S3Server) -> str:
    import s3fs

    url = f"s3://{s3.bucket}/{uuid.uuid4().hex[:8]}/run"
    s3fs.S3FileSystem().put(str(run) + "/", url, recursive=True)
    return url


def _gets(s3: S3Server) -> int:
    return int(s3.stats()["operations"].get("GET", 0))


def test_cluster_tasks_fetch_their_sessions_from_the_url(cluster: str, s3_env: S3Server, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # every report here reads every file (a cached segment would not be sent to a task at all:
    # tests/read/test_ray_engine.py holds the cache on Ray)
    monkeypatch.setenv("GOODTRACE_SEGMENT_CACHE", "0")
    run = write_many_ranks(tmp_path / "run", ranks=16, long_line=True)
    files = len(list(run.rglob("*.jsonl")))
    url = _upload(run, s3_env)
    mirror_run(url)  # the driver's mirror, up to date: from here on it fetches nothing
    s3_env.reset()
    one_process = report(url, Engine(workers=1))
    assert _gets(s3_env) == 0
    labels: list[str] = []
    on_cluster = report(url, Engine(ray=cluster), labels)
    assert "reading rank files on Ray" in labels
    assert _gets(s3_env) >= files  # every file fetched again, by the tasks
    assert on_cluster == one_process
    s3_env.reset()
    assert report(url, Engine(ray="local")) == one_process  # a local Ray reads the driver's mirror
    assert _gets(s3_env) == 0


def test_a_cluster_task_fetches_an_open_segment_from_where_the_cache_left_off(
    cluster: str, s3_env: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A live run's open segment that grew: the driver keeps the reduction of its first part
    (the segment cache, in its mirror), and the task that reads the rest fetches the segment's
    header line and the bytes after that part, not the segment whole; the report is the one
    one process gives."""
    monkeypatch.setenv("GOODTRACE_SEGMENT_CACHE", "1")
    run = tmp_path / "run"
    shutil.copytree(RESTART, run)
    segment = sorted(run.glob("rank-00001/*.jsonl"))[0]  # its session crashed: the open segment
    beats(segment, 0, 16_000)
    url = _upload(run, s3_env)
    report(url, Engine(workers=1))  # mirrors the run and keeps the open segment's prefix
    before = segment.stat().st_size
    beats(segment, 16_000, 200)
    rel = segment.relative_to(run).as_posix()
    import s3fs

    s3fs.S3FileSystem().put_file(str(segment), f"{url}/{rel}")
    mirror_run(url)  # the driver's mirror gains the new bytes (tests/read/test_mirror.py)
    s3_env.reset()
    labels: list[str] = []
    on_cluster = report(url, Engine(ray=cluster), labels)
    assert "reading rank files on Ray" in labels
    stats = s3_env.stats()
    # the task: the segment's first bytes (its header line) and the bytes it gained
    # (and the other crashed session's, whose range is empty: its header line)
    assert stats["operations"] == {"LIST": 1, "GET": 3}
    assert stats["bytes_out"] < 2 * 4096 + (segment.stat().st_size - before) + 16_384 < before
    monkeypatch.setenv("GOODTRACE_SEGMENT_CACHE", "0")
    assert on_cluster == report(url, Engine(workers=1))


def test_a_file_cut_short_or_gone_is_one_error(s3_env: S3Server, tmp_path: Path) -> None:
    """What a task fetches is what the driver mirrored: fewer bytes than that, or no file, is a
    RemoteReadError naming the URL (the Ray task's failure, which the driver reports as one line)."""
    run = write_many_ranks(tmp_path / "run", ranks=1)
    url = _upload(run, s3_env)
    segment = next(run.rglob("*.jsonl"))
    rel = segment.relative_to(run).as_posix()
    size = segment.stat().st_size
    fetched = fetch_files({"a": (f"{url}/{rel}", size - 1)}, str(tmp_path / "fetched"))
    assert Path(fetched["a"]).read_bytes() == segment.read_bytes()[:-1]
    assert Path(fetched["a"]).relative_to(tmp_path / "fetched").as_posix() == rel  # named as the warnings name it
    with pytest.raises(RemoteReadError, match=r"cannot fetch .*cut short or replaced"):
        fetch_files({"a": (f"{url}/{rel}", size + 1)}, str(tmp_path / "again"))
    with pytest.raises(RemoteReadError, match=r"cannot fetch .*FileNotFoundError"):
        fetch_files({"a": (f"{url}/rank-00009/gone.jsonl", 10)}, str(tmp_path / "gone"))
