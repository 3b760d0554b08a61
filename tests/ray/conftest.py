"""One local 2-CPU Ray cluster per test module (loopback only), shut down when the module ends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

# sets the loopback environment before Ray is imported
from sembridge_ray.distributed import cluster


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[cluster.ClusterInfo]:
    info = cluster.connect(num_cpus=2)
    yield info
    cluster.shutdown()
