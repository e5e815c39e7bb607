"""MLflow sink: a local sqlite tracking store, read back with ``mlflow.MlflowClient``."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

import goodtrace as gt
from helpers.sinks import STEPS, CaptureSink, train
from helpers.sinks_expected import JOB_GOODPUT, expected_live, expected_summary

pytestmark = pytest.mark.processes

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
    numbers, attempts = expected_summary(tmp_path / "run", capture.lines[-1])
    for name, value in numbers.items():
        (point,) = client.get_metric_history(sink.run_id, name)
        assert (point.step, point.value) == (STEPS, pytest.approx(value)), name
    for name, text in attempts.items():
        assert run.data.tags[name] == text


def test_the_programs_active_run_receives_the_numbers(tmp_path: Path) -> None:
    """``mlflow.start_run(); gt.init(sinks=["mlflow"])``: MLflow's active run is per thread and
    the sink opens on its own; it still logs into the program's run, and leaves it open."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    try:
        # the program picks its experiment (MLflow keeps the last one set in this process, e.g.
        # by transformers' MLflowCallback in an earlier test, and that id is not in this store)
        mlflow.set_experiment("mine")
        with mlflow.start_run(run_name="mine") as active:
            train(tmp_path / "run", ["mlflow"])
            client = mlflow.MlflowClient(tracking_uri=uri)
            assert client.get_run(active.info.run_id).info.status == "RUNNING"
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
        assert [r.info.run_id for r in runs] == [active.info.run_id]
        steps = [m.step for m in client.get_metric_history(active.info.run_id, "goodtrace/step_time_s")]
        assert steps == [10, 20, STEPS]
        (goodput,) = client.get_metric_history(active.info.run_id, "goodtrace/summary/goodput")
        assert goodput.value == pytest.approx(expected_summary(tmp_path / "run")[0]["goodtrace/summary/goodput"])
    finally:
        mlflow.set_tracking_uri(None)


def _rank_with_mlflow(rank: int, world: int, port: int, run_dir: str, uri: str) -> None:
    from goodtrace.sinks.mlflow import MlflowSink

    sink = MlflowSink(uri, all_ranks=True)
    # ranks take turns creating the store: on a loaded machine each turn takes seconds
    train(Path(run_dir), [sink], rank=rank, world_size=world, finish_timeout_s=120)
    assert sink.run_id is not None, f"rank {rank}'s sink did not open"


def test_every_rank_opens_a_new_sqlite_store_at_once(tmp_path: Path) -> None:
    """``all_ranks=True`` on a store that does not exist yet: every rank's sink creates its run
    (MLflow's schema migrations race when unguarded, dropping a rank's sink)."""
    from helpers.ranks import run_ranks

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_ranks(_rank_with_mlflow, 2, str(tmp_path / "run"), uri)  # two ranks race as any more do
    client = mlflow.MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("goodtrace").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["run", "run-rank1"]
    for r in runs:
        assert [m.step for m in client.get_metric_history(r.info.run_id, "goodtrace/step_time_s")] == [10, 20, STEPS]


def test_a_closed_tracking_port_drops_the_sink_before_training_starts(tmp_path: Path) -> None:
    from goodtrace.sinks.mlflow import MlflowSink
    from helpers.ranks import free_port

    sink = MlflowSink(f"http://127.0.0.1:{free_port()}")
    with pytest.warns(gt.GoodtraceWarning, match="unreachable") as caught:
        gt.init(tmp_path / "run", sinks=[sink])
        hub = gt.recorder().sink_hub
        assert hub is not None and hub.active == []  # dropped by the time init returned
        gt.finish()
    assert not any("still opening" in str(w.message) for w in caught)


def test_a_server_that_never_answers_is_waited_for_finish_timeout_s(tmp_path: Path) -> None:
    """A port that accepts connections and never answers: init and finish each wait the
    recorder's ``finish_timeout_s`` for the sink, then go on without it."""
    from goodtrace.sinks.mlflow import MlflowSink

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        sink = MlflowSink(f"http://127.0.0.1:{silent.getsockname()[1]}")
        with pytest.warns(gt.GoodtraceWarning) as caught:
            train(tmp_path / "run", [sink], finish_timeout_s=0.5)
    messages = [str(w.message) for w in caught]
    assert any("still opening after 0.5 s" in m for m in messages), messages
    assert any("did not close in time" in m for m in messages), messages


def test_an_export_logs_every_point_and_tag_in_few_calls(tmp_path: Path) -> None:
    """``goodtrace export`` (an export id set) logs MLflow's most points (1,000) and tags (100) a
    call, not a call a step: every one arrives, with its step and time."""
    from goodtrace.record.live.sink_hub import SinkRun
    from goodtrace.sinks.mlflow import MlflowSink

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sink = MlflowSink(uri, experiment="export")
    sink.export_id = "abc"
    run = SinkRun(run_dir=str(tmp_path / "run"), session="", rank=0, world_size=1, local_rank=0, host="",
                  restart=None)
    sink.run = run
    sink.start(run)
    calls: list[int] = []
    log_batch = sink._client.log_batch

    def counted(*args: object, **kwargs: list[object]) -> None:
        calls.append(sum(len(v) for v in kwargs.values()))
        log_batch(*args, **kwargs)

    sink._client.log_batch = counted
    for step in range(250):  # 2,250 points
        sink.scalars(step, {f"goodtrace/m{i}": step + i / 10 for i in range(9)}, wall_time_s=1_000 + step)
    for k in range(150):
        sink.event(k, "goodtrace/event/checkpoint", f"saved {k}")
    sink.summary(249, {"goodtrace/summary/goodput": 0.5}, {f"goodtrace/summary/attempt_{i}": f"a{i}" for i in range(120)})
    sink.shutdown()
    assert sum(calls) == 2_250 + 1 + 150 + 120 and len(calls) <= 3 + 3, calls
    client = mlflow.MlflowClient(tracking_uri=uri)
    logged = client.get_run(sink.run_id)
    assert logged.info.status == "FINISHED"
    for i in range(9):
        history = sorted((m.step, m.value, m.timestamp) for m in client.get_metric_history(sink.run_id, f"goodtrace/m{i}"))
        assert history == [(s, pytest.approx(s + i / 10), (1_000 + s) * 1_000) for s in range(250)]
    assert logged.data.metrics["goodtrace/summary/goodput"] == 0.5
    tags = logged.data.tags
    assert [tags[f"goodtrace/event/checkpoint/{k + 1}"] for k in range(150)] == [f"step {k}, saved {k}" for k in range(150)]
    assert all(tags[f"goodtrace/summary/attempt_{i}"] == f"a{i}" for i in range(120))
