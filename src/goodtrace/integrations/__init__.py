"""Framework integrations (``goodtrace.integrations.torch``, ``goodtrace.integrations.jax``).

Each is imported only by a program that uses that framework; ``import goodtrace`` never loads
them.
"""
