"""goodtrace's handler in torchtitan's structured logger (TITAN_STRUCT_LOGGER_HANDLERS): a loop
shaped like torchtitan's trainer logs through torchtitan's real logger on CPU; goodtrace's run
and torchtitan's own JSONL files (read through goodtrace's torchtitan reader) tell one story."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from goodtrace import schema
from goodtrace.analysis import analyze
from goodtrace.analysis.attempts import COMPLETED
from goodtrace.read.load import load_run
from goodtrace.read.sessions import read_run
from helpers.cli import goodtrace
from helpers.torchtitan_logs import STEPS, run_trainer

pytestmark = pytest.mark.processes

pytest.importorskip("torchtitan.observability.structured_logger")
pytest.importorskip("torch")


def test_the_handler_records_steps_spans_tags_and_the_loss(tmp_path: Path) -> None:
    losses = run_trainer(tmp_path / "out", tmp_path / "run")
    records = read_run(tmp_path / "run")
    spans = collections.Counter((r[schema.F_NAME], r[schema.F_CATEGORY]) for _, r in records.records(schema.SPAN))
    assert spans[("fwd_bwd", schema.COMPUTE)] == spans[("optim", schema.COMPUTE)] == STEPS
    assert spans[("fetching_batch", schema.DATA)] == STEPS
    assert spans[("checkpoint_save", schema.CHECKPOINT_SAVE)] == 1 and spans[("gc_collect", schema.GC)] == 1
    syncs = [r for _, r in records.records(schema.SYNC)]
    assert sorted(r[schema.F_STEP] for r in syncs) == list(range(1, STEPS + 1))  # completed on the model
    assert all(r[schema.F_HOW] != schema.SYNC_FINISH for r in syncs[:-1])

    analysis = analyze(load_run(tmp_path / "run"))
    (attempt,) = analysis.attempts
    assert attempt.ended == COMPLETED
    by_step = {row.step: row for row in analysis.steps}
    assert sorted(by_step) == list(range(1, STEPS + 1))
    assert [by_step[s].metrics["loss"] for s in sorted(by_step)] == pytest.approx(losses)
    # the checkpoint follows step 4's update: it is in step 5's interval (semantics, section 10.4),
    # and so is its tag
    assert by_step[5].overhead_s["checkpoint_save"] >= 0.02 and "checkpoint_save" in by_step[5].tags
    assert "checkpoint_save" not in by_step[4].tags
    assert "gc" in by_step[2].tags
    assert not any(row.host_timed for row in analysis.steps)
    (event,) = analysis.events
    assert event.name == "training_start"


def test_torchtitan_s_own_files_read_back_alike_and_the_recording_beside_them_is_read_first(tmp_path: Path) -> None:
    from goodtrace.read.torchtitan import converted_run

    out = tmp_path / "out"
    run_trainer(out, out / "goodtrace")  # where the handler writes by default: OUTPUT/goodtrace
    from_logs = analyze(load_run(converted_run(str(out), cache_dir=str(tmp_path / "cache"))))
    recorded = analyze(load_run(out / "goodtrace"))
    assert [r.step for r in from_logs.steps] == [r.step for r in recorded.steps]
    # the tags agree, but for the checkpoint's: inside step 4's host-timed `step` span in the logs, after
    # step 4's device completion in the recording (step 5's interval)
    assert [r.tags for r in from_logs.steps if r.step not in (4, 5)] == [r.tags for r in recorded.steps
                                                                       if r.step not in (4, 5)]
    assert "checkpoint_save" in {r.step: r for r in from_logs.steps}[4].tags
    assert all(r.host_timed for r in from_logs.steps)

    # `goodtrace report OUTPUT`: the device-timed recording, said so, not the host-timed logs
    done = goodtrace("report", "--json", str(out), env={"GOODTRACE_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["path"] == str(out)
    assert not any(row["host_timed"] for row in report["steps"])
    assert report["warnings"][0].startswith(f"{out} holds torchtitan's structured logs and goodtrace's recording")
    assert f"goodtrace report {out / 'structured_logs'}" in report["warnings"][0]
    logs = goodtrace("report", "--json", str(out / "structured_logs"), env={"GOODTRACE_CACHE_DIR": str(tmp_path / "cache")})
    assert logs.returncode == 0, logs.stderr
    assert all(row["host_timed"] for row in json.loads(logs.stdout)["steps"])
