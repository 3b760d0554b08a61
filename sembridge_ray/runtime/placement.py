"""How many Ray workers to start, with which resources: plain arithmetic, testable without Ray."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from sembridge_ray.runtime.config import Config, require

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, kw_only=True)
class ResourceConfig(Config):
    """Resources a job asks Ray for."""

    workers: int = 2
    """Actors (Ray Data pools) or training workers (Ray Train)."""
    gpus_per_worker: float | None = None
    """GPUs per worker; None = 1 when the cluster has GPUs, else 0 (CPU)."""
    cpus_per_worker: float = 1.0
    """CPUs Ray reserves for each worker."""
    reserve_cpus: int = 1
    """CPUs never given to actors, so Ray Data's read/write tasks can run (an all-CPU actor pool
    deadlocks)."""
    threads_per_worker: int = 0
    """Torch threads in each Ray Data actor; 0 = its CPU share (Ray sets OMP_NUM_THREADS to it). On
    a CPU-only machine whose pool is smaller than its cores (one actor on 2 CPUs), the cores the
    reservation leaves idle can compute too."""

    def check(self) -> None:
        require(self.workers >= 1, "workers", self.workers, "must be >= 1")
        require(self.cpus_per_worker > 0, "cpus_per_worker", self.cpus_per_worker, "must be > 0")
        gpus = self.gpus_per_worker
        require(
            gpus is None or gpus >= 0,
            "gpus_per_worker",
            gpus,
            "must be >= 0 (or null: 1 when there are GPUs)",
        )
        for key in ("reserve_cpus", "threads_per_worker"):
            require(getattr(self, key) >= 0, key, getattr(self, key), "must be >= 0")


@dataclass(frozen=True, kw_only=True)
class Placement:
    workers: int
    cpus_per_worker: float
    gpus_per_worker: float

    @property
    def use_gpu(self) -> bool:
        return self.gpus_per_worker > 0


def plan_placement(
    res: ResourceConfig, cluster_cpus: float, cluster_gpus: float, reserve: bool = True
) -> Placement:
    """Fit ``res`` into a cluster; GPUs when present (unless 0 is asked), CPU otherwise, never zero
    workers.

    ``reserve`` holds ``res.reserve_cpus`` back (Ray Data pools need it; Ray Train needs none).
    """
    gpus = res.gpus_per_worker
    if gpus is None:
        gpus = 1.0 if cluster_gpus >= 1 else 0.0
    if gpus > cluster_gpus:
        gpus = 0.0  # asked for GPUs the cluster does not have: fall back to CPU rather than hang
    if gpus > 0:
        fit = math.floor(cluster_gpus / gpus + 1e-9)
    else:
        spare = cluster_cpus - (res.reserve_cpus if reserve else 0)
        fit = math.floor(spare / res.cpus_per_worker + 1e-9)  # cpus_per_worker > 0: check()
    return Placement(
        workers=max(1, min(res.workers, fit)),
        cpus_per_worker=res.cpus_per_worker,
        gpus_per_worker=gpus,
    )


def pick_device() -> str:
    """``TORCH_DEVICE`` when set (tests rerun on a lent GPU with it), else cuda when available, else
    cpu."""
    import os

    import torch

    return os.environ.get("TORCH_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")


Precision = Literal["auto", "fp32", "bf16"]


def local_precision(setting: Precision, use_gpu: bool) -> Precision:
    """``auto`` resolved for workers on this machine: bf16 when they use its CUDA GPUs and those
    support bf16, else fp32; fp32 and bf16 stay as asked. Never a CPU feature: a CPU's result must
    not depend on AVX512-BF16 or AMX."""
    if setting != "auto":
        return setting
    import torch

    bf16 = use_gpu and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return "bf16" if bf16 else "fp32"


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` (a ``torch.device``) computes bf16 natively: CUDA with bf16, or a CPU with
    AVX512-BF16 or AMX (elsewhere bf16 is emulated and slower than fp32)."""
    import torch

    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    return device.type == "cpu" and bool(
        torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    )
