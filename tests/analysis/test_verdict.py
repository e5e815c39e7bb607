"""The verdict (docs/semantics.md 5.6): each kind from the buckets that make it, the 10% floor,
a straggler first, and the words every view shows, on synthetic records."""

from __future__ import annotations

from pathlib import Path

import pytest

from goodtrace.analysis import analyze
from goodtrace.analysis.evidence import Evidence
from goodtrace.analysis.ranks import RankFigure, Straggler
from goodtrace.analysis.verdict import verdict_of
from goodtrace.read.load import load_run
from helpers.builders import Proc

S = 10**9


@pytest.mark.parametrize(("loss", "kind"), [
    ({"data": 30}, "input-bound"),
    ({"compile": 12, "log": 10, "gc": 1}, "host-bound"),
    ({"sync_weights": 25}, "host-bound"),  # a category the program declared overhead
    ({"checkpoint_save": 20, "checkpoint_restore": 5}, "checkpoint-heavy"),
    ({"eval": 25}, "eval-heavy"),
    ({"disruption": 15, "wasted_progress": 10}, "restart-heavy"),
    ({"startup": 20, "warmup": 5}, "start-up-heavy"),
])
def test_the_largest_loss_names_the_run(loss: dict[str, int], kind: str) -> None:
    buckets = {"productive": 60 * S, "teardown": 5 * S} | {k: v * S for k, v in loss.items()}
    total = sum(buckets.values())
    verdict = verdict_of(buckets, total, 80 * S, [], [], 1.0)
    assert verdict.kind == kind
    assert verdict.losses[0].kind == kind and verdict.losses[0].ns == sum(loss.values()) * S
    assert verdict.text.startswith(kind + ": ")
    assert f"{sum(loss.values()) * S / total:.0%} of the job" in verdict.line


def test_an_input_bound_verdict_gives_the_share_of_step_time() -> None:
    verdict = verdict_of({"productive": 30 * S, "data": 60 * S, "startup": 10 * S}, 100 * S, 90 * S, [], [], 0.1)
    assert verdict.text == "input-bound: the device waited for the input pipeline"
    assert verdict.evidence.startswith("67% of step time (60.000 s, 60% of the job) was data loading")


def test_no_loss_of_ten_percent_is_compute_bound() -> None:
    buckets = {"productive": 91 * S, "data": 5 * S, "checkpoint_save": 4 * S}
    verdict = verdict_of(buckets, 100 * S, 96 * S, [], [], 1.0)
    assert verdict.kind == "compute-bound"
    assert verdict.evidence == "91% of the job was productive; the largest loss, input bound, is 5% of the job"
    # teardown is no loss to act on
    assert verdict_of({"productive": 50 * S, "teardown": 50 * S}, 100 * S, 50 * S, [], [], 1.0).kind == "compute-bound"


def _figure(rank: int, effect_s: float) -> RankFigure:
    evidence = Evidence(effect_s=effect_s, consistency=1.0, samples=20, noise_s=0.001)
    return RankFigure(rank, f"h{rank}", 0.9, 1.0, 1.0, 1.0, 0.8, None, None, compute_evidence=evidence)


def test_a_straggler_that_costs_the_others_comes_first() -> None:
    buckets = {"productive": 70 * S, "data": 30 * S}
    slow = Straggler(3, "h3", "computes at 80% of the other ranks' speed")
    verdict = verdict_of(buckets, 100 * S, 100 * S, [slow], [_figure(3, 0.25)], 1.0)
    assert verdict.kind == "straggler-bound"
    assert verdict.text == "straggler-bound: rank 3 (host h3) holds the others back"
    assert verdict.evidence.startswith("the other ranks wait about 250.0 ms per step for it (25% of the median step)")
    # a straggler whose delay is under 5% of the step does not outrank a larger loss
    assert verdict_of(buckets, 100 * S, 100 * S, [slow], [_figure(3, 0.01)], 1.0).kind == "input-bound"


def test_every_view_takes_the_analysis_verdict(tmp_path: Path) -> None:
    p = Proc(tmp_path)
    for k in range(20):
        p.step(k, k, k + 0.9).span("data", k, k + 0.7, step=k).sync(k, k + 1.0, "lag")
    p.finish(20.0)
    p.write()
    analysis = analyze(load_run(tmp_path))
    assert analysis.verdict.kind == "input-bound"
    assert analysis.to_dict()["verdict"] == analysis.verdict.to_dict()
    assert analysis.to_dict()["verdict"]["evidence"].startswith("70% of step time")
