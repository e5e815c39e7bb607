"""What the reader fetches comes in one order whatever order DuckDB holds the rows in: records
that tie on their time (two metrics logged at one instant, two span names first started at the
same nanosecond, two events) are ordered by their other fields, so a report does not depend on
how the files were batched, cached or split between workers."""

from __future__ import annotations

import random

import duckdb

from goodtrace.read import model_fetch

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
    model_fetch.create_detail_tables(con)
    for table, rows in _DETAIL.items():
        shuffled = list(rows)
        order.shuffle(shuffled)
        marks = ", ".join("?" * len(shuffled[0]))
        con.executemany(f"INSERT INTO {table} VALUES ({marks})", shuffled)
    tl = model_fetch.load_timelines(con, [0])[0]
    names = tl.names
    return (tl.span_names, [names[c] for c in tl.span_name], list(tl.span_step), list(tl.span_ns),
            [names[c] for c in tl.tag_name], list(tl.tag_step), [names[c] for c in tl.metric_name],
            list(tl.metric_value), tl.flops, [(e.name, e.t, e.step, e.attrs) for e in tl.events])


def test_the_reference_detail_is_fetched_in_one_order_whatever_the_rows_order() -> None:
    first = _timeline(random.Random(0))
    assert first[0] == ("fwd", "z", "bwd")  # first started at 40 (fwd and z: a tie, by name), then 60
    assert first[1:4] == (["fwd", "z", "bwd", "bwd", "fwd"], [1, 1, 1, 2, 2], [20, 15, 30, 7, 8])
    for seed in range(1, 12):
        assert _timeline(random.Random(seed)) == first
