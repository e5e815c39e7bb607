"""Subcommands of the ``goodtrace`` CLI, one module each (see ``goodtrace.cli``)."""
