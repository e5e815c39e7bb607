"""MLflow sink: a local sqlite tracking store, read back with ``mlflow.MlflowClient``."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.sinks import STEPS, CaptureSink, train
from helpers.sinks_expected import JOB_GOODPUT, expected_live, expected_summary

mlflow = pytest.importorskip("mlflow")


def test_live_lines_and_the_summary_read_back_with_the_client(tmp_path: Path) -> None:
    from goodtrace.sinks.mlflow import MlflowSink

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    capture = CaptureSink()
    sink = MlflowSink(uri, experiment="goodtrace-test")
    train(tmp_path / "run", [capture, sink])
    client = mlflow.MlflowClient(tracking_uri=uri)
    run = client.get_run(sink.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert client.get_experiment(run.info.experiment_id).name == "goodtrace-test"
    live = expected_live(capture.lines)
    for name in next(iter(live.values())):
        history = {m.step: m.value for m in client.get_metric_history(sink.run_id, name)}
        for step, values in live.items():
            if name in values and not name.startswith("goodtrace/summary/"):
                assert history[step] == pytest.approx(values[name]), (name, step)
    job = {m.step: m.value for m in client.get_metric_history(sink.run_id, JOB_GOODPUT)}
    assert sorted(job) == [10, 20, STEPS]
    numbers, attempts = expected_summary(tmp_path / "run")
    for name, value in numbers.items():
        (point,) = client.get_metric_history(sink.run_id, name)
        assert (point.step, point.value) == (STEPS, pytest.approx(value)), name
    for name, text in attempts.items():
        assert run.data.tags[name] == text
