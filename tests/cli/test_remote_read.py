"""``goodtrace report`` and ``goodtrace trace --steps`` on a run that lives elsewhere, run
(in-process, tests/helpers/cli.py) against servers really started here: an S3-compatible store (moto on 127.0.0.1,
read through the local mirror) and an emulated network filesystem (a FUSE mount, read as a
path). Each gives the same output as the local copy; a second read from S3 fetches nothing; a
compacted run on S3 is read from Parquet; a store that cannot be reached, or no credentials, is
one error line. ``goodtrace records`` and ``goodtrace export`` read a URL through the same mirror. Skipped, with the reason, only where FUSE may not mount or the S3 packages are
missing."""

from __future__ import annotations

import io
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from goodtrace.read.duckdb_sql import SEGMENT_NAMES
from goodtrace.read.io_pool import on_network_filesystem
from helpers.cli import Ran
from helpers.cli import goodtrace as run_goodtrace
from helpers.storage_servers import EmulatedNFS, S3Server

DATA = Path(__file__).parent.parent / "data"
RESTART = DATA / "runs" / "restart_2ranks"  # 2 ranks, a crash and a restart; figures by hand
GOLDEN = DATA / "golden_trace_small" / "run"  # 3 ranks, 2 attempts, nested spans
MIRROR_NOTE = "read from a local mirror of "


def goodtrace(*args: str, env: dict[str, str] | None = None) -> Ran:
    return run_goodtrace(*args, env=env)


def report(run: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = goodtrace("report", run, "--json", env=env)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def comparable(result: dict[str, Any]) -> dict[str, Any]:
    """A report minus where it was read from: its path and the mirror's note."""
    out = {k: v for k, v in result.items() if k != "path"}
    out["warnings"] = [w for w in result["warnings"] if not w.startswith(MIRROR_NOTE)]
    return out


def trace(run: str, target: Path, env: dict[str, str] | None = None) -> Any:
    done = goodtrace("trace", run, "--steps", "2:5", "-o", str(target), env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(target.read_text())


def upload(s3: S3Server, local: Path) -> str:
    """``local`` copied to a fresh prefix of the bucket, under the same folder name."""
    from s3fs import S3FileSystem

    url = f"s3://{s3.bucket}/{uuid.uuid4().hex[:8]}/{local.name}"
    S3FileSystem(client_kwargs={"endpoint_url": s3.endpoint}, key="testing", secret="testing").put(
        str(local) + "/", url, recursive=True)
    return url


@pytest.mark.parametrize("source", [RESTART, GOLDEN], ids=["restart_2ranks", "golden_trace_small"])
@pytest.mark.processes
@pytest.mark.s3
def test_report_and_trace_from_s3_equal_the_local_ones(source: Path, s3: S3Server, tmp_path: Path) -> None:
    url = upload(s3, source)
    env = {**s3.env, "GOODTRACE_CACHE_DIR": str(tmp_path / "cache")}
    s3.reset()
    remote = report(url, env)
    assert s3.stats()["operations"]["LIST"] == 1
    local = report(str(source))
    assert remote["path"] == url  # as typed; the warning names the mirror read
    assert any(w.startswith(f"{MIRROR_NOTE}{url!r}") for w in remote["warnings"])
    assert comparable(remote) == comparable(local)

    s3.reset()
    assert trace(url, tmp_path / "remote.json", env) == trace(str(source), tmp_path / "local.json")
    assert s3.stats()["operations"] == {"LIST": 1}  # the second read fetched nothing


@pytest.mark.processes
def test_compacted_run_on_s3_is_read_from_parquet(s3: S3Server, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(RESTART, run)
    done = goodtrace("compact", str(run))
    assert done.returncode == 0, done.stderr
    url = upload(s3, run)
    env = {**s3.env, "GOODTRACE_CACHE_DIR": str(tmp_path / "cache")}
    s3.reset()
    remote = report(url, env)
    assert remote["form"] == "parquet"
    # the manifest, the Parquet copy and the stored segment tables (compact is the cache); no segment
    assert s3.stats()["operations"] == {"LIST": 1, "GET": 2 + len(SEGMENT_NAMES)}
    assert comparable(remote) == comparable(report(str(run)))
    assert trace(url, tmp_path / "remote.json", env) == trace(str(run), tmp_path / "local.json")


@pytest.mark.processes
def test_records_from_s3_equal_the_local_ones(s3: S3Server, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(RESTART, run)
    assert goodtrace("compact", str(run)).returncode == 0  # records reads JSON lines: all of them
    url = upload(s3, run)
    env = {**s3.env, "GOODTRACE_CACHE_DIR": str(tmp_path / "cache")}
    s3.reset()
    remote = goodtrace("records", url, "--json", env=env)
    assert remote.returncode == 0, remote.stderr
    assert s3.stats()["operations"] == {"LIST": 1, "GET": 4}
    local = goodtrace("records", str(run), "--json")
    assert json.loads(remote.stdout)["sessions"] == json.loads(local.stdout)["sessions"]


@pytest.mark.processes
def test_export_from_s3_equals_the_local_export(s3: S3Server, tmp_path: Path) -> None:
    """``goodtrace export`` reads a URL as ``report`` does (it refused any path not on this
    machine): the same points in TensorBoard as from the local copy."""
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    url = upload(s3, RESTART)
    env = {**s3.env, "GOODTRACE_CACHE_DIR": str(tmp_path / "cache")}
    scalars = {}
    for where, source in (("remote", url), ("local", str(RESTART))):
        done = goodtrace("export", source, "--to", "tensorboard", str(tmp_path / where), env=env)
        assert done.returncode == 0, done.stderr
        assert "exported 10 step rows" in done.stdout
        reader = event_accumulator.EventAccumulator(str(tmp_path / where))
        reader.Reload()
        scalars[where] = {tag: [(e.step, e.value) for e in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]}
    assert scalars["remote"] == scalars["local"] and "goodtrace/summary/goodput" in scalars["local"]


@pytest.mark.processes
@pytest.mark.s3
def test_watch_from_s3_shows_what_it_shows_of_the_local_copy(s3: S3Server, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from goodtrace.cli.commands.watch import View
    from goodtrace.renderers.watch import render_watch

    def frame(run: str, view: View) -> str:
        view.look()
        while view.follower.pending:
            view.look()
        console = Console(record=True, width=200, file=io.StringIO())
        console.print(render_watch(view.state, 1_700_000_100 * 10**9, run))
        return console.export_text().replace(run, "RUN")

    url = upload(s3, RESTART)
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    # rank 1's newest process from its last two step completions, ranged reads; its first not read;
    # rank 0's newest from its start a few hundred bytes a look
    remote = frame(url, View(url, tail_steps=2, poll_bytes=512))
    assert remote == frame(str(RESTART), View(str(RESTART), tail_steps=2, poll_bytes=512))
    assert "finished" in remote and "goodput" in remote


@pytest.mark.fuse
@pytest.mark.processes
@pytest.mark.s3
def test_watch_of_many_ranks_from_s3_and_a_network_share_shows_the_local_frame(
        s3: S3Server, nfs: EmulatedNFS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """64 ranks (two attempts, killed ranks' torn lines, lines that are no record): headers, tails,
    step histories and each look's reads go to many files at once there, and the frame is the
    local copy's (the table's 32 ranks that most need a look, the problems, the goodput)."""
    from goodtrace.cli.commands.watch import View
    from goodtrace.renderers.watch import render_watch
    from helpers.many_ranks import write_many_ranks

    def frame(run: str) -> str:
        view = View(run, tail_steps=9, present_steps=3, poll_bytes=4096)  # 6 steps of each rank's past read back
        view.state.alive = None  # (the written run's hosts and pids are not this machine's)
        histories = len(view.follower.history_behind())  # ranks whose past is read back
        view.look(history_s=None)
        while view.follower.pending:
            view.look(history_s=None)
        assert not view.state.history and histories >= 32
        console = Console(record=True, width=200, file=io.StringIO())
        console.print(render_watch(view.state, view.state.newest_seen() + 10**9, run))
        return console.export_text().replace(run, "RUN")

    local = write_many_ranks(tmp_path / "run")
    url = upload(s3, local)
    shared = Path(nfs.serve_dir) / uuid.uuid4().hex[:8] / "run"
    shutil.copytree(local, shared)
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    expected = frame(str(local))
    assert "Ranks: the 32 of 64 that most need a look" in expected and "goodput" in expected, expected
    assert frame(url) == expected
    assert frame(os.path.join(nfs.mountpoint, shared.parent.name, "run")) == expected


@pytest.mark.fuse
@pytest.mark.processes
def test_report_and_trace_from_a_network_share(nfs: EmulatedNFS, tmp_path: Path) -> None:
    name = uuid.uuid4().hex[:8]
    shutil.copytree(GOLDEN, Path(nfs.serve_dir) / name / "run")
    shared = os.path.join(nfs.mountpoint, name, "run")
    nfs.command("reset")
    remote = report(shared)
    assert nfs.stats()["ops"].get("read", 0) > 0  # it really went through the FUSE server
    local = report(str(GOLDEN))
    assert remote["path"] == shared
    assert comparable(remote) == comparable(local)
    assert trace(shared, tmp_path / "remote.json") == trace(str(GOLDEN), tmp_path / "local.json")


def test_the_cache_on_a_network_share_is_written_locally_and_copied_over(nfs: EmulatedNFS, tmp_path: Path) -> None:
    """The share is seen as a network filesystem; the first report keeps the segment cache's
    chunks on it, each Parquet file written locally and copied over in a few calls (DuckDB's
    own writes are many small ones, a round trip each), and the next report reads them."""
    name = uuid.uuid4().hex[:8]
    shutil.copytree(GOLDEN, Path(nfs.serve_dir) / name / "run")
    shared = os.path.join(nfs.mountpoint, name, "run")
    assert on_network_filesystem(shared) and not on_network_filesystem(str(tmp_path))
    nfs.command("reset")
    env = {"GOODTRACE_CACHE_DIR": os.path.join(nfs.mountpoint, name, "cache")}  # a home on the share
    first = report(shared, env=env)
    ops = nfs.stats()["ops"]
    tables = sorted((Path(nfs.serve_dir) / name / "cache" / "segments").glob("*/*.parquet"))
    assert tables and not list(Path(nfs.serve_dir).rglob("*.partial"))
    # each table file created, written in a few large writes and renamed into place: none of
    # DuckDB's own truncations of the file it writes (a setattr round trip each), nor its writes
    assert ops.get("create", 0) >= len(tables) and ops.get("setattr", 0) == 0
    assert ops.get("write", 0) <= 4 * len(tables) + 8
    assert comparable(first) == comparable(report(str(GOLDEN)))
    nfs.command("reset")
    assert report(shared, env=env) == first  # from the chunks on the share
    assert nfs.stats()["ops"].get("create", 0) == 0  # nothing new to keep


def _one_error_line(done: Ran) -> str:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.processes
def test_unreachable_store_is_one_error_line(tmp_path: Path) -> None:
    pytest.importorskip("s3fs")
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_EC2_METADATA_DISABLED": "true", "AWS_MAX_ATTEMPTS": "1",
           "GOODTRACE_CACHE_DIR": str(tmp_path)}
    for command in (["report", "s3://bucket/run"], ["trace", "s3://bucket/run", "-o", str(tmp_path / "t.json")]):
        line = _one_error_line(goodtrace(*command, env=env))
        assert line.startswith(f"goodtrace {command[0]}: error: 's3://bucket/run': cannot list the run "
                               "(EndpointConnectionError: Could not connect")
        assert "not a goodtrace run directory" not in line


@pytest.mark.processes
def test_no_credentials_is_one_error_line(s3: S3Server, tmp_path: Path) -> None:
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=s3.endpoint, AWS_EC2_METADATA_DISABLED="true", AWS_MAX_ATTEMPTS="1",
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"),
               GOODTRACE_CACHE_DIR=str(tmp_path))
    done = run_goodtrace("report", f"s3://{s3.bucket}/run", env=env)
    line = _one_error_line(done)
    assert "cannot list the run (NoCredentialsError: Unable to locate credentials)" in line


@pytest.mark.processes
def test_a_url_without_a_run_says_so(s3: S3Server, tmp_path: Path) -> None:
    env = {**s3.env, "GOODTRACE_CACHE_DIR": str(tmp_path)}
    line = _one_error_line(goodtrace("report", f"s3://{s3.bucket}/no-such-run", env=env))
    assert line == (f"goodtrace report: error: 's3://{s3.bucket}/no-such-run' holds no goodtrace records "
                    "(no rank-*/*.jsonl files): not a goodtrace run directory")
