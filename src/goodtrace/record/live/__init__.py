"""While the job runs: live aggregation across ranks (``aggregator``, with the all-gather in
``transport`` and the metric names in ``names``), the console line (``line``) and the sinks
that receive the lines and the run's summary (``sinks``)."""
