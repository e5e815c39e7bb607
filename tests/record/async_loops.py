"""Training loops on the simulated asynchronous device, run as a real child process by
``test_completion_dating.py``: ``python async_loops.py '{"shape": ..., "run_dir": ..., "out": ...}'``.

Each loop records with goodtrace's public API into ``run_dir`` and writes to ``out`` the
ground truth (the device's log: when each kernel started, finished and became visible, in
order of launch, with the execution it belongs to), the host marks the test needs, and the
wake-up slack of this machine measured here (how late a thread sleeping one poll interval
wakes while the device runs kernels), which bounds how late the readiness check can date a
completion.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from typing import Any

import goodtrace as gt
from goodtrace.testing import DeviceValue, SimulatedDevice

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


class Loop:
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


def idle_tail(loop: Loop) -> None:
    """Item 1: the last step's value is looked at only by finish(), after a 360 ms idle tail."""
    for k, seconds in enumerate([0.030, 0.040, 0.030, 0.040]):
        with loop.step(k) as s:
            time.sleep(0.001)
            s.complete_on(loop.launch(seconds))
    loop.marks["tail_begin"] = time.perf_counter_ns()
    time.sleep(0.360)  # the program does something else: teardown, not step 3
    loop.marks["finish_called"] = time.perf_counter_ns()


def repeated_steps(loop: Loop) -> None:
    """Item 4: step numbers that repeat and go back; each execution has its own kernel."""
    numbers = loop.config["numbers"]
    durations = [0.020, 0.045, 0.030, 0.050, 0.025, 0.040][: len(numbers)]
    for number, seconds in zip(numbers, durations, strict=True):
        with loop.step(number) as s:
            time.sleep(0.001)
            s.complete_on(loop.launch(seconds))


def checkpoint_loop(loop: Loop) -> None:
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


def _checkpoint(self: Loop) -> None:
    self.marks["ckpt_enter"] = time.perf_counter_ns()
    with gt.span("checkpoint"):
        self.marks["save_begin"] = time.perf_counter_ns()
        time.sleep(0.060)  # the save itself (host work)
        self.marks["save_end"] = time.perf_counter_ns()


Loop.checkpoint = _checkpoint  # type: ignore[attr-defined]


def data_stall(loop: Loop) -> None:
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


def uncaught_exception(loop: Loop) -> None:
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


def hung_device(loop: Loop) -> None:
    """Shutdown: the device never finishes step 2's kernel; the loop blocks waiting for it
    (lag 1, at the end of step 3) until the test sends SIGTERM."""
    for k in range(4):
        with loop.step(k) as s:
            time.sleep(0.001)
            s.complete_on(loop.launch(math.inf if k == 2 else 0.020))
            if k == 3:
                write_result(loop)
                print("blocked", flush=True)  # the end of this step waits for step 2 forever


def hung_device_exit(loop: Loop) -> None:
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


SHAPES = {
    "idle_tail": idle_tail,
    "repeated_steps": repeated_steps,
    "checkpoint": checkpoint_loop,
    "data_stall": data_stall,
    "uncaught_exception": uncaught_exception,
    "hung_device": hung_device,
    "hung_device_exit": hung_device_exit,
}
NO_FINISH = {"uncaught_exception", "hung_device", "hung_device_exit"}
_loop: Loop | None = None


def write_result(loop: Loop) -> None:
    result = loop.result()
    tmp = loop.config["out"] + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(result, handle)
    os.replace(tmp, loop.config["out"])


def main() -> None:
    config = json.loads(sys.argv[1])
    loop = Loop(config)
    loop.marks["wake_slack_ns"] = wake_slack_ns(loop.device, POLL_INTERVAL_S)
    loop.marks["synchronizes_before"] = loop.device.synchronizes
    gt.init(config["run_dir"], poll_interval_s=POLL_INTERVAL_S, **config.get("options", {}))
    SHAPES[config["shape"]](loop)
    if config["shape"] in NO_FINISH:
        return
    gt.finish()
    loop.device.close()
    write_result(loop)


if __name__ == "__main__":
    main()
