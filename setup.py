"""Only the optional C extension lives here; all metadata is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        # optional: a machine without a C compiler still installs, with the pure-Python spans
        Extension("goodtrace.record._speedups", ["src/goodtrace/record/_speedups.c"], optional=True),
        # optional too: the writer thread that never takes the GIL (io/writer.py is the fallback)
        Extension(
            "goodtrace.record.io._native",
            ["src/goodtrace/record/io/_native.c", "src/goodtrace/record/io/native_writer.c"],
            depends=["src/goodtrace/record/io/native_writer.h"],
            extra_compile_args=["-std=gnu11", "-pthread"],
            extra_link_args=["-pthread"],
            optional=True,
        ),
    ]
)
