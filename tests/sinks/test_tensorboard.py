"""TensorBoard sink: event files read back with TensorBoard's own event reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.sinks import STEPS, CaptureSink, train
from helpers.sinks_expected import JOB_GOODPUT, analysis_of, expected_live, expected_summary

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
    interval = range(21, STEPS + 1)  # the last line's log interval; loss is reduced with "mean"
    assert scalars["goodtrace/metric/loss"][STEPS] == pytest.approx(sum(1 / s for s in interval) / len(interval), rel=1e-6)
    numbers, attempts = expected_summary(tmp_path / "run", capture.lines[-1])
    assert numbers["goodtrace/summary/attempt/checkpoint_save_s"] > 0
    for name, value in numbers.items():
        assert scalars[name][STEPS] == pytest.approx(value, rel=1e-6, abs=1e-9), name
    assert texts == attempts and texts["goodtrace/summary/attempt_0"].startswith("this attempt, steps 1-25")
    # one attempt: the job's goodput is the report's, up to the live line's estimate
    report = analysis_of(tmp_path / "run").partition.goodput
    assert numbers["goodtrace/summary/goodput"] == pytest.approx(report, abs=0.02)


def test_all_ranks_write_beside_rank_0(tmp_path: Path) -> None:
    from goodtrace.sinks.tensorboard import TensorBoardSink

    train(tmp_path / "run", [TensorBoardSink(tmp_path / "tb", all_ranks=True)], rank=1, world_size=2)
    scalars, _ = _read(tmp_path / "tb" / "rank-1")
    assert sorted(scalars["goodtrace/step_time_s"]) == [10, 20, STEPS]
    assert not any(p.is_file() for p in (tmp_path / "tb").iterdir())  # rank 0 did not run here



KILLED_CHILD = """
import sys, time
import goodtrace as gt
from goodtrace.sinks.tensorboard import TensorBoardSink

class Printed:  # says which live lines went to the sinks
    name, ranks = "printed", "zero"
    def open(self, run): pass
    def write(self, line): sys.stdout.write(f"line {line.step}\\n"); sys.stdout.flush()  # one write: no interleaving
    def close(self, finished): pass

run_dir, tb_dir, flush = sys.argv[1], sys.argv[2], float(sys.argv[3])
gt.init(run_dir, flush_interval_s=flush, sinks=[TensorBoardSink(tb_dir), Printed()])
for step in range(1, 62):
    with gt.step(step) as s:
        time.sleep(0.005)
        s.complete_on(1.0)
sys.stdout.write("idle\\n"); sys.stdout.flush()
time.sleep(600)  # alive, recording nothing, until killed
"""


@pytest.mark.processes
def test_a_killed_ranks_event_file_has_every_line_sent_a_flush_interval_before(tmp_path: Path) -> None:
    """The sink is flushed on goodtrace's heartbeat cadence: a rank killed two flush intervals
    (plus this machine's measured lateness) after its last live line has that line in its event
    file (it stayed in the file's buffer for up to 10 s before, 40 steps at the issue's rate)."""
    import re
    import signal
    import subprocess
    import sys
    import time

    from helpers.loops import oversleep

    flush = 0.2
    child = subprocess.Popen([sys.executable, "-c", KILLED_CHILD, str(tmp_path / "run"), str(tmp_path / "tb"),
                              str(flush)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        printed: list[int] = []
        for text in child.stdout:
            if text.strip() == "idle":
                break
            printed += [int(step) for step in re.findall(r"line (\d+)", text)]
        late = oversleep()
        time.sleep(2 * flush + 2 * late + 0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        if child.stdout is not None:  # lines the sink thread printed after "idle"
            printed += [int(step) for step in re.findall(r"line (\d+)\n", child.stdout.read())]
            child.stdout.close()
    assert printed and printed[-1] >= 50
    scalars, _ = _read(tmp_path / "tb")
    assert max(scalars.get("goodtrace/step_time_s", {0: 0.0})) == printed[-1]
