"""The recording layer: everything that runs inside the training job.

Standard library only, and it imports nothing of goodtrace outside itself and ``schema``:
spans and the recorder (``spans``, ``recorder``, the optional C fast path ``_speedups``), value
adapters (``values``; ``torch_values`` / ``jax_values`` / ``jax_compile`` are imported only when
the program hands goodtrace a torch tensor or a JAX value), the writer threads and storage
(``writer``, ``storage``), process identity (``process``), configuration (``config``), clock
offset measurement (``clocksync``) and live aggregation (``live``, ``liveline``). Nothing here
blocks the training loop or raises into it.
"""
