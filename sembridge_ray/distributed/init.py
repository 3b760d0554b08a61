"""Ray side of the init job: bridge encoding and the weights stage as Ray Data actor pools."""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import pyarrow as pa
import ray

from sembridge_ray.data.schema import ID
from sembridge_ray.distributed import cluster
from sembridge_ray.distributed.init_job import initialise
from sembridge_ray.distributed.udfs import BridgeEncodeUDF, InitRowsUDF, actor_pool_args, arrow_blocks
from sembridge_ray.embed_init.bridge import VECTOR
from sembridge_ray.embed_init.combine import NewRows
from sembridge_ray.embed_init.pipeline import RowsContext, Stages, rows_from_tables
from sembridge_ray.jobs.init import InitConfig, InitResult
from sembridge_ray.progress import Progress

log = logging.getLogger(__name__)


def ray_stages(cfg: InitConfig) -> Stages:
    """Both heavy stages as actor pools sized by ``cfg.resources`` (one GPU per actor when present). Ray is
    joined on first use, so bad input fails before any cluster starts."""

    def encode(table: pa.Table) -> np.ndarray:
        plan = cluster.placement(cfg.resources)
        # One block per encoder batch, cut at the same positions as in-process: a string's vector then does not
        # depend on which other strings shared its (length-sorted, padded) batch.
        size = cfg.bridge_batch_size
        ds = ray.data.from_arrow([table.slice(i, size) for i in range(0, table.num_rows, size)])
        out = ds.map_batches(
            BridgeEncodeUDF,
            fn_constructor_kwargs={
                "name": cfg.bridge_model,
                "batch_size": size,
                "trust_remote_code": cfg.trust_remote_code,
                "threads": cfg.resources.threads_per_worker,
                "precision": cfg.precision,
            },
            batch_format="pyarrow",
            **actor_pool_args(plan, None),  # one block per call: blocks are cut by position above
        )
        result = pa.concat_tables(collect(out, Progress(log, "bridge encoding", table.num_rows, "strings")))
        order = {int(i): n for n, i in enumerate(result.column(ID).to_numpy())}
        rows = [order[int(i)] for i in table.column(ID).to_numpy()]  # actor pools do not keep row order
        return np.stack(result.column(VECTOR).to_numpy(zero_copy_only=False)[rows]).astype(np.float32)

    def rows(ctx: RowsContext, target_ids: np.ndarray, new_vecs: np.ndarray) -> NewRows:
        plan = cluster.placement(cfg.resources)
        ctx_ref = ray.put(ctx)  # source bridge matrix + E_s: in the object store once, shared by every actor
        table = pa.table(
            {ID: pa.array(target_ids.astype(np.int64)), VECTOR: pa.array(list(new_vecs), pa.list_(pa.float32()))}
        )
        # One block per batch of rows, cut by position: a row's cosines come from the same GEMM shapes whatever
        # the cluster, so the weights are the same bit for bit on one node or many.
        size = cfg.rows_batch_size
        ds = ray.data.from_arrow([table.slice(i, size) for i in range(0, max(1, table.num_rows), size)])
        out = ds.map_batches(
            InitRowsUDF,
            fn_constructor_kwargs={"context": [ctx_ref], "threads": cfg.resources.threads_per_worker},
            batch_format="pyarrow",
            **actor_pool_args(plan, None),  # one block per call: blocks are cut by position above
        )
        tables = collect(out, Progress(log, "weights", table.num_rows, "rows"))
        return rows_from_tables(tables, len(ctx.inputs))

    return Stages(encode=encode, rows=rows)


def collect(ds: ray.data.Dataset, progress: Progress) -> list[pa.Table]:
    """Every output block of ``ds`` as it finishes (in any order), counted in ``progress``."""
    tables = []
    for table in arrow_blocks(ds):
        tables.append(table)
        progress.add(table.num_rows)
    progress.finish()
    return tables


def run_init(cfg: InitConfig, inputs: dict[str, str] | None = None, *, neutral_symbols: bool = True) -> InitResult:
    """One initialisation through Ray (inputs checked in the driver first; a finished output is skipped).
    ``neutral_symbols``: see :func:`~sembridge_ray.distributed.init_job.initialise` (an ablation, no config key)."""
    cluster.require_reachable()
    cfg = replace(cfg, precision=cluster.resolve_precision(cfg.precision, cfg.resources))
    return initialise(cfg, ray_stages(cfg), inputs, neutral_symbols=neutral_symbols)
