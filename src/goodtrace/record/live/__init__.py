"""While the job runs: live aggregation across ranks (``aggregator``, with the all-gather in
``transport``, the metric names in ``names`` and the time a rollback takes back in ``rewinds``),
the console line (``line``) and the sinks
that receive the lines and the run's summary (``sinks``)."""
