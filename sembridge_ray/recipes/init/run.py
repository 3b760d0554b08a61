"""The init job on Ray: :func:`~sembridge_ray.recipes.init.initialise.initialise` with the stages as pools of
the Ray executor (Ray Data actor pools, or this process where a pool would buy nothing but its
start-up: ``cluster.in_driver``)."""

from __future__ import annotations

from dataclasses import replace

from sembridge_ray.embed_init.pipeline import pool_stages
from sembridge_ray.recipes.init.config import InitConfig, InitResult
from sembridge_ray.recipes.init.initialise import initialise
from sembridge_ray.runtime.executor import Executor


def run_init(
    cfg: InitConfig,
    inputs: dict[str, str] | None = None,
    *,
    executor: Executor,
    neutral_symbols: bool = True,
) -> InitResult:
    """One initialisation on ``executor`` (inputs checked in the driver first; a finished output is
    skipped). ``neutral_symbols``: see :func:`~sembridge_ray.recipes.init.initialise.initialise` (an ablation,
    no config key)."""
    executor.start()
    cfg = replace(cfg, precision=executor.precision(cfg.precision, cfg.resources))
    bridge = {
        "name": cfg.bridge_model,
        "batch_size": cfg.bridge_batch_size,
        "trust_remote_code": cfg.trust_remote_code,
        "threads": cfg.resources.threads_per_worker,
        "precision": cfg.precision,
    }
    stages = pool_stages(
        executor, cfg.resources, bridge, cfg.bridge_batch_size, cfg.rows_batch_size
    )
    return initialise(cfg, stages, inputs, neutral_symbols=neutral_symbols)
