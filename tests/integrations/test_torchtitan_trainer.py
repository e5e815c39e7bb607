"""torchtitan's real trainer (``torchtitan.train``, llama3 debugmodel) on CPU, 2 ranks on gloo, with
a checkpoint save and an eval, recorded by goodtrace's handler loaded through torchtitan's own
``TITAN_STRUCT_LOGGER_HANDLERS`` (the CPU shims: tests/helpers/torchtitan_trainer.py). goodtrace's
steps, spans and their times are checked against torchtitan's structured logs (written beside it
by the JSONL handler), its step-time metric and its loss (its TensorBoard logger).

How the times are compared: goodtrace takes each of its times (a span's edges, a step's entry,
a sync point) while torchtitan logs a record, inside the handler call. So each lies between that
record's timestamp and the next record's of the same thread (``TitanLog.emission``), on
torchtitan's clock, offset from goodtrace's by one constant per process. The offsets consistent
with every such bracket form an interval; it must not be empty, and through it each goodtrace
time has a known place on torchtitan's clock: the bounds below come from these measured
brackets, not from a tolerance chosen here. A process switched out while logging a record only
widens that record's bracket.

What the trainer does that the test relies on: each step it opens a ``checkpoint_save`` span
after its update (a no-op but at the interval and the last step: it always saves then), and
that blocking span settles the step (semantics 2), so each step ends there and the span, and the
eval after step 1, fall in the next step's interval (10.4); the last save follows the last step's
end, in the teardown. CPU tensors are complete on arrival, so the model's parameter completes
the step at that settle.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pytest

from goodtrace import schema
from goodtrace.analysis import analyze
from goodtrace.analysis.attempts import COMPLETED
from goodtrace.read.load import load_run
from goodtrace.read.sessions import read_run
from helpers.cli import goodtrace
from helpers.torchtitan_trainer import RANKS, SAVE_EVERY, STEPS, TitanLog, tensorboard, train

pytestmark = pytest.mark.processes

pytest.importorskip("torch")
pytest.importorskip("torchtitan", reason="torchtitan is not installed")

ANCHORED = ("checkpoint_save", "eval", "gc_collect", "fetching_batch", "fwd_bwd", "optim", "collect_dist_metrics")
SAVES = (SAVE_EVERY, STEPS)  # torchtitan saves at its interval and after the last step
EVALS = (1,)  # torchtitan validates at step 1 (and every `freq` steps, here none)


class Clock:
    """goodtrace's times of one rank placed on torchtitan's clock (ns)."""

    def __init__(self, log: TitanLog, recorded: list[dict[str, Any]]) -> None:
        self.log = log
        self.anchors: list[tuple[int, int]] = []  # (goodtrace time, torchtitan record index)
        self.syncs = {r[schema.F_STEP]: r for r in recorded if r[schema.F_KIND] == schema.SYNC}
        self.entries = {r[schema.F_STEP]: r for r in recorded if r[schema.F_KIND] == schema.STEP}
        self.spans: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
        for r in recorded:
            if r[schema.F_KIND] == schema.SPAN:
                self.spans[r[schema.F_NAME]].append(r)
        for step, entry in self.entries.items():  # gt.step entered and left with torchtitan's `step` span
            self.anchors.append((entry[schema.F_T0], log.index("step_start", step)))
            self.anchors.append((entry[schema.F_T1], log.index("step_end", step)))
        for step, sync in self.syncs.items():  # settled as the step's checkpoint_save span starts
            self.anchors.append((sync[schema.F_T], log.index("checkpoint_save_start", step)))
        for name in ANCHORED:
            spans = self.spans[name]
            assert len(spans) == log.count(f"{name}_start") == log.count(f"{name}_end"), name
            for nth, span in enumerate(spans):
                self.anchors.append((span[schema.F_T0], log.index(f"{name}_start", nth=nth)))
                self.anchors.append((span[schema.F_T1], log.index(f"{name}_end", nth=nth)))
        brackets = [(lo - t, hi - t) for t, i in self.anchors for lo, hi in [log.emission(i)]]
        self.offset = (max(lo for lo, _ in brackets), min(hi for _, hi in brackets))

    def place(self, t: int, index: int) -> tuple[int, int]:
        """Where goodtrace's time ``t`` (taken while record ``index`` was logged) lies on torchtitan's clock."""
        lo, hi = self.log.emission(index)
        return max(lo, t + self.offset[0]), min(hi, t + self.offset[1])


def within(value: float, bounds: tuple[float, float], what: str) -> None:
    assert bounds[0] <= value <= bounds[1], f"{what}: {value} not in {bounds}"


def test_torchtitan_s_trainer_is_recorded_step_by_step_with_its_checkpoint_and_eval(tmp_path: Path) -> None:
    out = train(tmp_path)
    analysis = analyze(load_run(out / "goodtrace"))
    (attempt,) = analysis.attempts
    assert attempt.ended == COMPLETED and attempt.ranks == RANKS
    assert (attempt.first_step, attempt.last_step) == (1, STEPS)
    recorded: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for session, record in read_run(out / "goodtrace").records():
        recorded[session.header["rank"]].append(record)
    cuts = {analysis.sessions[i].rank: cut for i, cut in analysis.cuts.items()}
    assert sorted(cuts) == sorted(recorded) == list(range(RANKS))
    for rank in range(RANKS):
        _check_rank(rank, TitanLog(out, rank), tensorboard(out, rank), cuts[rank], recorded[rank])

    # rank 0's rows (the report's step table): the same numbers, and the tags with the steps
    # whose intervals hold the spans that set them
    cut = cuts[0]
    by_step = {row.step: row for row in analysis.steps}
    assert sorted(by_step) == list(range(1, STEPS + 1)) and not any(row.host_timed for row in analysis.steps)
    assert [by_step[s].step_time_s for s in range(1, STEPS + 1)] == pytest.approx(
        [(e - b) / 1e9 for b, e in zip(cut.interval_start, cut.interval_end, strict=True)], abs=1e-9)
    for name in ("checkpoint_save", "eval"):
        assert [by_step[s].overhead_s.get(name, 0.0) for s in range(1, STEPS + 1)] == pytest.approx(
            [ns / 1e9 for ns in cut.interval_overhead.get(name, [0] * STEPS)], abs=1e-9), name
    assert [s for s in by_step if "checkpoint_save" in by_step[s].tags] == [SAVE_EVERY + 1, STEPS]  # the last
    assert [s for s in by_step if "eval" in by_step[s].tags] == [EVALS[0] + 1]  # save's: no later step holds it
    assert [by_step[s].metrics["loss"] for s in range(1, STEPS + 1)] == pytest.approx(
        [tensorboard(out, 0)["loss_metrics/global_avg_loss"][s] for s in range(1, STEPS + 1)], rel=1e-7)
    tail = [e - b for label, b, e in zip(cut.over_label, cut.over_start, cut.over_end, strict=True)
            if label == "checkpoint_save" and b >= cut.last_end]
    assert analysis.partition.buckets_ns["checkpoint_save"] == sum(cut.interval_overhead["checkpoint_save"]) + sum(tail)

    # `goodtrace report OUTPUT`: the handler's recording, device-timed, read before the logs beside it
    done = goodtrace("report", "--json", str(out))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [row["step"] for row in report["steps"]] == list(range(1, STEPS + 1))
    assert not any(row["host_timed"] for row in report["steps"])
    assert report["steps"][SAVE_EVERY]["overhead_s"]["checkpoint_save"] == pytest.approx(
        by_step[SAVE_EVERY + 1].overhead_s["checkpoint_save"], abs=1e-6)
    assert report["warnings"][0].startswith(f"{out} holds torchtitan's structured logs and goodtrace's recording")


def _check_rank(rank: int, log: TitanLog, scalars: dict[str, dict[int, float]], cut: Any,
                recorded: list[dict[str, Any]]) -> None:
    # the steps torchtitan ran, each completed on the model: none host-timed, none at the end
    assert log.steps() == list(cut.exec_step) == sorted(scalars["time_metrics/end_to_end(s)"]) \
        == list(range(1, STEPS + 1))
    assert not cut.host_timed and set(cut.interval_how) == {schema.SYNC_BLOCKING}
    assert [s for s in log.steps() if "checkpoint_save" in log.tags(log.index("checkpoint_save_end", s))] == list(SAVES)
    assert [r["step"] for r in log.records if r["log_type_name"] == "eval_start"] == list(EVALS)

    clock = Clock(log, recorded)
    assert clock.offset[0] <= clock.offset[1], f"rank {rank}: no clock offset fits every bracket"
    assert {s: r[schema.F_HOW] for s, r in clock.syncs.items()} == dict.fromkeys(log.steps(), schema.SYNC_BLOCKING)
    # each step's end (its sync point) on torchtitan's clock, and so each step's start
    ends = {step: clock.place(sync[schema.F_T], log.index("checkpoint_save_start", step))
            for step, sync in clock.syncs.items()}
    starts = {1: clock.place(clock.entries[1][schema.F_T0], log.index("step_start", 1))}
    starts.update({step + 1: ends[step] for step in range(1, STEPS)})

    for w, step in enumerate(cut.exec_step):
        gt_ns = cut.interval_end[w] - cut.interval_start[w]
        assert cut.interval_end[w] == clock.syncs[step][schema.F_T]
        assert cut.interval_start[w] == (clock.syncs[step - 1][schema.F_T] if step > 1 else clock.entries[1][schema.F_T0])
        # the step's time against torchtitan's records that began and ended it
        began = log.index("checkpoint_save_start", step - 1) if step > 1 else log.index("step_start", 1)
        titan_ns = log.time_ns(log.index("checkpoint_save_start", step)) - log.time_ns(began)
        (a, b), (c, d) = starts[step], ends[step]
        within(gt_ns, (c - b, d - a), f"rank {rank} step {step} time (torchtitan's records: {titan_ns} ns)")
        # and against torchtitan's own step time (end_to_end: between two of its metric logs, each
        # between a step's collect_dist_metrics end and its checkpoint_save start), where it is
        # right: not step 1 (counted from its set-up), nor step 2 (the eval restarts its timer)
        if step >= 3:
            e2e_ns = scalars["time_metrics/end_to_end(s)"][step] * 1e9
            late = d - log.time_ns(log.index("collect_dist_metrics_end", step))
            early = b - log.time_ns(log.index("collect_dist_metrics_end", step - 1))
            slack = 3e3  # the records' whole microseconds, TensorBoard's float32
            within(gt_ns - e2e_ns, (-early - slack, late + slack), f"rank {rank} step {step} against end_to_end")

    # the spans after step N's update (its checkpoint_save, a no-op but after steps 4 and 8, and the
    # eval after step 1) in step N+1's interval (semantics 10.4), whole; the last save after the
    # last step's sync point, in the teardown
    for name in ("checkpoint_save", "eval"):
        after = {s[schema.F_STEP]: s[schema.F_T1] - s[schema.F_T0] for s in clock.spans[name]}
        assert list(cut.interval_overhead.get(name, [0] * STEPS)) == [after.get(s - 1, 0) for s in cut.exec_step], name
    save, last = (clock.spans["checkpoint_save"][s - 1] for s in SAVES)
    for span, name in ((save, "checkpoint_save"), (clock.spans["eval"][0], "eval")):
        step, nth = span[schema.F_STEP], clock.spans[name].index(span)
        assert clock.syncs[step][schema.F_T] <= span[schema.F_T0] < span[schema.F_T1] <= clock.syncs[step + 1][schema.F_T]
        (a, b), (c, d) = (clock.place(span[schema.F_T0], log.index(f"{name}_start", nth=nth)),
                          clock.place(span[schema.F_T1], log.index(f"{name}_end", nth=nth)))
        titan_ns = log.time_ns(log.index(f"{name}_end", nth=nth)) - log.time_ns(log.index(f"{name}_start", nth=nth))
        within(span[schema.F_T1] - span[schema.F_T0], (c - b, d - a),
               f"rank {rank} {name} of step {step} (torchtitan's records: {titan_ns} ns)")
    tail = [(b, e) for label, b, e in zip(cut.over_label, cut.over_start, cut.over_end, strict=True)
            if label == "checkpoint_save" and b >= cut.last_end]
    assert tail == [(last[schema.F_T0], last[schema.F_T1])]

    # the loss each step: torchtitan's reduced loss, as its metric logger wrote it (float32)
    losses = {r[schema.F_STEP]: r[schema.F_VALUE] for r in recorded
              if r[schema.F_KIND] == schema.METRIC and r[schema.F_NAME] == "loss"}
    assert losses == pytest.approx(scalars["loss_metrics/global_avg_loss"], rel=1e-7)
