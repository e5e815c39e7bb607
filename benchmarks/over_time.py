"""Benchmark: goodput over time stays linear in the run's length.

Builds the reference timeline of a long run at one step per second (the pieces ``assemble``
makes: each step's productive time and its in-step ``data`` badput, a 30 s checkpoint every
1,000 steps, and a 20-minute gap between two attempts halfway), at two sizes an order of
magnitude apart: a day (86,400 steps) and ten days (864,000 steps; ``--quick``: 8,640 and
86,400). For each size it times, in this process, best of a few runs:

  one pass: ``goodput_over_time(timeline, 3600.0)`` (per UTC hour: a day's default) and with
      ``every_s=60`` (per minute: 1,440 or 14,400 periods), and ``rolling_goodput`` per hour;
  baseline: one ``interval_partition`` per hour over the whole timeline, the way rolling
      goodput was computed before (each clip bisects a list of every piece's start it builds
      first: O(pieces x periods)), on the smaller size, and on the larger one unless --quick.

It prints time per step for each and the ratios that say whether it stays flat: the larger
size's time per step over the smaller's (1.0 = linear), and the baseline over the one pass.
``--json``: the last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from goodtrace.analysis.goodput import interval_partition, rolling_goodput
from goodtrace.analysis.over_time import goodput_over_time
from goodtrace.analysis.partition import Timeline
from goodtrace.analysis.pieces import PieceBuilder

SECOND = 1_000_000_000
WALL0 = 1_700_000_000 * SECOND + 123_456_789  # not on a whole hour: partial first and last periods


def timeline_of(steps: int) -> Timeline:
    """One rank's timeline of ``steps`` one-second steps (see the module docstring), its pieces
    as the analysis holds them (columns)."""
    pieces = PieceBuilder()
    pieces.add(WALL0, WALL0 + 120 * SECOND, "startup", "init")
    t = WALL0 + 120 * SECOND
    for k in range(steps):
        if k == steps // 2:
            pieces.add(t, t + 1200 * SECOND, "disruption", "")
            t += 1200 * SECOND
        if k % 1000 == 999:
            pieces.add(t, t + 30 * SECOND, "checkpoint_save", "")
            t += 30 * SECOND
        data = 50_000_000 + (k * 7_919) % 20_000_000
        pieces.add(t, t + data, "data", "")
        pieces.add(t + data, t + SECOND, "productive", "")
        t += SECOND
    pieces.add(t, t + 60 * SECOND, "teardown", "")
    return Timeline(WALL0, t + 60 * SECOND, pieces.columns(), [], [])  # type: ignore[arg-type]


def best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def per_hour_baseline(timeline: Timeline) -> list[float]:
    """Goodput per hour from the job start, one clip of the whole timeline per hour."""
    out, a, width = [], timeline.start, 3600 * SECOND
    while a < timeline.end:
        b = min(a + width, timeline.end)
        out.append(interval_partition(timeline, a, b).goodput)
        a = b
    return out


def measure(steps: int, baseline: bool, repeat: int) -> dict[str, Any]:
    timeline = timeline_of(steps)
    hourly_s, hourly = best(lambda: goodput_over_time(timeline, 3600.0), repeat)
    minutes_s, minutes = best(lambda: goodput_over_time(timeline, 60.0), repeat)
    rolling_s, rolling = best(lambda: rolling_goodput(timeline, 3600.0), repeat)
    total = sum(sum(p.buckets_ns.values()) for p in hourly.periods)
    assert total == timeline.end - timeline.start, "the periods do not tile the job"
    row: dict[str, Any] = {
        "steps": steps, "pieces": len(timeline.pieces), "hours": len(hourly.periods),
        "minutes": len(minutes.periods), "over_time_hourly_s": round(hourly_s, 4),
        "over_time_per_minute_s": round(minutes_s, 4), "rolling_hourly_s": round(rolling_s, 4),
        "hourly_us_per_step": round(hourly_s / steps * 1e6, 3),
    }
    if baseline:
        base_s, goodputs = best(lambda: per_hour_baseline(timeline), 1)
        assert goodputs == [w.goodput for w in rolling], "the one pass and the clips disagree"
        row["baseline_clip_per_hour_s"] = round(base_s, 3)
        row["baseline_over_one_pass"] = round(base_s / rolling_s, 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8,640 and 86,400 steps (under a minute)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with the figures")
    args = parser.parse_args()
    small, large = (8_640, 86_400) if args.quick else (86_400, 864_000)
    rows = [measure(small, True, 5), measure(large, not args.quick, 3)]
    for row in rows:
        line = (f"{row['steps']:>9,} steps ({row['pieces']:,} pieces, {row['hours']} hours): per hour "
                f"{row['over_time_hourly_s'] * 1e3:8.1f} ms ({row['hourly_us_per_step']:.3f} us/step), per minute "
                f"{row['over_time_per_minute_s'] * 1e3:8.1f} ms ({row['minutes']:,} periods), rolling 1h "
                f"{row['rolling_hourly_s'] * 1e3:8.1f} ms")
        if "baseline_clip_per_hour_s" in row:
            line += f"; one clip per hour {row['baseline_clip_per_hour_s']:.2f} s ({row['baseline_over_one_pass']}x)"
        print(line)
    ratio = rows[1]["hourly_us_per_step"] / rows[0]["hourly_us_per_step"]
    print(f"time per step, {large:,} over {small:,} steps: {ratio:.2f} (1.0 = linear)")
    if args.json:
        print(json.dumps({"sizes": rows, "per_step_large_over_small": round(ratio, 3)}))


if __name__ == "__main__":
    main()
