"""The local mirror of a run on object storage, against a real S3 server (moto on 127.0.0.1,
``helpers.storage_servers``), counting what the server was asked: one listing, every file
fetched once, then only what is new or changed; segments gone from the source go from the
mirror; a compacted run is fetched as its Parquet copy (its covered segments not at all).
Failures that need no server (a fetch failing part-way, a bad setting) and the progress
callback run on fsspec's in-memory filesystem. Skipped, with the reason, only where the S3
packages are missing."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from goodtrace.analysis import analyze
from goodtrace.read.duckdb_sql import SEGMENT_NAMES
from goodtrace.read.engine import Engine
from goodtrace.read.load import NotARunError, compact_run, load_run
from goodtrace.read.mirror import RemoteReadError, mirror_cache_dir, mirror_run
from goodtrace.read.segment_cache import ENV_SEGMENT_CACHE
from goodtrace.renderers.json_report import render_json
from helpers.growing import RESTART, beats
from helpers.many_ranks import NOW
from helpers.storage_servers import S3Server


@pytest.fixture
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[S3Server]:
    """This process talks to the local S3 server (a fresh s3fs instance sees that); its mirror
    cache is the test's own."""
    import s3fs

    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("GOODTRACE_CACHE_DIR", str(tmp_path / "cache"))
    s3fs.S3FileSystem.clear_instance_cache()
    yield s3
    s3fs.S3FileSystem.clear_instance_cache()


def _fs() -> Any:
    import s3fs

    return s3fs.S3FileSystem()


def _upload(local: Path, s3: S3Server) -> str:
    url = f"s3://{s3.bucket}/{uuid.uuid4().hex[:8]}/run"
    _fs().put(str(local) + "/", url, recursive=True)
    return url


def _requests(s3: S3Server) -> dict[str, int]:
    return dict(s3.stats()["operations"])


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.jsonl"))}


def _grow(segment: Path, url: str, run: Path) -> None:
    with open(segment, "a", encoding="utf-8") as handle:
        handle.write('{"kind":"heartbeat","wall":1700000016000000000,"mono":1,"dropped":0}\n')
    _fs().put_file(str(segment), f"{url}/{segment.relative_to(run).as_posix()}")


@pytest.mark.processes
@pytest.mark.s3
def test_one_listing_then_only_new_or_changed_files(tmp_path: Path, s3_env: S3Server) -> None:
    run = tmp_path / "run"
    shutil.copytree(RESTART, run)
    url = _upload(run, s3_env)
    s3_env.reset()
    local = Path(mirror_run(url))
    assert _requests(s3_env) == {"LIST": 1, "GET": 4}  # one listing for all ranks, a GET per file
    assert _files(local) == _files(run)
    assert local.name == "run" and local == Path(mirror_cache_dir(url))

    s3_env.reset()
    assert Path(mirror_run(url)) == local
    assert _requests(s3_env) == {"LIST": 1}  # nothing changed: nothing fetched

    segment = sorted(run.glob("rank-00001/*.jsonl"))[-1]
    _grow(segment, url, run)
    s3_env.reset()
    mirror_run(url)
    assert _requests(s3_env) == {"LIST": 1, "GET": 1}
    assert _files(local) == _files(run)

    # Rewritten with the same size (another job's file under the same name): its ETag changed.
    data = bytearray(segment.read_bytes())
    data[data.index(b'"host":"') + 8] ^= 1
    segment.write_bytes(bytes(data))
    _fs().put_file(str(segment), f"{url}/{segment.relative_to(run).as_posix()}")
    s3_env.reset()
    mirror_run(url)
    assert _requests(s3_env) == {"LIST": 1, "GET": 1}
    assert _files(local) == _files(run)

    gone = sorted(run.glob("rank-00000/*.jsonl"))[0]
    _fs().rm_file(f"{url}/{gone.relative_to(run).as_posix()}")
    gone.unlink()
    s3_env.reset()
    mirror_run(url)
    assert _requests(s3_env) == {"LIST": 1}
    assert _files(local) == _files(run)


def test_a_grown_open_segment_is_fetched_and_parsed_as_its_new_bytes(
    tmp_path: Path, s3_env: S3Server, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An object that grew (a live rank's open segment) is fetched as the bytes after those
    mirrored and appended to the mirror's file, whose inode stays, so that the segment cache's
    prefix of it holds and a report parses only the new lines; one rewritten is fetched whole."""
    monkeypatch.setenv(ENV_SEGMENT_CACHE, "1")
    run = tmp_path / "run"
    shutil.copytree(RESTART, run)
    segment = sorted(run.glob("rank-00001/*.jsonl"))[0]  # its session crashed: the open segment
    beats(segment, 0, 16_000)
    assert segment.stat().st_size > 2**20
    url = _upload(run, s3_env)
    rel = segment.relative_to(run).as_posix()

    def report(cache: bool) -> tuple[str, int]:
        loaded = load_run(url, engine=Engine(workers=1), use_cache=cache)
        return render_json(analyze(loaded, now_wall_ns=NOW, release_records=True)), loaded.read_bytes

    report(cache=True)  # mirrors the run, keeps the open segment's prefix
    mirrored = Path(mirror_cache_dir(url)) / rel
    inode = mirrored.stat().st_ino
    before = segment.stat().st_size
    beats(segment, 16_000, 100)
    _fs().put_file(str(segment), f"{url}/{rel}")
    s3_env.reset()
    warm, read = report(cache=True)
    stats = s3_env.stats()
    new = segment.stat().st_size - before
    assert stats["operations"] == {"LIST": 1, "GET": 3}  # the mirrored head and tail, checked; the new bytes
    assert stats["bytes_out"] < 4096 + 65536 + new + 16_384 < before  # not the object whole (the rest: the listing)
    assert mirrored.stat().st_ino == inode and mirrored.read_bytes() == segment.read_bytes()
    assert read == new  # the report parsed only the lines the segment gained
    assert warm == report(cache=False)[0]

    # rewritten, not grown (another job's file under the same name, longer): fetched whole
    data = bytearray(segment.read_bytes())
    data[data.index(b'"host":"') + 8] ^= 1
    segment.write_bytes(bytes(data))
    beats(segment, 16_100, 100)
    _fs().put_file(str(segment), f"{url}/{rel}")
    warm, read = report(cache=True)
    assert mirrored.read_bytes() == segment.read_bytes() and mirrored.stat().st_ino != inode
    assert read == segment.stat().st_size
    assert warm == report(cache=False)[0]


def test_a_compacted_run_is_fetched_as_its_parquet_copy(tmp_path: Path, s3_env: S3Server) -> None:
    run = tmp_path / "run"
    shutil.copytree(RESTART, run)
    url = _upload(run, s3_env)
    before = load_run(url)  # an earlier mirror: the JSON lines
    assert before.form == "jsonl"
    compact_run(run)
    _fs().put(str(run / "compact") + "/", f"{url}/compact", recursive=True)

    s3_env.reset()
    loaded = load_run(url)
    assert loaded.form == "parquet"
    # the manifest, the Parquet copy and the reduction compact stored (a table a file); no segment
    assert _requests(s3_env) == {"LIST": 1, "GET": 2 + len(SEGMENT_NAMES)}
    mirror = Path(mirror_cache_dir(url))
    assert not list(mirror.rglob("*.jsonl"))  # the covered JSON copies went
    expected = analyze(load_run(run))
    assert analyze(loaded).partition == expected.partition

    fresh = load_run(url)  # and from an empty cache: the same two files
    assert fresh.form == "parquet"

    # A segment that grew after compaction is fetched and read from JSON beside the Parquet copy.
    _grow(sorted(run.glob("rank-00000/*.jsonl"))[-1], url, run)
    s3_env.reset()
    grown = load_run(url)
    assert _requests(s3_env) == {"LIST": 1, "GET": 1}
    assert grown.form == "parquet+jsonl"
    assert grown.records == load_run(run).records


def test_without_the_compacted_copy_every_segment_is_fetched(tmp_path: Path, s3_env: S3Server) -> None:
    """A reader of the JSON lines alone (load_run's fallback when the Parquet copy cannot be
    read) gets every segment, whatever an earlier mirror skipped."""
    run = tmp_path / "run"
    shutil.copytree(RESTART, run)
    compact_run(run)
    url = _upload(run, s3_env)
    local = Path(mirror_run(url))
    assert not _files(local)  # all four covered by the Parquet copy
    s3_env.reset()
    assert Path(mirror_run(url, use_compact=False)) == local
    assert _requests(s3_env) == {"LIST": 1, "GET": 4}
    assert _files(local) == _files(run)
    assert (local / "compact" / "records.parquet").exists()


def test_a_compacted_copy_of_another_format_does_not_replace_the_segments(tmp_path: Path, s3_env: S3Server) -> None:
    run = tmp_path / "run"
    shutil.copytree(RESTART, run)
    compact_run(run)
    manifest = run / "compact" / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "format": 999}))
    url = _upload(run, s3_env)
    s3_env.reset()
    loaded = load_run(url)
    assert loaded.form == "jsonl"
    assert _requests(s3_env) == {"LIST": 1, "GET": 6 + len(SEGMENT_NAMES)}  # the segments too
    s3_env.reset()
    load_run(url)
    assert _requests(s3_env) == {"LIST": 1}  # and the unused copy is not fetched again


def test_unreachable_store_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("s3fs")
    for name, value in {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_EC2_METADATA_DISABLED": "true",
                        "AWS_MAX_ATTEMPTS": "1"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(RemoteReadError, match=r"^'s3://bucket/run': cannot list the run \(EndpointConnectionError") as info:
        mirror_run("s3://bucket/run", cache_dir=str(tmp_path))
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------ in-memory filesystem


@pytest.fixture
def memory_run() -> Iterator[str]:
    import fsspec

    fs = fsspec.filesystem("memory")
    root = f"/{uuid.uuid4().hex[:8]}/run"
    for path in sorted(RESTART.rglob("*.jsonl")):
        fs.pipe_file(f"{root}/{path.relative_to(RESTART).as_posix()}", path.read_bytes())
    yield f"memory://{root}"
    fs.rm(root, recursive=True)


def test_progress_counts_the_fetches(tmp_path: Path, memory_run: str) -> None:
    calls: list[tuple[str, int, int]] = []
    mirror_run(memory_run, cache_dir=str(tmp_path), progress=lambda *a: calls.append(a), threads=2)
    fetches = [c for c in calls if c[0] == "fetching rank files"]
    assert fetches[0] == ("fetching rank files", 0, 4) and fetches[-1] == ("fetching rank files", 4, 4)
    assert [c[1] for c in fetches] == sorted(c[1] for c in fetches)


def test_a_failed_fetch_is_one_line_and_leaves_no_partial_file(
    tmp_path: Path, memory_run: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fsspec.implementations.memory import MemoryFileSystem

    original = MemoryFileSystem.get_file

    def failing(self: Any, rpath: str, lpath: str, *args: Any, **kwargs: Any) -> Any:
        if "rank-00001" in rpath:
            raise PermissionError("Access Denied\nfor this key")
        return original(self, rpath, lpath, *args, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "get_file", failing)
    with pytest.raises(RemoteReadError, match=r"cannot fetch '.*rank-00001/.*' \(PermissionError: Access Denied for this key\)$"):
        mirror_run(memory_run, cache_dir=str(tmp_path), threads=4)
    assert not list(tmp_path.rglob("*.part"))
    monkeypatch.setattr(MemoryFileSystem, "get_file", original)
    local = Path(mirror_run(memory_run, cache_dir=str(tmp_path)))
    assert _files(local) == _files(RESTART)


def test_settings_and_empty_runs_are_one_line(tmp_path: Path, memory_run: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOODTRACE_MIRROR_THREADS", "many")
    with pytest.raises(RemoteReadError, match="GOODTRACE_MIRROR_THREADS must be a whole number of threads"):
        mirror_run(memory_run, cache_dir=str(tmp_path))
    monkeypatch.delenv("GOODTRACE_MIRROR_THREADS")
    with pytest.raises(NotARunError, match="holds no goodtrace records") as info:
        mirror_run(memory_run + "-nothing-here", cache_dir=str(tmp_path))
    assert not isinstance(info.value, RemoteReadError)
    with pytest.raises(RemoteReadError, match=r"cannot list the run \(ValueError: Protocol not known"):
        mirror_run("nosuchprotocol://bucket/run", cache_dir=str(tmp_path))
