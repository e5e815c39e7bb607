"""Crash safety on every storage backend, really started here: local disk, an emulated network
filesystem (one FUSE server adding a round trip per operation, ``helpers.storage_servers``) and
an S3-compatible object store (moto in server mode on 127.0.0.1). A SIGKILLed writer loses at
most one flush interval plus one chunk on each; a frozen FUSE server stalls neither the loop
nor ``finish()`` beyond its timeout. Skipped, with the reason, only where FUSE may not mount or
the S3 packages are missing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from goodtrace.read.sessions import read_run
from helpers.loops import oversleep
from helpers.storage_servers import EmulatedNFS, S3Server, fuse_unavailable

FLUSH_S = 0.25

# Steps of 10 spans with a 1 ms "device" sleep; every 50 ms the longest chunk the writer needed
# (encode + storage call: append or upload) so far, its storage calls ended, and the time.
REPORT_S = 0.05
KILL_CHILD = textwrap.dedent(
    """
    import mmap, sys, time
    import goodtrace as gt
    run_dir, flush, progress_path = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    with open(progress_path, "w+b") as file:  # the steps it has ended, read after the kill
        file.write(bytes(8))
        file.flush()
        progress = mmap.mmap(file.fileno(), 8)
    rec = gt.init(run_dir, flush_interval_s=flush, remote_upload_interval_s=flush)
    stats = rec.writer.stats
    next_report = 0.0
    step = 0
    while True:
        with gt.step(step):
            for _ in range(10):
                with gt.span("fwd"):
                    pass
        step += 1
        progress[:8] = step.to_bytes(8, "little")  # steps 0 .. step - 1 have ended
        time.sleep(0.001)
        if time.monotonic() >= next_report:
            next_report = time.monotonic() + 0.05  # REPORT_S
            print(f"{stats.max_chunk_seconds():.6f} {stats.calls} {time.monotonic():.6f}", flush=True)
    """
)


@pytest.fixture
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    """This process reads from the local S3 server (and a fresh s3fs instance sees that)."""
    import s3fs

    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    s3fs.S3FileSystem.clear_instance_cache()
    yield s3
    s3fs.S3FileSystem.clear_instance_cache()


def _kill_and_measure(run_dir: str, env: dict[str, str]) -> tuple[float, float]:
    """Run the child, SIGKILL it after a few intervals, as soon as it reports a storage call
    ended; (seconds lost, the bound this run allows). The loss is counted in the steps the
    child had ended that are not in the run, at the run's own time per step, not from the
    kill's time: a child the scheduler held off appended nothing meanwhile, and lost nothing.
    The bound: one interval (records not yet in a chunk when the call began), the slowest
    chunk so far (that call's), the time from the report to the kill, and the scheduler's
    lateness; a kill in the middle of a slow call would need that call's unknown length."""
    progress = tempfile.NamedTemporaryFile(suffix=".progress", delete=False)  # noqa: SIM115
    progress.close()
    child = subprocess.Popen([sys.executable, "-c", KILL_CHILD, run_dir, str(FLUSH_S), progress.name],
                             stdout=subprocess.PIPE, text=True, env={**os.environ, **env})
    assert child.stdout is not None
    assert child.stdout.readline(), "the child did not start"
    late = oversleep()
    not_before, give_up = time.monotonic() + 6 * FLUSH_S, time.monotonic() + 60
    calls, killed = -1, None
    for line in child.stdout:
        chunk_s, now_calls, at = float(line.split()[0]), int(line.split()[1]), float(line.split()[2])
        if time.monotonic() >= not_before and now_calls > calls >= 0:
            killed = time.monotonic()
            child.send_signal(signal.SIGKILL)
            break
        calls = now_calls
        assert time.monotonic() < give_up, "the child's writer ended no storage call for a minute"
    assert killed is not None, "the child ended before it was killed"
    child.wait(timeout=30)
    child.stdout.close()
    ended = int.from_bytes(Path(progress.name).read_bytes()[:8], "little")  # steps 0 .. ended - 1
    os.unlink(progress.name)
    (session,) = read_run(run_dir).sessions
    assert session.finish is None
    steps = [r for r in session.records if r["kind"] == "step"]
    per_step_s = (steps[-1]["t1"] - steps[0]["t0"]) / 1e9 / len(steps)
    lost = (ended - 1 - max(r["step"] for r in steps)) * per_step_s
    return lost, FLUSH_S + chunk_s + (killed - at) + REPORT_S + 2 * late + 2 * sys.getswitchinterval()


@pytest.mark.processes
def test_sigkill_on_local_disk(tmp_path: Path) -> None:
    lost, bound = _kill_and_measure(str(tmp_path / "run"), {})
    assert lost <= bound, f"lost {lost:.3f} s (bound {bound:.3f} s)"


@pytest.mark.fuse
@pytest.mark.processes
def test_sigkill_on_the_emulated_nfs(nfs: EmulatedNFS) -> None:
    run_dir = os.path.join(nfs.mountpoint, "kill-run")
    lost, bound = _kill_and_measure(run_dir, {})
    assert lost <= bound, f"lost {lost:.3f} s (bound {bound:.3f} s)"
    assert nfs.stats()["ops"].get("write", 0) > 0  # it really went through the FUSE server


@pytest.mark.processes
@pytest.mark.s3
def test_sigkill_on_s3(s3_env: S3Server) -> None:
    run_dir = f"s3://{s3_env.bucket}/kill-run"
    lost, bound = _kill_and_measure(run_dir, s3_env.env)
    assert lost <= bound, f"lost {lost:.3f} s (bound {bound:.3f} s)"
    assert s3_env.stats()["requests"].get("PUT", 0) > 0


FROZEN_CHILD = textwrap.dedent(
    """
    import json, sys, time, warnings
    import goodtrace as gt
    run_dir, timeout = sys.argv[1], float(sys.argv[2])
    warnings.simplefilter("ignore")
    gt.init(run_dir, flush_interval_s=0.05, finish_timeout_s=timeout)
    def steps(n):
        worst = 0.0
        for k in range(n):
            t0 = time.perf_counter()
            with gt.step(k):
                for _ in range(20):
                    with gt.span("fwd"):
                        pass
            worst = max(worst, time.perf_counter() - t0)
            time.sleep(0.005)
        return worst
    before = steps(40)
    print("freeze me", flush=True)
    sys.stdin.readline()  # the parent froze the server
    frozen_at = time.perf_counter()
    during = steps(200)
    t0 = time.perf_counter()
    ok = gt.finish()
    finish_s = time.perf_counter() - t0
    print(json.dumps({"before": before, "during": during, "finish_s": finish_s, "ok": ok,
                      "frozen_s": time.perf_counter() - frozen_at}), flush=True)
    """
)


@pytest.mark.fuse
@pytest.mark.processes
def test_a_frozen_fuse_server_stalls_neither_the_loop_nor_finish(tmp_path: Path) -> None:
    reason = fuse_unavailable()
    if reason:
        pytest.skip(reason)
    timeout = 1.0
    with EmulatedNFS(str(tmp_path), rtt_ms=0.5) as server:
        run_dir = os.path.join(server.mountpoint, "frozen-run")
        child = subprocess.Popen([sys.executable, "-c", FROZEN_CHILD, run_dir, str(timeout)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert child.stdin is not None and child.stdout is not None
        try:
            assert child.stdout.readline().strip() == "freeze me"
            server.freeze()
            child.stdin.write("frozen\n")
            child.stdin.flush()
            result: dict[str, Any] = json.loads(child.stdout.readline())
            # The server stays frozen all along: a loop or finish() that waited for storage
            # would have lasted until the thaw below, i.e. longer than the whole frozen phase.
            assert result["ok"] is False  # records were lost, and finish says so
            assert result["finish_s"] < timeout + result["frozen_s"] / 2
            assert result["finish_s"] >= timeout * 0.9  # it did wait for storage, up to its timeout
            assert result["during"] < result["frozen_s"] / 4
            alive_while_frozen = child.poll() is None  # a thread may sit in the kernel (documented)
            server.thaw()
            assert child.wait(timeout=60) == 0  # no goodtrace thread holds the exit once it answers
            print(f"frozen: worst step {result['during'] * 1e3:.2f} ms (before {result['before'] * 1e3:.2f} ms), "
                  f"finish {result['finish_s']:.2f} s, process held until thaw: {alive_while_frozen}")
        finally:
            if child.poll() is None:
                server.thaw()
                child.kill()
                child.wait(timeout=60)
            child.stdin.close()
            child.stdout.close()
