"""Only the optional C extension lives here; all metadata is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        # optional: a machine without a C compiler still installs, with the pure-Python spans
        Extension("goodtrace.record._speedups", ["src/goodtrace/record/_speedups.c"], optional=True),
    ]
)
