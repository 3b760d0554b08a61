"""Ray side of the MaLSTM job: the driver prepares the data once, every restart (seed) trains as its own Ray task,
and the driver reports the best one by validation MSE."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import ray

from sembridge_ray.config import write_config
from sembridge_ray.distributed import cluster
from sembridge_ray.outputs import is_complete, start_output, write_success
from sembridge_ray.siamese.config import MalstmConfig
from sembridge_ray.siamese.loop import RestartResult, train_restart
from sembridge_ray.siamese.prepare import Prepared, prepare
from sembridge_ray.siamese.results import write_results

log = logging.getLogger(__name__)


def _train_task(data: Prepared, cfg: dict[str, Any], seed: int, threads: int) -> RestartResult:
    """A Ray task: one restart on ``threads`` CPU threads (the LSTM is small; one thread per task is fastest)."""
    import torch

    torch.set_num_threads(threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return train_restart(data, MalstmConfig.from_dict(cfg), seed)


def run_restarts(data: Prepared, cfg: MalstmConfig) -> list[RestartResult]:
    """``cfg.seeds`` restarts as Ray tasks, at most ``resources.workers`` at once, in seed order."""
    plan = cluster.placement(cfg.resources, reserve=False)
    task = ray.remote(_train_task).options(num_cpus=plan.cpus_per_worker, num_gpus=0)
    data_ref = ray.put(data)
    threads = max(1, int(plan.cpus_per_worker))
    pending: list[ray.ObjectRef] = []
    done: dict[ray.ObjectRef, RestartResult] = {}
    for seed in range(cfg.seed, cfg.seed + cfg.seeds):
        if len(pending) >= plan.workers:
            ready, pending = ray.wait(pending, num_returns=1)
            done.update({ref: ray.get(ref) for ref in ready})
        pending.append(task.remote(data_ref, cfg.to_dict(), seed, threads))
    done.update({ref: ray.get(ref) for ref in pending})
    return sorted(done.values(), key=lambda r: r.seed)


def run_malstm(cfg: MalstmConfig) -> dict[str, Any]:
    out = Path(cfg.output)
    if is_complete(out):
        log.info("%s is complete; skipping (delete its _SUCCESS to redo)", out)
        return json.loads((out / "report.json").read_text(encoding="utf-8"))
    start = time.perf_counter()
    data = prepare(cfg)  # bad input fails here, before the output directory is touched
    prepared = time.perf_counter()
    start_output(out)
    write_config(cfg, out / "config.yaml")
    results = run_restarts(data, cfg)
    trained = time.perf_counter()
    seconds = {"prepare": round(prepared - start, 1), "train": round(trained - prepared, 1)}
    report = write_results(out, cfg, data, results, seconds, start)
    write_success(out, best_seed=report["best_seed"], seconds=report["seconds"])
    return report
