"""Shared test setup: ``helpers`` (record builders, the headless browser) importable from every
layer's test folder. Tests are grouped by the package layer they exercise: ``record/``,
``read/``, ``analysis/``, ``renderers/``, ``integrations/``, ``cli/`` (and ``test_layers.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from helpers.storage_servers import EmulatedNFS, S3Server, fuse_unavailable, s3_unavailable


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A local S3 server (moto) for the tests of one module; skipped where it cannot start."""
    reason = s3_unavailable()
    if reason:
        pytest.skip(reason)
    with S3Server(str(tmp_path_factory.mktemp("s3"))) as server:
        yield server


@pytest.fixture(scope="module")
def nfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedNFS]:
    """The emulated NFS (FUSE, 0.5 ms per operation) for one module; skipped where FUSE is not
    permitted."""
    reason = fuse_unavailable()
    if reason:
        pytest.skip(reason)
    with EmulatedNFS(str(tmp_path_factory.mktemp("nfs")), rtt_ms=0.5) as server:
        yield server
