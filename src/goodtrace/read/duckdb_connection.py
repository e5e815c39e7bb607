"""DuckDB connections of the analytical reader: how one is opened (in memory or in a database
file, its spill directory and memory limits), how its memory is handed back once the run model
is extracted and after each block of sessions is fetched, and the few statements every reader
module runs (many rows in one insert, a quoted string, a list of statements). The SQL of the
run model is :mod:`goodtrace.read.duckdb_sql`'s."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any


def insert_rows(con: Any, table: str, rows: Sequence[Sequence[Any]]) -> None:
    """Insert many rows in one statement (``executemany`` runs one statement per row)."""
    if not rows:
        return
    columns = list(zip(*rows, strict=True))
    select = ", ".join(f"unnest(${i + 1}) AS c{i}" for i in range(len(columns)))
    con.execute(f"INSERT INTO {table} SELECT {select}", [list(c) for c in columns])


def sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def execute_all(con: Any, statements: Iterable[str]) -> None:
    """Run each statement (``CREATE TABLE`` lists)."""
    for statement in statements:
        con.execute(statement)


# DuckDB's memory while it parses and reduces the records (it spills beyond it to the load's
# temporary directory), and once the run model is extracted.
FOLD_MEMORY = "256MB"
FETCH_MEMORY = "64MB"


def connect(tmpdir: str, *, in_memory: bool = False) -> Any:
    """A connection whose database lives in ``tmpdir`` (``in_memory``: only what exceeds the
    memory limit goes there: a worker's, whose tables are small and never checkpointed, and
    the analytical reader's where its run model is small: ``load.IN_MEMORY_BYTES``)."""
    import duckdb

    con = duckdb.connect(":memory:" if in_memory else os.path.join(tmpdir, "run.duckdb"))
    con.execute(f"SET temp_directory={sql_str(os.path.join(tmpdir, 'spill'))}")
    con.execute(f"SET memory_limit='{FOLD_MEMORY}'")
    con.execute("SET preserve_insertion_order=false")
    # DuckDB draws a progress bar on stdout (even when it is a pipe or a file) for a query of
    # more than 2 s: it would land in report --json's output, or in a pool worker's results
    con.execute("SET enable_progress_bar=false")
    return con


def is_in_memory(con: Any) -> bool:
    """Whether ``con``'s database is in memory (no database file)."""
    return con.execute("SELECT path IS NULL FROM duckdb_databases() WHERE database_name = current_database()"
                       ).fetchone()[0] is True


def settle(con: Any) -> None:
    """After the extraction: the run model's tables written to the database file (in memory:
    what exceeds the new limit goes to the spill directory) and DuckDB's memory cut to what
    fetching a block of sessions needs, so that its buffers do not sit beside the analysis."""
    if not is_in_memory(con):
        con.execute("CHECKPOINT")
    con.execute(f"SET memory_limit='{FETCH_MEMORY}'")
    # its allocator hands freed memory back after each statement, not past 128 MB only
    con.execute("SET allocator_flush_threshold='8MB'")
    con.execute("SET allocator_bulk_deallocation_flush_threshold='8MB'")


def release_buffers(con: Any) -> None:
    """After a block of sessions is fetched: DuckDB's cached pages of the run model (the next
    block reads others) and its allocator's free memory go back to the system, so that they do
    not sit beside the analysis's cut of the block. (In memory, the pages are the model itself:
    they stay, within the fetch's memory; evicting them would write them to the spill.)"""
    import duckdb

    if is_in_memory(con):
        return
    try:
        con.execute("SET memory_limit='1MB'")  # evicts every unpinned page
    except duckdb.Error:
        pass
    con.execute(f"SET memory_limit='{FETCH_MEMORY}'")
