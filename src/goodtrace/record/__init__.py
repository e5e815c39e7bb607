"""The recording layer: everything that runs inside the training job.

Standard library only, and it imports nothing of goodtrace outside itself and ``schema``:
spans and the recorder (``spans``, ``recorder``, ``sync_points``, the optional C fast path
``_speedups``), device values (``values/``: adapters, the readiness thread; torch and JAX
adapters imported only when the program hands goodtrace such a value), the way to files
(``io/``: encoding, writer threads, storage), what runs beside the loop (``live/``: live
aggregation, the console line, sinks), process identity (``process``), configuration
(``config``), clock offset measurement (``clocksync``) and the threads it starts, which leave
the program's signals to the program (``threads``). Nothing here blocks the training
loop or raises into it.
"""
