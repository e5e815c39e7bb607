"""Device values: the adapter registry (``adapters``), the adapter protocol (``protocol``), the
torch and JAX adapters (``torch_values``, ``jax_values``, and ``jax_compile``, JAX's compile
listeners; imported only when the program hands goodtrace such a value), and the readiness
thread that dates pending completions (``readiness``)."""
