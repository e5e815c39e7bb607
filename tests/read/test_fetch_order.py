"""What the reader fetches comes in one order whatever order DuckDB holds the rows in: records
that tie on their time (two metrics logged at one instant, two span names first started at the
same nanosecond, two events) are ordered by their other fields, so a report does not depend on
how the files were batched, cached or split between workers."""

from __future__ import annotations

import random

import duckdb
import numpy as np
import pytest

from goodtrace import columns, schema
from goodtrace.read import detail, duckdb_sql, model_fetch

_DETAIL = {
    "det_tags": [(0, 0, 1, "b", 100), (0, 0, 1, "a", 100), (0, 1, 2, "c", 200), (0, 1, 2, "a", 200)],
    "det_metrics": [(0, 0, 1, "loss", 2.0, 100), (0, 0, 1, "lr", 0.1, 100), (0, 0, 1, "grad", 5.0, 100),
                    (0, 1, 2, "loss", 1.5, 300), (0, 1, 2, "loss", 1.25, 300)],
    "det_flops": [(0, 0, 3.0, 50), (0, 0, 2.0, 50)],
    # two names first started at the same instant in step 1; "z" is also in the next file's step 1
    "det_spans": [(0, 0, 1, "z", 10, 40), (0, 0, 1, "fwd", 20, 40), (0, 0, 1, "bwd", 30, 60),
                  (0, 1, 1, "z", 5, 45), (0, 1, 2, "bwd", 7, 90), (0, 1, 2, "fwd", 8, 90)],
    "det_events": [(0, 0, "save", 70, 1, None), (0, 0, "eval", 70, 1, '{"k": 1}'), (0, 0, "eval", 70, 1, None)],
}


def _timeline(order: random.Random) -> tuple[object, ...]:
    con = duckdb.connect()
    detail.create_detail_tables(con)
    for table, rows in _DETAIL.items():
        shuffled = list(rows)
        order.shuffle(shuffled)
        marks = ", ".join("?" * len(shuffled[0]))
        con.executemany(f"INSERT INTO {table} VALUES ({marks})", shuffled)
    tl = detail.load_details(con, [0])[0]
    names = tl.names
    return (tl.span_names, [names[c] for c in tl.span_name], list(tl.span_step), list(tl.span_ns),
            [names[c] for c in tl.tag_name], list(tl.tag_step), [names[c] for c in tl.metric_name],
            list(tl.metric_value), tl.flops, [(e.name, e.t, e.step, e.attrs) for e in tl.events])


def test_the_reference_detail_is_fetched_in_one_order_whatever_the_rows_order() -> None:
    first = _timeline(random.Random(0))
    assert first[0] == ("fwd", "z", "bwd")  # first started at 40 (fwd and z: a tie, by name), then 60
    assert first[1:4] == (["bwd", "fwd", "z", "bwd", "fwd"], [1, 1, 1, 2, 2], [30, 20, 15, 7, 8])  # by step, name
    for seed in range(1, 12):
        assert _timeline(random.Random(seed)) == first


def test_span_time_summed_over_files_past_int64_is_an_error_not_a_wrapped_number() -> None:
    con = duckdb.connect()
    detail.create_detail_tables(con)
    con.executemany("INSERT INTO det_spans VALUES (?, ?, ?, ?, ?, ?)",
                    [(0, 0, 5, "fwd", 2**62 + 1, 10), (0, 1, 5, "fwd", 2**62, 20), (0, 0, 6, "fwd", 1, 30)])
    with pytest.raises(duckdb.ConversionException, match="out of range"):
        detail.load_details(con, [0])


def test_rows_are_ordered_by_one_combined_key_or_key_by_key_alike() -> None:
    rng = np.random.default_rng(3)
    unique = rng.permutation(500)
    for first, lo, hi in ((None, 0, 7), (None, -(2**62), 2**62), (unique, -(2**62), 2**62)):
        # all keys combined; the first combined and tied (then key by key); the first combined, untied
        sid = rng.integers(0, 3, 500) if first is None else first
        step, name = rng.integers(lo, hi, 500), rng.integers(0, 4, 500)
        step[::7] = step[0]  # ties on the first two keys
        assert columns.order_of(sid, step, name).tolist() == np.lexsort((name, step, sid)).tolist()
    wide = rng.integers(-(2**62), 2**62, 500)  # the first key too wide to combine
    assert columns.order_of(wide, sid).tolist() == np.lexsort((sid, wide)).tolist()


def test_rows_ordered_here_come_in_duckdbs_order_descending_keys_and_nulls_too() -> None:
    rng = random.Random(5)
    con = duckdb.connect()
    con.execute("CREATE TABLE t (sid INTEGER, t0 BIGINT, t1 BIGINT, step BIGINT, v INTEGER)")
    rows = [(rng.randrange(3), rng.randrange(5), rng.randrange(-3, 3), rng.choice([None, 1, 2, -(2**40)]), i)
            for i in range(400)]
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?)", rows)
    ours = [(sid, c["t0"].tolist(), c["t1"].tolist(), c["step"].tolist())
            for sid, c in model_fetch.by_session(con, "SELECT sid, t0, t1, step FROM t", ("sid", "t0", "-t1", "step"))]
    theirs = [(sid, c["t0"].tolist(), c["t1"].tolist(), c["step"].tolist()) for sid, c in model_fetch.by_session(
        con, "SELECT sid, t0, t1, step FROM t ORDER BY sid, t0, t1 DESC, step")]
    assert ours == theirs
    assert any(None in steps for _, _, _, steps in ours)


def _records(order: random.Random) -> tuple[object, ...]:
    con = duckdb.connect()
    duckdb_sql.create_segment_tables(con)
    rows = {
        "seg_summ": [(0, 0, 900, 0, 1, 2, 3, 3, 0, None, None, None, None, 0, 20, None, 100, 1, 2)],
        "seg_steps": [(0, 0, 0, 1, 100, 200), (0, 0, 1, 2, 200, 300), (0, 0, 2, 2, 300, 400)],  # step 2 re-done
        "seg_syncs": [(0, 0, -1, 1, 250, "lag", None), (0, 0, -1, 2, 250, "poll", None), (0, 0, -1, 2, 350, "lag", None)],
        "seg_spans": [(0, 0, "checkpoint_save", 120, 180, 1), (0, 0, "eval", 120, 180, 1), (0, 0, "data", 120, 180, 2)],
        "seg_device": [(0, 0, schema.DEVICE_METRICS[0], 2, 0.5, 310), (0, 0, schema.DEVICE_METRICS[0], 2, 0.25, 390),
                       (0, 0, schema.DEVICE_METRICS[0], 1, 0.125, 210)],
        "seg_clock": [(0, 0, 500, 7, 3), (0, 0, 500, 5, 3)],
        "seg_events": [(0, 0, "save", 150, 1), (0, 0, "eval", 150, 1)],
    }
    for table, values in rows.items():
        shuffled = list(values)
        order.shuffle(shuffled)
        con.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(shuffled[0]))})", shuffled)
    duckdb_sql.finish_model(con)
    model_fetch.fill_compute(con, [3], model_fetch.model_vocab(con))
    r = model_fetch.session_records(con, [0])[0]
    return (list(r.step_seq), list(r.step_number), list(r.sync_t), list(r.sync_step), r.sync_how,
            r.span_category, list(r.span_step), r.device, r.clock, r.events)


def test_the_run_model_is_fetched_in_one_order_whatever_the_rows_order() -> None:
    """Executions of older files (no seq) numbered by entry, sync points and spans that tie on
    time, a device metric measured twice for a re-done step, clock samples and events at one
    instant: the same columns whatever order the rows were inserted in; the device value is the
    one recorded last."""
    first = _records(random.Random(0))
    assert first[0:2] == ([0, 1, 2], [1, 2, 2])
    assert first[7] == {schema.DEVICE_METRICS[0]: {1: 0.125, 2: 0.25}}
    for seed in range(1, 12):
        assert _records(random.Random(seed)) == first
