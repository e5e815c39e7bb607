"""JAX clock rounds run off the training thread (docs/semantics.md section 8), on two real
``jax.distributed`` CPU processes: process 1 asks for a round at step 4 and goes on training
while process 0, the reference, stays away from any round until process 1 has finished step 6
(it waits for a key process 1 sets then). With the rounds on the training thread (the barrier
and ping-pongs of ``measure_clock_offset``), process 1 could not pass step 4 before process 0
served it, and process 0 would never serve it: the two would wait on each other. Every round
(start-up, steps 4 and 8) still completes and is recorded.

The test spawns this file twice as a worker (``python test_jax_clock_background.py worker ...``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.processes

STEPS, SYNC_AT, PAST = 8, 4, 6
KEY = "test/process1-past-step-6"


def _worker(process_id: int, port: int, run_dir: str, out: str) -> None:
    import jax

    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id,
        initialization_timeout=40,
    )
    import goodtrace as gt
    from goodtrace.integrations import jax as gj

    client = gj._client()
    gt.init(run_dir, flush_interval_s=0.2)
    integration = gj.instrument(live=False, clock_sync_every=SYNC_AT)
    waited = False
    for step in range(1, STEPS + 1):
        if process_id == 0 and step == SYNC_AT:
            client.blocking_key_value_get(KEY, 30_000)  # the reference stays away until then
            waited = True
        with gt.step(step):
            pass
        if process_id == 1 and step == PAST:
            client.key_value_set(KEY, "1")
    ok = gt.finish(completed=True)
    Path(out).write_text(json.dumps({
        "ok": ok, "waited": waited,
        "offsets": [[o.offset_ns, o.rtt_ns] for o in integration.clock_offsets],
    }))
    jax.distributed.shutdown()


def test_a_process_trains_on_while_the_reference_has_not_served_its_round(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    from goodtrace import schema
    from goodtrace.read.sessions import read_run
    from helpers.ranks import free_port  # here, not at the top: this file is also the ranks' script

    run_dir = tmp_path / "run"
    port = free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    env.pop("XLA_FLAGS", None)
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "worker", str(i), str(port), str(run_dir), str(tmp_path / f"out{i}.json")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for i in range(2)
    ]
    logs = []
    for proc in procs:
        try:
            output, _ = proc.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            pytest.fail("jax.distributed workers did not finish within 150 s")
        logs.append(output)
    for proc, log in zip(procs, logs, strict=True):
        if proc.returncode != 0 and "distributed" in log and "initialize" in log and "Error" in log:
            pytest.skip(f"jax.distributed could not start on CPU here:\n{log[-2000:]}")
        assert proc.returncode == 0, log[-4000:]
    results = [json.loads((tmp_path / f"out{i}.json").read_text()) for i in range(2)]
    assert all(r["ok"] for r in results) and results[0]["waited"]
    assert "clock alignment failed" not in logs[0] + logs[1], logs
    # every round, start-up and steps 4 and 8, measured and recorded; the reference's offset is 0
    assert results[0]["offsets"] == [[0, 0]] * 3
    assert len(results[1]["offsets"]) == 3 and all(rtt > 0 for _, rtt in results[1]["offsets"])
    records = [r for s in read_run(run_dir).sessions if s.rank == 1 for r in s.of_kind(schema.CLOCK)]
    assert [[r[schema.F_OFFSET], r[schema.F_RTT]] for r in records] == results[1]["offsets"]



class _Store:
    """The key-value store as the rounds use ``jax.distributed``'s client: a set, a get that
    waits for its key, a delete of a key and every key under it."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.cond = threading.Condition()
        self.reference_in_round_1 = threading.Event()

    def key_value_set(self, key: str, value: str) -> None:
        with self.cond:
            self.values[key] = value
            self.cond.notify_all()
        if key == "goodtrace/clockbg/0/1-0/1":  # the peer's last ping of round 0: it reads the
            self.reference_in_round_1.wait(5)  # answer only once the reference started round 1

    def blocking_key_value_get(self, key: str, timeout_ms: int) -> str:
        if key.startswith("goodtrace/clockbg/1/"):
            self.reference_in_round_1.set()
        with self.cond:
            if not self.cond.wait_for(lambda: key in self.values, timeout_ms / 1000):
                raise TimeoutError(f"no {key}")
            return self.values[key]

    def key_value_delete(self, key: str) -> None:
        with self.cond:
            for name in [name for name in self.values if name.startswith(key)]:
                del self.values[name]


def test_a_peer_reads_its_last_answer_after_the_reference_started_the_next_round() -> None:
    """The reference's next round may start while a peer still waits for its last answer (the
    reference's steps ran ahead): that answer is still there, and every key is gone once both
    rounds are done. (The reference deleted a round's keys when it started the next, so under
    load the peer waited out its timeout and clock alignment failed.)"""
    pytest.importorskip("jax")
    from goodtrace.integrations.jax import _KeyValueRounds

    store = _Store()
    rounds = [_KeyValueRounds(store, rank, 2, time.perf_counter_ns, rounds=2, timeout_s=2.0) for rank in (0, 1)]
    results: dict[int, list[Any]] = {0: [], 1: []}

    def both_rounds(rank: int) -> None:
        for _ in range(2):
            results[rank].append(rounds[rank].measure())

    threads = [threading.Thread(target=both_rounds, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert store.reference_in_round_1.is_set()
    assert [len(results[0]), len(results[1])] == [2, 2], "a round failed"
    assert all(sample.rtt_ns > 0 for sample in results[1])
    assert store.values == {}


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "worker":
    _worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
