"""Hugging Face Trainer with GoodtraceCallback: a tiny GPT-2 built from a config (no download)
trained for a few steps on CPU, with evaluation and checkpoint saves, then the run analysed."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest

import goodtrace as gt
from goodtrace import schema
from goodtrace.analysis import analyze
from goodtrace.analysis.attempts import COMPLETED
from goodtrace.read.load import load_run
from goodtrace.read.sessions import read_run

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

STEPS = 6


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("WANDB_DISABLED", "true")


def _train(tmp_path: Path, **callback_options: Any) -> Any:
    return _trainer(tmp_path, [], **callback_options).callback_handler.callbacks_goodtrace


def _trainer(tmp_path: Path, report_to: list[str], **callback_options: Any) -> Any:
    """A Trainer that has trained (``.callback_handler.callbacks_goodtrace``: goodtrace's callback)."""
    from goodtrace.integrations.transformers import GoodtraceCallback

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                                      bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    rows = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 64, (32, 16))]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=STEPS, per_device_train_batch_size=4,
        per_device_eval_batch_size=8, eval_strategy="steps", eval_steps=3, save_steps=3, logging_steps=2,
        report_to=report_to, use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, save_total_limit=1,
    )
    callback = GoodtraceCallback(tmp_path / "run", **callback_options)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows, eval_dataset=rows[:8],
                                   callbacks=[callback])
    trainer.train()
    trainer.callback_handler.callbacks_goodtrace = callback
    return trainer


@pytest.mark.slow
def test_the_trainer_s_steps_evaluations_and_saves_are_in_the_report(tmp_path: Path) -> None:
    callback = _train(tmp_path)
    assert not gt.is_enabled() and not callback.started_goodtrace  # it started goodtrace, and finished it
    records = [r for _, r in read_run(tmp_path / "run").records(schema.SPAN)]
    spans = collections.Counter((r[schema.F_NAME], r[schema.F_CATEGORY]) for r in records)
    assert spans[("eval", schema.EVAL)] == 2  # after steps 3 and 6
    assert spans[("checkpoint", schema.CHECKPOINT_SAVE)] == 2
    assert spans[("forward_backward", schema.COMPUTE)] == STEPS
    assert spans[("optimizer", schema.COMPUTE)] == STEPS
    assert spans[("data", schema.DATA)] == STEPS

    analysis = analyze(load_run(tmp_path / "run"))
    assert [row.step for row in analysis.steps] == list(range(1, STEPS + 1))
    (attempt,) = analysis.attempts
    assert attempt.ended == COMPLETED and (attempt.first_step, attempt.last_step) == (1, STEPS)
    buckets = analysis.partition.buckets_ns
    assert buckets["eval"] > 0 and buckets["checkpoint_save"] > 0
    assert sum(buckets.values()) == analysis.partition.total_ns
    by_step = {row.step: row for row in analysis.steps}
    # eval and the save after step 3 sit between steps 3 and 4: step 4's interval holds them
    assert by_step[4].overhead_s["eval"] > 0 and by_step[4].overhead_s["checkpoint_save"] > 0
    assert set(by_step[2].metrics) >= {"loss", "learning_rate", "grad_norm"}  # logging_steps=2
    assert "eval_loss" in by_step[3].metrics and "eval_loss" in by_step[6].metrics
    assert by_step[2].metrics["loss"] > 0


@pytest.mark.slow
def test_sinks_given_to_the_callback_get_the_trainer_s_live_lines(tmp_path: Path) -> None:
    from helpers.sinks import CaptureSink

    capture = CaptureSink()
    _train(tmp_path, sinks=[capture])
    assert [line.step for line in capture.lines] == [2, 4, 6]  # a line every logging_steps
    assert capture.lines[0].metrics["loss"].value > 0 and capture.closed is True


@pytest.mark.processes
def test_goodtrace_s_figures_reach_the_log_history_and_the_reporting_integrations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``report_to=["tensorboard", "mlflow"]`` and goodtrace's own MLflow sink: the live line's
    figures are in ``log_history``, TensorBoard's event files (read with its EventAccumulator)
    and the Trainer's MLflow run, which is also where the sink logged (MlflowClient)."""
    mlflow = pytest.importorskip("mlflow")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from goodtrace.sinks import line_scalars
    from helpers.sinks import CaptureSink

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "hf")
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    capture = CaptureSink()
    trainer = _trainer(tmp_path, ["tensorboard", "mlflow"], sinks=[capture, "mlflow"])
    try:
        lines = {line.step: line_scalars(line) for line in capture.lines}
        logged = [entry for entry in trainer.state.log_history if "goodtrace/step" in entry]
        # a log interval's line is ready a step after it (lag 1): each training log carries the
        # previous log interval's (none yet at step 2), never an evaluation's log
        assert [(entry["step"], entry["goodtrace/step"]) for entry in logged] == [(4, 2), (6, 4)]
        assert all("loss" in entry for entry in logged)
        for entry in logged:
            line = lines[int(entry["goodtrace/step"])]
            assert entry["goodtrace/step_time_s"] == line["goodtrace/step_time_s"]
            assert entry["goodtrace/goodput/attempt"] == line["goodtrace/goodput/attempt"]
        assert not any(k.startswith("goodtrace/metric/") for e in trainer.state.log_history for k in e)

        events = EventAccumulator(str(tmp_path / "tb")).Reload()
        step_times = {e.step: e.value for e in events.Scalars("train/goodtrace/step_time_s")}
        assert step_times == {e["step"]: pytest.approx(e["goodtrace/step_time_s"]) for e in logged}
        assert not any("goodtrace/metric" in tag for tag in events.Tags()["scalars"])

        client = mlflow.MlflowClient(tracking_uri=uri)
        (run,) = client.search_runs([client.get_experiment_by_name("hf").experiment_id])
        history = client.get_metric_history(run.info.run_id, "goodtrace/goodput/attempt")
        assert {m.step for m in history} >= {4, 6}
        assert client.get_metric_history(run.info.run_id, "goodtrace/summary/goodput")  # the sink's, same run
        assert "loss" in run.data.metrics  # the Trainer's own, through report_to
    finally:
        mlflow.end_run()
