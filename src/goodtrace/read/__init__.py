"""The reading layer: a run directory's files -> records, sessions and loaded runs.

Runs after (or beside) the job, never inside it. ``segments`` finds segment files and decodes
their lines one at a time; ``sessions`` groups them into sessions and attempts (standard
library only); ``load`` is the analytical reader (DuckDB, imported when a run is loaded), with
``discovery`` (headers, sessions), ``duckdb_sql`` (the SQL), ``compact`` (the Parquet copy) and
``mirror`` (runs on object storage); ``loaded`` holds the dataclasses it returns.
"""
