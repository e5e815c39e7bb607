"""Which ranks ``goodtrace watch``'s table shows when there are more than its rows: those that
most need a look first (lost, hung, still read, running, finished; then the furthest behind in
steps, then the longest unseen), fed records as the follower gives them."""

from __future__ import annotations

from typing import Any

from goodtrace.analysis.watching import RECENT_STEPS, RecentTimes, WatchState

S = 10**9
START = 1_700_000_000 * S


def _header(rank: int) -> dict[str, Any]:
    return {"kind": "header", "session": f"s{rank}", "rank": rank, "host": "elsewhere", "pid": 100 + rank,
            "wall": START, "mono": 0, "proc_start_mono": 0, "config": {"flush_interval_s": 1.0}}


def _steps(state: WatchState, rank: int, steps: int, step_s: float = 1.0) -> None:
    header = _header(rank)
    state.add(header, header)
    for k in range(steps):
        t0, t1 = round(k * step_s * S), round((k + 1) * step_s * S)
        state.add(header, {"kind": "step", "step": k, "seq": k, "t0": t0, "t1": t1})
        state.add(header, {"kind": "sync", "step": k, "seq": k, "t": t1, "how": "complete_on"})


def test_the_ranks_that_most_need_a_look_come_first() -> None:
    state = WatchState()
    for rank in range(40):
        _steps(state, rank, 100)
    _steps(state, 41, 90, step_s=100 / 90)  # behind (slower), seen at 100 s as the others
    _steps(state, 42, 95, step_s=100 / 95)  # behind, less
    _steps(state, 43, 20, step_s=3.0)  # behind and stale: lost (its last sign of life at 60 s)
    hung = _header(44)
    _steps(state, 44, 100)
    state.add(hung, {"kind": "event", "name": "hang", "t": 100 * S + 1, "attrs": {"since": 100 * S}})
    finished = _header(45)
    _steps(state, 45, 50)
    state.add(finished, {"kind": "finish", "t": 50 * S + 1, "reason": "finish"})
    state.reading["s46"] = 0.5
    _steps(state, 46, 10)
    now = START + 101 * S
    shown, others = state.rank_rows(now, 6)
    assert [(s.rank, status and status.text) for s, status in shown] == [
        (43, state.status(state.sessions["s43"], now).text), (44, "hung"), (46, None), (41, "running"), (42, "running"),
        (0, "running")]
    assert shown[0][1] is not None and shown[0][1].text.startswith("lost (no heartbeat since 2023-11-14 22:14:20 UTC)")
    assert sorted(others) == ["finished"] + ["running"] * 39  # the kinds of those left out
    everyone, none = state.rank_rows(now, 47)  # all of them fit: by rank
    assert [s.rank for s, _ in everyone] == sorted(s.rank for s, _ in everyone) and none == []


def test_a_process_keeps_its_last_step_times_in_order() -> None:
    times = RecentTimes()
    for k in range(2 * RECENT_STEPS + 123):
        times.append((k, 10 * k))
        assert len(times) == min(k + 1, RECENT_STEPS)
    kept = list(times)
    assert kept == [(k, 10 * k) for k in range(RECENT_STEPS + 123, 2 * RECENT_STEPS + 123)]
    steps, ns = times.columns()
    assert steps.tolist() == [s for s, _ in kept] and ns.tolist() == [t for _, t in kept]
    assert times.last() == kept[-1] and list(RecentTimes(kept[:3])) == kept[:3]


def _asynchronous_run(run_dir: Any, *, finished: bool) -> None:
    """One rank's asynchronous loop as the report's cut sees it: each step's sync point observed
    (``lag``) at the next step's very entry, so its in-step data loading found the device idle
    (badput by the host-overhead rule); a checkpoint every 10 steps; a header that names no
    overhead category (a writer that lists only the declared ones); finished, or lost (no
    heartbeat for years)."""
    from helpers.builders import Proc

    proc = Proc(run_dir)  # overhead=(): its header lists none
    t = 2.0
    proc.span("init", 0.0, t, cat="init")
    for k in range(60):
        proc.span("data", t, t + 0.05, step=k)
        proc.span("forward", t + 0.05, t + 0.45, cat="compute", step=k)
        proc.step(k, t, t + 0.45)
        if k:
            proc.sync(k - 1, t, how="lag")  # ready when the loop looked, at this step's entry
        t += 0.5
        if k % 10 == 9:
            proc.span("checkpoint", t, t + 1.0, cat="checkpoint_save", step=k)
            t += 1.0
        proc.heartbeat(t)
    proc.sync(59, t + 0.1, how="finish" if finished else "lag")
    if finished:
        proc.finish(t + 0.2)
    proc.write()


def test_the_goodput_shown_is_the_reports_to_the_bit(tmp_path: Any) -> None:
    """``goodtrace watch`` shows the lowest rank's goodput by the report's rules: the host-overhead
    rule (data loading from the previous step's sync point on is badput), the
    built-in overhead categories whatever the header lists, and a lost attempt's time ending at
    its last sign of life (not now: it was 0.5% of a 3-year-old run that the report put at
    99.6%)."""
    import time

    from goodtrace.analysis import analyze
    from goodtrace.cli.analysed import alive_here
    from goodtrace.cli.commands.watch import View
    from goodtrace.read.load import load_run

    for finished in (True, False):
        run_dir = tmp_path / ("finished" if finished else "lost")
        _asynchronous_run(run_dir, finished=finished)
        now = time.time_ns()
        report = analyze(load_run(run_dir), now_wall_ns=now, alive=alive_here)
        assert report.host_overhead.rule == "sync points"
        assert report.partition.buckets_ns.get("data") == 3 * S  # 60 x 50 ms: the device had nothing queued
        assert report.partition.buckets_ns.get("checkpoint_save") == 6 * S
        assert report.attempts[0].ended == ("completed" if finished else "lost"), report.attempts[0]
        view = View(str(run_dir))
        view.look(None)
        while view.follower.pending or view.follower.has_history:
            view.look(None)
        assert view.state.goodput(now) == report.partition.goodput, finished
        assert 0.7 < report.partition.goodput < 0.95
