"""TensorBoard sink: event files read back with TensorBoard's own event reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from goodtrace.analysis.attempts import COMPLETED
from helpers.sinks import STEPS, CaptureSink, train
from helpers.sinks_expected import JOB_GOODPUT, expected_live, expected_summary

pytest.importorskip("tensorboardX")
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def _read(log_dir: Path) -> tuple[dict[str, dict[int, float]], dict[str, str]]:
    reader = event_accumulator.EventAccumulator(str(log_dir), size_guidance={event_accumulator.TENSORS: 0})
    reader.Reload()
    scalars = {tag: {e.step: e.value for e in reader.Scalars(tag)} for tag in reader.Tags()["scalars"]}
    texts = {}
    for tag in reader.Tags()["tensors"]:  # add_text: a string tensor under "<tag>/text_summary"
        event = reader.Tensors(tag)[-1]
        texts[tag.removesuffix("/text_summary")] = event.tensor_proto.string_val[0].decode()
    return scalars, texts


def test_live_lines_and_the_summary_read_back_from_the_event_files(tmp_path: Path) -> None:
    from goodtrace.sinks.tensorboard import TensorBoardSink

    capture = CaptureSink()
    train(tmp_path / "run", [capture, TensorBoardSink(tmp_path / "tb")])
    scalars, texts = _read(tmp_path / "tb")
    live = expected_live(capture.lines)
    assert sorted(live) == [10, 20, STEPS]
    for step, values in live.items():
        for name, value in values.items():
            assert scalars[name][step] == pytest.approx(value, rel=1e-6), (name, step)
        # a run with no earlier attempt: the job so far is this attempt
        assert scalars[JOB_GOODPUT][step] == pytest.approx(values["goodtrace/goodput/attempt"], rel=1e-6)
    window = range(21, STEPS + 1)  # the last line's window; loss is reduced with "mean"
    assert scalars["goodtrace/metric/loss"][STEPS] == pytest.approx(sum(1 / s for s in window) / len(window), rel=1e-6)
    numbers, attempts = expected_summary(tmp_path / "run")
    assert "goodtrace/summary/checkpoint_save_s" in numbers and numbers["goodtrace/summary/checkpoint_save_s"] > 0
    for name, value in numbers.items():
        assert scalars[name][STEPS] == pytest.approx(value, rel=1e-6, abs=1e-9), name
    assert texts == attempts and texts["goodtrace/summary/attempt_0"].startswith(f"{COMPLETED}, steps 1-25")


def test_all_ranks_write_beside_rank_0(tmp_path: Path) -> None:
    from goodtrace.sinks.tensorboard import TensorBoardSink

    train(tmp_path / "run", [TensorBoardSink(tmp_path / "tb", all_ranks=True)], rank=1, world_size=2)
    scalars, _ = _read(tmp_path / "tb" / "rank-1")
    assert sorted(scalars["goodtrace/step_time_s"]) == [10, 20, STEPS]
    assert not any(p.is_file() for p in (tmp_path / "tb").iterdir())  # rank 0 did not run here
