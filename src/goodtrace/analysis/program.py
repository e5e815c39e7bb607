"""Program goodput (MFU) and the goodput product: scheduling x runtime x program."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import Any

from goodtrace import schema
from goodtrace.analysis.attempts import Attempt
from goodtrace.analysis.goodput import AnalysisError, Partition
from goodtrace.analysis.partition import PRODUCTIVE, Timeline
from goodtrace.read.loaded import LoadedRun

__all__ = ["ProgramGoodput", "model_figures", "program_goodput"]


@dataclasses.dataclass(frozen=True)
class ProgramGoodput:
    """MFU and the goodput product (docs/semantics.md section 5.4). Fields are None when unknown."""

    flops_per_step: float | None
    flops_source: str | None
    peak_flops_per_device: float | None
    accelerator: str | None
    devices: int
    counted_steps: int
    mfu: float | None  # program goodput: model FLOP/s over productive time / peak FLOP/s
    scheduling_goodput: float | None  # time since the first process start / time since submission
    runtime_goodput: float  # productive / time since the first process start
    ml_productivity_goodput: float | None  # scheduling x runtime x program

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def model_figures(run: LoadedRun, sessions: Sequence[int]) -> tuple[float | None, float | None]:
    """(FLOPs per step of one rank, peak FLOP/s of one of its devices) as the framework
    integration recorded them: a ``flops_per_step`` metric and a ``model`` event (goodtrace.integrations)."""
    values = [value for index in sessions if index in run.details for value in run.details[index].flops]
    peaks = [
        float(peak) for index in sessions if index in run.details
        for peak in (run.details[index].model.get("peak_flops"),)
        if isinstance(peak, (int, float)) and not isinstance(peak, bool) and peak > 0
    ]
    return (statistics.median(values) if values else None), (statistics.median(peaks) if peaks else None)


def program_goodput(
    run: LoadedRun,
    attempts: Sequence[Attempt],
    timeline: Timeline,
    partition: Partition,
    flops_per_step: float | None,
    peak_flops: float | None,
    accelerator: str | None,
    devices_per_rank: int,
    submit_wall: int | None,
    warnings: list[str] | None = None,
) -> ProgramGoodput:
    devices = max(1, attempts[-1].world) * max(1, devices_per_rank)
    source = "given" if flops_per_step is not None else None
    rank_flops, recorded_peak = model_figures(run, [a.reference_session for a in attempts])
    if rank_flops is not None and not rank_flops > 0:
        if warnings is not None:
            warnings.append(f"the recorded flops_per_step ({rank_flops:g}) is not positive: MFU is not computed")
        rank_flops = None
    if flops_per_step is None and rank_flops is not None:
        # the integration records one rank's FLOPs per step: the job's is world size times that
        flops_per_step = rank_flops * max(1, attempts[-1].world)
        source = "flops_per_step metric of rank 0 x world size"
    if peak_flops is None and accelerator is None and recorded_peak is not None:
        peak_flops = recorded_peak  # per device, like every peak_flops
    if peak_flops is None and accelerator is not None:
        from goodtrace.accelerators import peak_flops as lookup

        try:
            peak_flops = lookup(accelerator)
        except KeyError as exc:
            raise AnalysisError(str(exc.args[0])) from None
    counted = timeline.intervals.counted_steps()
    productive_s = partition.seconds(PRODUCTIVE)
    mfu = None
    if flops_per_step is not None and peak_flops and productive_s > 0:
        mfu = flops_per_step * counted / productive_s / (peak_flops * devices)
        if not math.isfinite(mfu):
            if warnings is not None:
                warnings.append(f"MFU cannot be computed from FLOPs per step {flops_per_step:g} and a peak of "
                                f"{peak_flops:g} FLOP/s per device (it is not a finite number): check both")
            mfu = None
        elif warnings is not None and mfu > 1.0:
            warnings.append(f"MFU comes out at {mfu:.0%}, above 100%: the FLOPs per step ({flops_per_step:g}) or the "
                            f"peak ({peak_flops:g} FLOP/s per device) is wrong")
    since_start = timeline.end - (submit_wall if submit_wall is not None and submit_wall < timeline.start
                                  else timeline.start)
    held = partition.total_ns - partition.buckets_ns.get(schema.BUCKET_SCHEDULING, 0)
    runtime = partition.buckets_ns.get(PRODUCTIVE, 0) / held if held > 0 else 0.0
    scheduling = held / since_start if submit_wall is not None and since_start > 0 else None
    product = None
    if mfu is not None:
        product = (scheduling if scheduling is not None else 1.0) * runtime * mfu
    return ProgramGoodput(
        flops_per_step=flops_per_step,
        flops_source=source,
        peak_flops_per_device=peak_flops,
        accelerator=accelerator,
        devices=devices,
        counted_steps=counted,
        mfu=mfu,
        scheduling_goodput=scheduling,
        runtime_goodput=runtime,
        ml_productivity_goodput=product,
    )
