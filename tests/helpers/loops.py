"""Training-loop shapes on the simulated asynchronous device, each run in its own process.

``python loops.py SHAPE RUN_DIR LOG`` records one loop with the real recorder into RUN_DIR and
writes the ground truth to LOG (JSON): the device's log of every kernel (true start and end,
``perf_counter_ns``), the host's own marks (step entries, stalls, saves), and the clock
slack this machine showed while the loop ran (how late a sleeping thread woke), which bounds
how far any measured time may be from the truth. The tests compare ``goodtrace report
--json`` with this log.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import goodtrace as gt
from goodtrace.testing import SimulatedDevice

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
                with gt.span("checkpoint"):
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
            with gt.span("restore"):
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
    with gt.span("restore"):
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

_state: dict[str, Any] = {}


def _write_marks(marks: dict[str, Any]) -> None:
    device: SimulatedDevice = _state["device"]
    slack: Slack = _state["slack"]
    out = {"device": device.log(), "marks": marks, "slack_ns": slack.worst_ns,
           "poll_ns": round(float(_state["poll_s"]) * 1e9)}
    Path(_state["log"]).write_text(json.dumps(out), encoding="utf-8")


def main() -> None:
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
