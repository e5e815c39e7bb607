"""One Ray cluster for the read tests that use one (test_ray_engine.py, test_ray_remote.py):
started at the first that asks, stopped after the last test of this folder. Its workers get the
environment of a local S3 server started with it (``ray_s3``), as a cluster's nodes have their
own credentials for the store a run lives on."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from helpers.storage_servers import S3Server, s3_server


@pytest.fixture(scope="package")
def ray_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    yield from s3_server(tmp_path_factory, "ray-s3")


@pytest.fixture(scope="package")
def ray_cluster(ray_s3: S3Server) -> Iterator[str]:
    """A local Ray cluster of 2 CPUs, started in this process; its address."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": ray_s3.env})
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
