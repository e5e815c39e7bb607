"""``goodtrace export`` run (in-process, tests/helpers/cli.py) on the golden restart run: every step execution and
the summary land in TensorBoard, MLflow and W&B (offline), read back with their own readers."""

from __future__ import annotations

from pathlib import Path

import pytest

from goodtrace.analysis import analyze
from goodtrace.analysis.attempts import KILLED
from goodtrace.read.load import load_run
from goodtrace.sinks import row_scalars, summary_values
from helpers.cli import goodtrace

pytestmark = pytest.mark.processes

RESTART = Path(__file__).parent.parent / "data" / "runs" / "restart_2ranks"


def _ends() -> list[float]:
    """Each step row's end on the wall clock, in seconds: when its exported point was true."""
    return [row.end_ns / 1e9 for row in analyze(load_run(RESTART)).steps]


def _expected() -> tuple[list[tuple[int, dict[str, float]]], dict[str, float], dict[str, str]]:
    analysis = analyze(load_run(RESTART))
    numbers, texts = summary_values(analysis)
    return [(row.step, row_scalars(row)) for row in analysis.steps], numbers, texts


def test_export_to_tensorboard(tmp_path: Path) -> None:
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    done = goodtrace("export", str(RESTART), "--to", "tensorboard", str(tmp_path / "tb"))
    assert done.returncode == 0, done.stderr
    assert "exported 10 step rows" in done.stdout
    reader = event_accumulator.EventAccumulator(str(tmp_path / "tb"))
    reader.Reload()
    rows, numbers, _ = _expected()
    step_times = [(e.step, e.value) for e in reader.Scalars("goodtrace/step_time_s")]
    # steps 3 and 4 ran twice (before and after the restart): both executions are there, in order
    assert [s for s, _ in step_times] == [s for s, _ in rows] == [0, 1, 2, 3, 4, 3, 4, 5, 6, 7]
    assert [v for _, v in step_times] == pytest.approx([r["goodtrace/step_time_s"] for _, r in rows], rel=1e-6)
    assert [e.value for e in reader.Scalars("goodtrace/attempt")] == [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
    (goodput,) = reader.Scalars("goodtrace/summary/goodput")
    assert goodput.value == pytest.approx(8.0 / 16.5, rel=1e-6) == pytest.approx(numbers["goodtrace/summary/goodput"])
    (wasted,) = reader.Scalars("goodtrace/summary/wasted_progress_s")
    assert wasted.value == pytest.approx(2.0)


def test_export_to_mlflow(tmp_path: Path) -> None:
    mlflow = pytest.importorskip("mlflow")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = goodtrace("export", str(RESTART), "--to", "mlflow", uri, "--name", "restart")
    assert done.returncode == 0, done.stderr
    client = mlflow.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("goodtrace").experiment_id])
    assert run.info.run_name == "restart" and run.info.status == "FINISHED"
    rows, numbers, texts = _expected()
    history = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "goodtrace/train_s")]
    assert sorted(history) == sorted((s, pytest.approx(r["goodtrace/train_s"])) for s, r in rows)
    for name, value in numbers.items():
        assert run.data.metrics[name] == pytest.approx(value), name
    assert {k: v for k, v in run.data.tags.items() if k.startswith("goodtrace/summary/")} == texts
    assert texts["goodtrace/summary/attempt_0"].startswith(f"{KILLED} (rank 0: no finish record), steps 0-4")


def test_export_to_wandb_offline(tmp_path: Path) -> None:
    pytest.importorskip("wandb.sdk.internal.datastore", reason="wandb>=0.30 dropped its Python reader")
    from helpers.wandb_offline import read_offline_run

    done = goodtrace("export", str(RESTART), "--to", "wandb", "goodtrace-export", "--wandb-mode", "offline",
                     "--wandb-dir", str(tmp_path), env={"WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true",
                                                       "WANDB_CONFIG_DIR": str(tmp_path / "config")})
    assert done.returncode == 0, done.stderr
    history, summary = read_offline_run(tmp_path)
    rows, numbers, _ = _expected()
    exported = [(int(r["goodtrace/step"]), r["goodtrace/train_s"])
                for r in history if "goodtrace/step" in r]
    assert exported == [(s, pytest.approx(r["goodtrace/train_s"])) for s, r in rows]
    assert summary["goodtrace/summary/goodput"] == pytest.approx(numbers["goodtrace/summary/goodput"])


def test_exporting_twice_to_tensorboard_replaces_the_first_export(tmp_path: Path) -> None:
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    for _ in range(2):
        done = goodtrace("export", str(RESTART), "--to", "tensorboard", str(tmp_path / "tb"))
        assert done.returncode == 0, done.stderr
    reader = event_accumulator.EventAccumulator(str(tmp_path / "tb"))
    reader.Reload()
    points = reader.Scalars("goodtrace/step_time_s")
    assert [e.step for e in points] == [0, 1, 2, 3, 4, 3, 4, 5, 6, 7]  # once each, not twice
    assert [e.wall_time for e in points] == pytest.approx(_ends(), abs=1e-3)  # the steps' time, not the export's
    assert len(reader.Scalars("goodtrace/summary/goodput")) == 1


def test_exporting_twice_to_mlflow_keeps_one_run_dated_by_the_steps(tmp_path: Path) -> None:
    mlflow = pytest.importorskip("mlflow")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for _ in range(2):
        done = goodtrace("export", str(RESTART), "--to", "mlflow", uri)
        assert done.returncode == 0, done.stderr
    client = mlflow.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("goodtrace").experiment_id])
    history = sorted(client.get_metric_history(run.info.run_id, "goodtrace/step_time_s"), key=lambda m: m.timestamp)
    assert [m.timestamp for m in history] == [round(t * 1000) for t in _ends()]


def test_exporting_twice_to_wandb_offline_keeps_one_run_dated_by_the_steps(tmp_path: Path) -> None:
    pytest.importorskip("wandb.sdk.internal.datastore", reason="wandb>=0.30 dropped its Python reader")
    from helpers.wandb_offline import read_offline_run

    for _ in range(2):
        done = goodtrace("export", str(RESTART), "--to", "wandb", "goodtrace-export", "--wandb-mode", "offline",
                         "--wandb-dir", str(tmp_path), env={"WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true",
                                                           "WANDB_CONFIG_DIR": str(tmp_path / "config")})
        assert done.returncode == 0, done.stderr
    history, _ = read_offline_run(tmp_path)  # exactly one offline run
    rows = [r for r in history if "goodtrace/step_time_s" in r]
    assert [r["_timestamp"] for r in rows] == pytest.approx(_ends())


def test_the_run_s_events_and_how_attempts_ended_are_exported(tmp_path: Path) -> None:
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    import goodtrace as gt

    gt.init(tmp_path / "run")
    gt.event("model", parameters=1234)
    for step in range(3):
        with gt.step(step):
            pass
    gt.event("exception", type="RuntimeError")
    gt.finish(completed=False)
    done = goodtrace("export", str(tmp_path / "run"), "--to", "tensorboard", str(tmp_path / "tb"))
    assert done.returncode == 0, done.stderr
    reader = event_accumulator.EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    reader.Reload()
    texts = {tag: [t.tensor_proto.string_val[0].decode() for t in reader.Tensors(tag)]
             for tag in reader.Tags()["tensors"]}
    (model,) = texts["goodtrace/event/model/text_summary"]
    assert "rank 0, attempt 0" in model and "parameters=1234" in model
    (exception,) = texts["goodtrace/event/exception/text_summary"]
    assert "type=RuntimeError" in exception


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--to", "nowhere"], "--to nowhere: expected one of tensorboard, mlflow, wandb"),
        (["--to", "tensorboard"], "--to tensorboard needs a DIR"),
        (["--to", "tensorboard", "a", "b"], "--to tensorboard takes one DIR, got a b"),
    ],
)
def test_bad_targets_are_one_line_errors(args: list[str], message: str) -> None:
    done = goodtrace("export", str(RESTART), *args)
    assert done.returncode == 2
    assert done.stderr.strip() == f"goodtrace export: error: {message}"


def test_a_missing_or_empty_run_directory_is_a_one_line_error(tmp_path: Path) -> None:
    done = goodtrace("export", str(tmp_path / "nope"), "--to", "tensorboard", str(tmp_path / "tb"))
    assert done.returncode == 2 and "does not exist" in done.stderr and "Traceback" not in done.stderr
    (tmp_path / "empty").mkdir()
    done = goodtrace("export", str(tmp_path / "empty"), "--to", "tensorboard", str(tmp_path / "tb"))
    assert done.returncode == 2 and "not a goodtrace run directory" in done.stderr and "Traceback" not in done.stderr
    done = goodtrace("export", str(RESTART), "--to", "mlflow", "nosuchscheme://x")
    assert done.returncode == 2 and done.stderr.startswith("goodtrace export: error: export to mlflow failed")
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
