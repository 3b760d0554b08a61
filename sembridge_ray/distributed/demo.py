"""Ray side of the demo: fixtures -> Ray Data actor pool -> sparse Parquet -> summary."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import ray

from sembridge_ray.config import write_config
from sembridge_ray.demo import DemoConfig, sick_sentences, summarise
from sembridge_ray.distributed import cluster
from sembridge_ray.distributed.udfs import SparseEncodeUDF, actor_pool_args
from sembridge_ray.outputs import atomic_path, atomic_write_json, is_complete, start_output, write_success
from sembridge_ray.testing import build_fixture

log = logging.getLogger(__name__)


def run_demo(cfg: DemoConfig) -> dict[str, Any]:
    out = Path(cfg.output)
    if is_complete(out):
        log.info("%s is complete; skipping (delete its _SUCCESS to redo)", out)
        return json.loads((out / "summary.json").read_text())
    start_output(out)
    write_config(cfg, out / "config.yaml")
    model = cfg.model or str(build_fixture("bert-mlm", out / "fixtures"))
    plan = cluster.placement(cfg.resources)
    start = time.perf_counter()
    ds = ray.data.from_arrow(sick_sentences(cfg.limit)).repartition(max(2, plan.workers))
    encoded = ds.map_batches(SparseEncodeUDF, fn_constructor_kwargs={"model_dir": model, "max_length": cfg.max_length},
                             batch_format="numpy", **actor_pool_args(plan, cfg.batch_size))
    with atomic_path(out / "encoded") as tmp:
        encoded.write_parquet(str(tmp))
    table = pq.read_table(out / "encoded")
    summary = {**summarise(table), "workers": plan.workers, "seconds": round(time.perf_counter() - start, 2),
               "model": model}
    atomic_write_json(out / "summary.json", summary)
    write_success(out, exclude=("fixtures",))
    return summary
