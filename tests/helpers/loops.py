"""Training-loop shapes on the simulated asynchronous device, each run in its own process.

Two ways to run one:

- ``python loops.py SHAPE RUN_DIR LOG`` (``helpers/shapes.py``, the report-level tests) records
  one loop of ``SHAPES`` with the real recorder into RUN_DIR and writes the ground truth to LOG
  (JSON): the device's log of every kernel (true start and end, ``perf_counter_ns``), the
  host's own marks (step entries, stalls, saves), and the clock slack this machine showed while
  the loop ran (how late a sleeping thread woke), which bounds how far any measured time may be
  from the truth. The tests compare ``goodtrace report --json`` with this log.
- ``python loops.py '{"shape": ..., "run_dir": ..., "out": ...}'`` (``record/
  test_completion_dating.py``, the record-level tests) runs one loop of ``DATED_SHAPES``
  (see ``DatedLoop``) and writes to ``out`` each kernel's start, finish and visibility with
  the execution it belongs to, the host marks, and the wake-up slack measured before the loop.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import goodtrace as gt
from goodtrace.testing import DeviceValue, SimulatedDevice

MS = 1e-3


def oversleep(samples: int = 20) -> float:
    """The worst lateness of a 5 ms sleep here, now: the scheduler's share of any bound."""
    worst = 0.0
    for _ in range(samples):
        t0 = time.perf_counter()
        time.sleep(0.005)
        worst = max(worst, time.perf_counter() - t0 - 0.005)
    return worst


class Slack:
    """How late this machine wakes a sleeping thread, measured beside the loop."""

    def __init__(self) -> None:
        self.worst_ns = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter_ns()
            time.sleep(0.001)
            self.worst_ns = max(self.worst_ns, time.perf_counter_ns() - t0 - 1_000_000)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.worst_ns


def _sleep(seconds: float) -> None:
    """Host work of a known duration (sleep most of it, spin the rest)."""
    deadline = time.perf_counter_ns() + round(seconds * 1e9)
    remaining = deadline - time.perf_counter_ns()
    if remaining > 2_000_000:
        time.sleep((remaining - 1_500_000) / 1e9)
    while time.perf_counter_ns() < deadline:
        pass


def idle_tail(device: SimulatedDevice, marks: dict[str, Any]) -> None:
    """Item 1: eight 40 ms steps; nothing reads the last value until finish(), 360 ms later."""
    for k in range(8):
        with gt.step(k) as s:
            s.complete_on(device.launch(40 * MS, f"step{k}"))
    device.synchronize()
    marks["tail_from"] = time.perf_counter_ns()
    _sleep(360 * MS)


def checkpoint_before_complete_on(device: SimulatedDevice, marks: dict[str, Any], *, first: bool = False) -> None:
    """Item 2: 40 ms steps; every 4th saves a 20 ms checkpoint inside the step before
    complete_on (MaxText's order before its fix), or after it (``first``)."""
    marks["saves"] = []
    for k in range(12):
        with gt.step(k) as s:
            loss = device.launch(40 * MS, f"step{k}")
            if first:
                s.complete_on(loss)
            if k % 4 == 3:
                with gt.span("checkpoint", category="checkpoint_save"):
                    t0 = time.perf_counter_ns()
                    _sleep(20 * MS)
                    marks["saves"].append((t0, time.perf_counter_ns()))
            if not first:
                s.complete_on(loss)


def host_synchronous(device: SimulatedDevice, marks: dict[str, Any]) -> None:
    """Item 3: a loop without complete_on that waits for every step itself (TorchTitan style)."""
    marks["entries"] = []
    for k in range(10):
        with gt.step(k):
            marks["entries"].append(time.perf_counter_ns())
            float(device.launch(20 * MS, f"step{k}"))


def repeated_steps(device: SimulatedDevice, marks: dict[str, Any], numbers: tuple[int, ...] = (1, 2, 2, 3, 4, 5)) -> None:
    """Item 4: step numbers that repeat (a retried step); every execution 60 ms of device time."""
    marks["numbers"] = list(numbers)
    for k in numbers:
        with gt.step(k) as s:
            s.complete_on(device.launch(60 * MS, f"step{k}"))


def rewinding_steps(device: SimulatedDevice, marks: dict[str, Any]) -> None:
    repeated_steps(device, marks, (1, 2, 2, 3, 1))


def crash(device: SimulatedDevice, marks: dict[str, Any]) -> None:
    """Item 5: 40 ms steps; the process dies (os._exit) while step 6 is queued, after steps
    0-5 completed on the device (an uncaught exception is the ``exception`` shape)."""
    for k in range(7):
        with gt.step(k) as s:
            s.complete_on(device.launch(40 * MS if k < 6 else math.inf, f"step{k}"))
        if k == 5:
            device.launched[-1].block()
    _sleep(100 * MS)
    gt.flush()
    marks["died"] = time.perf_counter_ns()
    _write_marks(marks)
    os._exit(3)


def exception(device: SimulatedDevice, marks: dict[str, Any]) -> None:
    for k in range(4):
        with gt.step(k) as s:
            s.complete_on(device.launch(20 * MS, f"step{k}"))
    _write_marks(marks)
    raise ValueError("the loss went to nan")


def sleep_only(device: SimulatedDevice, marks: dict[str, Any]) -> None:
    """Item 6: an eager loop where nothing compiles: every step 30 ms of host work."""
    for k in range(12):
        with gt.step(k) as s:
            _sleep(30 * MS)
            s.complete_on(1.0)


def data_stall(device: SimulatedDevice, marks: dict[str, Any]) -> None:
    """Item 9: 10 ms device steps; the host waits 300 ms for data in step 6."""
    marks["stall"] = None
    for k in range(10):
        with gt.step(k) as s:
            if k == 6:
                t0 = time.perf_counter_ns()
                with gt.span("data"):
                    _sleep(300 * MS)
                marks["stall"] = (t0, time.perf_counter_ns())
            s.complete_on(device.launch(10 * MS, f"step{k}"))


def rollbacks(device: SimulatedDevice, marks: dict[str, Any], plan: dict[int, tuple[int, int]], last: int, *,
              explicit: bool, first: int = 0, recovery_s: float = 0.0) -> None:
    """40 ms steps ``first`` .. ``last``; after step ``at`` (once each) a loss check fails: the
    host waits for the step, spends ``recovery_s`` in no span (an in-process restart's
    re-initialisation), a 30 ms checkpoint restore (``restore`` span), optionally
    ``gt.event("rollback", to_step=...)``, and the loop goes on at the plan's resume step (above
    ``to_step + 1``: skipped batches)."""
    marks["numbers"], marks["restores"], marks["recoveries"] = [], [], []
    done: set[int] = set()
    step = first
    while step <= last:
        with gt.step(step) as s:
            s.complete_on(device.launch(40 * MS, f"step{step}"))
        marks["numbers"].append(step)
        if step in plan and step not in done:
            done.add(step)
            to_step, resume = plan[step]
            if recovery_s:
                device.launched[-1].block()
                t0 = time.perf_counter_ns()
                _sleep(recovery_s)
                marks["recoveries"].append((t0, time.perf_counter_ns()))
            with gt.span("restore", category="checkpoint_restore"):
                t0 = time.perf_counter_ns()
                _sleep(30 * MS)
                marks["restores"].append((t0, time.perf_counter_ns()))
            if explicit:
                gt.event("rollback", to_step=to_step)
            step = resume
            continue
        step += 1


def rollback_then_crash(device: SimulatedDevice, marks: dict[str, Any]) -> None:
    """Attempt 0 of a restart: 0-8, a rollback to 4, 5-9, and the process dies while step 10 is
    queued (as ``crash``); ``restart_at_7`` is the new process that follows."""
    rollbacks(device, marks, {8: (4, 5)}, 9, explicit=False)
    with gt.step(10) as s:
        s.complete_on(device.launch(math.inf, "step10"))
    device.launched[-2].block()
    _sleep(100 * MS)
    gt.flush()
    marks["died"] = time.perf_counter_ns()
    _write_marks(marks)
    os._exit(3)


def restart_at_7(device: SimulatedDevice, marks: dict[str, Any]) -> None:
    """The new process after ``rollback_then_crash``: restores the checkpoint of step 6 and runs 7-12."""
    with gt.span("restore", category="checkpoint_restore"):
        _sleep(30 * MS)
    rollbacks(device, marks, {}, 12, explicit=False, first=7)


SHAPES = {
    "rollback": lambda d, m: rollbacks(d, m, {8: (4, 5)}, 11, explicit=False),
    "rollback_explicit": lambda d, m: rollbacks(d, m, {8: (4, 5)}, 11, explicit=True),
    "rollback_skipping": lambda d, m: rollbacks(d, m, {8: (4, 7)}, 11, explicit=True),
    "rollback_skipping_inferred": lambda d, m: rollbacks(d, m, {8: (4, 7)}, 11, explicit=False),
    "two_rollbacks": lambda d, m: rollbacks(d, m, {8: (4, 5), 10: (7, 8)}, 12, explicit=False),
    "in_process_restart": lambda d, m: rollbacks(d, m, {8: (4, 5)}, 11, explicit=False, recovery_s=80 * MS),
    "rollback_then_crash": rollback_then_crash,
    "restart_at_7": restart_at_7,
    "idle_tail": idle_tail,
    "checkpoint_before_complete_on": checkpoint_before_complete_on,
    "checkpoint_after_complete_on": lambda d, m: checkpoint_before_complete_on(d, m, first=True),
    "host_synchronous": host_synchronous,
    "repeated_steps": repeated_steps,
    "rewinding_steps": rewinding_steps,
    "crash": crash,
    "exception": exception,
    "sleep_only": sleep_only,
    "data_stall": data_stall,
}

# The record-level harness (a JSON config as the one argument).

POLL_INTERVAL_S = 0.002


def wake_slack_ns(device: SimulatedDevice, interval_s: float, samples: int = 150) -> int:
    """The largest overshoot of ``sleep(interval_s)`` in a thread while the device runs
    kernels (its worker spins the last 1.5 ms of each, holding the GIL, as the device will
    during the loop)."""
    for _ in range(8):
        device.launch(0.020, "calibration")
    late: list[int] = []

    def sleeper() -> None:
        for _ in range(samples):
            t0 = time.perf_counter_ns()
            time.sleep(interval_s)
            late.append(time.perf_counter_ns() - t0 - round(interval_s * 1e9))

    thread = threading.Thread(target=sleeper)
    thread.start()
    thread.join()
    device.synchronize()
    return max(late)


class DatedLoop:
    """A loop on its own simulated device that logs each kernel with its execution's seq."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.device = SimulatedDevice()
        self.kernels: list[tuple[int, DeviceValue]] = []  # (seq of its execution, value)
        self.marks: dict[str, Any] = {}
        self.seq = -1

    def launch(self, seconds: float) -> DeviceValue:
        value = self.device.launch(seconds, f"exec{self.seq}")
        self.kernels.append((self.seq, value))
        return value

    def step(self, number: int) -> Any:
        self.seq += 1
        return gt.step(number)

    def result(self) -> dict[str, Any]:
        return {
            "kernels": [dict(value.log(), seq=seq) for seq, value in self.kernels],
            "marks": self.marks,
            "poll_interval_ns": round(POLL_INTERVAL_S * 1e9),
            "synchronizes": self.device.synchronizes,
        }


def dated_idle_tail(loop: DatedLoop) -> None:
    """Item 1: the last step's value is looked at only by finish(), after a 360 ms idle tail."""
    for k, seconds in enumerate([0.030, 0.040, 0.030, 0.040]):
        with loop.step(k) as s:
            time.sleep(0.001)
            s.complete_on(loop.launch(seconds))
    loop.marks["tail_begin"] = time.perf_counter_ns()
    time.sleep(0.360)  # the program does something else: teardown, not step 3
    loop.marks["finish_called"] = time.perf_counter_ns()


def dated_repeated_steps(loop: DatedLoop) -> None:
    """Item 4: step numbers that repeat and go back; each execution has its own kernel."""
    numbers = loop.config["numbers"]
    durations = [0.020, 0.045, 0.030, 0.050, 0.025, 0.040][: len(numbers)]
    for number, seconds in zip(numbers, durations, strict=True):
        with loop.step(number) as s:
            time.sleep(0.001)
            s.complete_on(loop.launch(seconds))


def dated_checkpoint(loop: DatedLoop) -> None:
    """Item 2: a checkpoint span in step 2, before (MaxText's order) or after complete_on."""
    order = loop.config["order"]
    for k in range(5):
        with loop.step(k) as s:
            time.sleep(0.001)
            loss = loop.launch(0.040)
            if k == 2 and order == "span_first":
                loop.checkpoint()
            s.complete_on(loss)
            if k == 2 and order == "complete_on_first":
                loop.checkpoint()


def _checkpoint(self: DatedLoop) -> None:
    self.marks["ckpt_enter"] = time.perf_counter_ns()
    with gt.span("checkpoint", category="checkpoint_save"):
        self.marks["save_begin"] = time.perf_counter_ns()
        time.sleep(0.060)  # the save itself (host work)
        self.marks["save_end"] = time.perf_counter_ns()


DatedLoop.checkpoint = _checkpoint  # type: ignore[attr-defined]


def dated_data_stall(loop: DatedLoop) -> None:
    """Item 9: 10 ms device steps; step 6 waits 300 ms for its batch on the host."""
    for k in range(9):
        with loop.step(k) as s:
            with gt.span("data"):
                if k == 6:
                    loop.marks["stall_begin"] = time.perf_counter_ns()
                    time.sleep(0.300)
                    loop.marks["stall_end"] = time.perf_counter_ns()
                else:
                    time.sleep(0.001)
            s.complete_on(loop.launch(0.010))


class DataLoaderCrash(RuntimeError):
    pass


def dated_uncaught_exception(loop: DatedLoop) -> None:
    """Endings: an exception no one catches ends the process after three steps (and one in a
    helper thread before that, which does not)."""

    def helper() -> None:
        raise KeyError("a helper thread failed")

    thread = threading.Thread(target=helper, name="prefetch")
    thread.start()
    thread.join()
    for k in range(3):
        with loop.step(k) as s:
            time.sleep(0.001)
            s.complete_on(loop.launch(0.020))
    loop.device.synchronize()
    write_result(loop)  # the process dies below: the result goes out first
    raise DataLoaderCrash("the data loader died")


def dated_hung_device(loop: DatedLoop) -> None:
    """Shutdown: the device never finishes step 2's kernel; the loop blocks waiting for it
    (lag 1, at the end of step 3) until the test sends SIGTERM."""
    for k in range(4):
        with loop.step(k) as s:
            time.sleep(0.001)
            s.complete_on(loop.launch(math.inf if k == 2 else 0.020))
            if k == 3:
                write_result(loop)
                print("blocked", flush=True)  # the end of this step waits for step 2 forever


def dated_hung_device_exit(loop: DatedLoop) -> None:
    """Shutdown: the device never finishes step 1's kernel and the program just ends (no
    finish(); lag large enough that nothing waited): interpreter exit must not wait."""
    for k in range(3):
        with loop.step(k) as s:
            time.sleep(0.001)
            value = loop.launch(math.inf if k == 1 else 0.020)
            s.complete_on(value)
            if k == 0:
                value.block()  # step 0 completes; the rest never will
    write_result(loop)


DATED_SHAPES = {
    "idle_tail": dated_idle_tail,
    "repeated_steps": dated_repeated_steps,
    "checkpoint": dated_checkpoint,
    "data_stall": dated_data_stall,
    "uncaught_exception": dated_uncaught_exception,
    "hung_device": dated_hung_device,
    "hung_device_exit": dated_hung_device_exit,
}
NO_FINISH = {"uncaught_exception", "hung_device", "hung_device_exit"}


def write_result(loop: DatedLoop) -> None:
    result = loop.result()
    tmp = loop.config["out"] + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(result, handle)
    os.replace(tmp, loop.config["out"])


def main_dated(config: dict[str, Any]) -> None:
    loop = DatedLoop(config)
    loop.marks["wake_slack_ns"] = wake_slack_ns(loop.device, POLL_INTERVAL_S)
    loop.marks["synchronizes_before"] = loop.device.synchronizes
    gt.init(config["run_dir"], poll_interval_s=POLL_INTERVAL_S, **config.get("options", {}))
    DATED_SHAPES[config["shape"]](loop)
    if config["shape"] in NO_FINISH:
        return
    gt.finish()
    loop.device.close()
    write_result(loop)


_state: dict[str, Any] = {}


def _write_marks(marks: dict[str, Any]) -> None:
    device: SimulatedDevice = _state["device"]
    slack: Slack = _state["slack"]
    out = {"device": device.log(), "marks": marks, "slack_ns": slack.worst_ns,
           "poll_ns": round(float(_state["poll_s"]) * 1e9)}
    Path(_state["log"]).write_text(json.dumps(out), encoding="utf-8")


def main() -> None:
    if len(sys.argv) == 2:
        main_dated(json.loads(sys.argv[1]))
        return
    shape, run_dir, log = sys.argv[1:4]
    device = SimulatedDevice()
    slack = Slack()
    poll_s = 0.002
    _state.update(device=device, slack=slack, log=log, poll_s=poll_s)
    marks: dict[str, Any] = {}
    gt.init(run_dir, rank=0, world_size=1, flush_interval_s=0.2)
    try:
        SHAPES[shape](device, marks)
        gt.finish(completed=True)
    finally:
        slack.stop()
        _write_marks(marks)
        device.close()


if __name__ == "__main__":
    main()
