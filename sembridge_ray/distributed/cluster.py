"""Connecting to Ray: ``RAY_ADDRESS`` when set (a ``ray job submit`` driver or a user's cluster), else a
local in-process cluster bound to loopback and sized to this machine."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import ray

from sembridge_ray.placement import Placement, ResourceConfig, plan_placement

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterInfo:
    cpus: float
    gpus: float
    address: str


def connect(num_cpus: int | None = None) -> ClusterInfo:
    """Join the cluster at ``RAY_ADDRESS``, or start a local one on 127.0.0.1 (no dashboard)."""
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, log_to_driver=True)
        else:
            # A fresh local cluster, never an unrelated `ray start` head found in /tmp/ray; it binds to
            # loopback (see sembridge_ray/distributed/__init__.py).
            ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), include_dashboard=False)
    res = ray.cluster_resources()
    info = ClusterInfo(cpus=res.get("CPU", 0.0), gpus=res.get("GPU", 0.0),
                       address=ray.get_runtime_context().gcs_address)
    log.info("Ray cluster at %s: %g CPUs, %g GPUs", info.address, info.cpus, info.gpus)
    return info


def placement(res: ResourceConfig, reserve: bool = True) -> Placement:
    """Plan workers against the connected cluster (connecting first when needed)."""
    info = connect()
    plan = plan_placement(res, info.cpus, info.gpus, reserve=reserve)
    if plan.workers < res.workers or (res.gpus_per_worker and not plan.use_gpu):
        log.warning("asked for %d workers (gpus/worker %s); the cluster fits %s", res.workers, res.gpus_per_worker, plan)
    return plan
