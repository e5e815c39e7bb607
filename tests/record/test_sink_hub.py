"""The recording layer's side of sinks: lines on the sink's own thread, failing or slow sinks
dropped with one warning while the loop goes on, names and ranks resolved at init."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

import pytest

import goodtrace as gt
from goodtrace.record.config import ConfigError
from goodtrace.record.live.line import LiveLine
from goodtrace.record.live.sink_hub import SinkRun, parse_specs, resolve
from helpers.sinks import STEPS, CaptureSink, train


def test_a_sink_gets_every_live_line_on_its_own_thread_and_closes_after_the_files(tmp_path: Path) -> None:
    sink = CaptureSink()
    train(tmp_path / "run", [sink])
    assert [line.step for line in sink.lines] == [10, 20, STEPS]
    assert sink.closed is True
    assert sink.threads == {"goodtrace-sink-capture"}
    assert threading.main_thread().name not in sink.threads
    assert sink.run is not None and sink.run.rank == 0 and sink.run.run_dir == str(tmp_path / "run")
    last = sink.lines[-1]
    assert last.metrics["loss"].last == pytest.approx(1.0 / STEPS)
    assert last.overhead_total_s["checkpoint_save"] > 0.0  # the checkpoint after step 12, so far
    assert last.productive_s is not None and last.elapsed_s is not None and last.productive_s < last.elapsed_s
    assert last.rank_step_s == (pytest.approx(last.step_time_s),) and last.host_ranks == (0,)


class Failing(CaptureSink):
    name = "failing"

    def write(self, line: LiveLine) -> None:
        raise RuntimeError("backend is down")


class Blocked(CaptureSink):
    """Hangs in its first write until released: its queue fills while the loop runs on."""

    name = "blocked"

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def write(self, line: LiveLine) -> None:
        self.release.wait(30)
        super().write(line)


def test_a_failing_sink_is_dropped_with_one_warning_and_the_others_go_on(tmp_path: Path) -> None:
    failing, good = Failing(), CaptureSink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(tmp_path / "run", [failing, good])
    messages = [str(w.message) for w in caught if "failing" in str(w.message)]
    assert len(messages) == 1 and "backend is down" in messages[0], messages
    assert [line.step for line in good.lines] == [10, 20, STEPS]
    assert failing.closed is False  # closed without a summary after it failed


def test_a_slow_sink_is_dropped_and_never_holds_up_the_loop(tmp_path: Path) -> None:
    blocked = Blocked()
    gt.init(tmp_path / "run", sinks=[blocked])
    hub = gt.recorder().sink_hub  # type: ignore[union-attr]
    assert hub is not None
    worker = hub.workers[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(worker._queue.maxsize + 2):  # as many lines as the queue holds, and more
            hub.on_line(_line())
        steps_done = 0
        for step in range(1, 6):  # the loop still runs while the sink hangs
            with gt.step(step):
                gt.metric("loss", 1.0)
            steps_done += 1
        hub.close_timeout_s = 0.5
        gt.finish()
    blocked.release.set()
    assert steps_done == 5
    assert worker.dropped
    messages = [str(w.message) for w in caught if "blocked" in str(w.message)]
    assert len(messages) == 1 and "too slow" in messages[0], messages


def _line() -> LiveLine:
    return LiveLine(step=1, steps=1, ranks=1, step_time_s=0.1, train_s=0.1, overhead_s={}, metrics={},
                    tokens_per_s=None, tflops_per_s=None, mfu=None, goodput=0.5, timing="host", text="")


def test_sinks_run_on_the_ranks_they_ask_for(tmp_path: Path) -> None:
    zero, everywhere, per_host = CaptureSink("zero"), CaptureSink("all"), CaptureSink("host")
    train(tmp_path / "run", [zero, everywhere, per_host], rank=1, world_size=2, local_rank=1)
    assert zero.run is None and per_host.run is None  # never opened on rank 1 (local rank 1)
    assert everywhere.run is not None and everywhere.run.rank == 1
    assert [line.rank for line in everywhere.lines] == [1, 1, 1]  # rank 1's own line


def test_unknown_or_malformed_sinks_are_clear_errors_before_recording_starts(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown sink 'tensorbord'.*known sinks: .*tensorboard"):
        gt.init(tmp_path / "run", sinks=["tensorbord:runs/tb"])
    with pytest.raises(ConfigError, match="tensorboard needs a directory"):
        gt.init(tmp_path / "run", sinks=["tensorboard"])
    with pytest.raises(ConfigError, match="a sink must be a name"):
        gt.init(tmp_path / "run", sinks=[42])
    with pytest.raises(ConfigError, match="list of sink names"):
        gt.init(tmp_path / "run", sinks="tensorboard:runs/tb")
    assert not gt.is_enabled()
    assert not (tmp_path / "run").exists()


def test_goodtrace_sinks_names_the_sinks_of_a_launched_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_specs(" tensorboard:runs/tb , prometheus:127.0.0.1:0,") == ["tensorboard:runs/tb",
                                                                             "prometheus:127.0.0.1:0"]
    monkeypatch.setenv("GOODTRACE_SINKS", f"tensorboard:{tmp_path / 'tb'}")
    gt.init(tmp_path / "run")
    hub = gt.recorder().sink_hub  # type: ignore[union-attr]
    assert [sink.name for sink in hub.active] == ["tensorboard"]
    gt.finish()
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tb").iterdir())
    monkeypatch.setenv("GOODTRACE_SINKS", "nonsense")  # the launcher's: warned about, never fatal
    with pytest.warns(gt.GoodtraceWarning, match="unknown sink 'nonsense'"):
        gt.init(tmp_path / "run2")
    assert gt.is_enabled() and gt.recorder().sink_hub is None  # type: ignore[union-attr]
    gt.finish()


def test_resolve_keeps_objects_and_checks_their_ranks() -> None:
    sink = CaptureSink()
    assert resolve(sink) is sink
    with pytest.raises(ConfigError, match="ranks must be one of"):
        resolve(CaptureSink("everyone"))
    assert isinstance(SinkRun("d", "s", 0, 1, 0, "h", None), SinkRun)
