"""Shared test setup: ``helpers`` (record builders, the headless browser) importable from every
layer's test folder. Tests are grouped by the package layer they exercise: ``record/``,
``read/``, ``analysis/``, ``renderers/``, ``integrations/``, ``cli/`` (and ``test_layers.py``)."""
