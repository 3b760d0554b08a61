"""Ray side of the init job: bridge encoding and the weights stage as Ray Data actor pools, or in
the driver where a pool would buy nothing but its start-up (``cluster.in_driver``: one CPU worker on
one machine, or a small input)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import ray

from sembridge_ray.data.schema import ID
from sembridge_ray.distributed import cluster
from sembridge_ray.distributed.udfs import (
    BridgeEncodeUDF,
    InitRowsUDF,
    actor_pool_args,
    actor_threads,
    arrow_blocks,
    rows_block,
)
from sembridge_ray.embed_init.bridge import VECTOR
from sembridge_ray.embed_init.combine import NewRows
from sembridge_ray.embed_init.pipeline import RowsContext, Stages, rows_from_tables
from sembridge_ray.jobs.init import InitConfig, InitResult
from sembridge_ray.jobs.init_run import initialise
from sembridge_ray.progress import Progress

log = logging.getLogger(__name__)


def ray_stages(cfg: InitConfig) -> Stages:
    """Both heavy stages as actor pools sized by ``cfg.resources`` (one GPU per actor when present),
    or in this process where :func:`cluster.in_driver` says so (the bridge model then loaded once
    for both vocabularies). Ray is joined on first use, so bad input fails before any cluster
    starts."""
    bridge: dict[str, Any] = {
        "name": cfg.bridge_model,
        "batch_size": cfg.bridge_batch_size,
        "trust_remote_code": cfg.trust_remote_code,
        "threads": cfg.resources.threads_per_worker,
        "precision": cfg.precision,
    }
    # the bridge model in this process: loaded once, for both vocabularies
    loaded: list[BridgeEncodeUDF] = []

    def encode_here(block: pa.Table) -> pa.Table:
        if not loaded:
            loaded.append(BridgeEncodeUDF(**bridge, device="cpu"))
        return loaded[0](block)

    def encode(table: pa.Table) -> np.ndarray:
        return _encode(cfg, bridge, encode_here, table)

    def rows(ctx: RowsContext, target_ids: np.ndarray, new_vecs: np.ndarray) -> NewRows:
        return _rows(cfg, ctx, target_ids, new_vecs)

    return Stages(encode=encode, rows=rows)


def _encode(
    cfg: InitConfig,
    bridge: dict[str, Any],
    encode_here: Callable[[pa.Table], pa.Table],
    table: pa.Table,
) -> np.ndarray:
    """The bridge vectors of ``table``'s strings, in its row order: in this process
    (``encode_here``) or by an actor pool of ``BridgeEncodeUDF(**bridge)``."""
    plan = cluster.placement(cfg.resources)
    # One block per encoder batch, cut at the same positions as in-process: a string's vector then
    # does not depend on which other strings shared its (length-sorted, padded) batch.
    size = cfg.bridge_batch_size
    blocks = [table.slice(i, size) for i in range(0, table.num_rows, size)]
    progress = Progress(log, "bridge encoding", table.num_rows, "strings")
    if cluster.in_driver(plan, table.num_rows):
        with actor_threads(plan, cfg.resources.threads_per_worker):
            result = pa.concat_tables(count(map(encode_here, blocks), progress))
    else:
        out = ray.data.from_arrow(blocks).map_batches(
            BridgeEncodeUDF,
            fn_constructor_kwargs=bridge,
            batch_format="pyarrow",
            **actor_pool_args(plan, None),  # one block per call: blocks are cut by position above
        )
        result = pa.concat_tables(collect(out, progress))
    return _vectors_in_order(result, table)


def _vectors_in_order(result: pa.Table, table: pa.Table) -> np.ndarray:
    """The vectors of ``result`` (encoded blocks in any order) in the row order of ``table``, as
    float32."""
    order = {int(i): n for n, i in enumerate(result.column(ID).to_numpy())}
    rows = [order[int(i)] for i in table.column(ID).to_numpy()]  # actor pools do not keep row order
    return np.stack(result.column(VECTOR).to_numpy(zero_copy_only=False)[rows]).astype(np.float32)


def _rows(
    cfg: InitConfig, ctx: RowsContext, target_ids: np.ndarray, new_vecs: np.ndarray
) -> NewRows:
    """The weights stage: the new rows of ``target_ids`` (bridge vectors ``new_vecs``), in this
    process or by an actor pool of ``InitRowsUDF``."""
    plan = cluster.placement(cfg.resources)
    table = pa.table(
        {
            ID: pa.array(target_ids.astype(np.int64)),
            VECTOR: pa.array(list(new_vecs), pa.list_(pa.float32())),
        }
    )
    # One block per batch of rows, cut by position: a row's cosines come from the same GEMM shapes
    # whatever the cluster, so the weights are the same bit for bit on one node or many.
    size = cfg.rows_batch_size
    blocks = [table.slice(i, size) for i in range(0, max(1, table.num_rows), size)]
    progress = Progress(log, "weights", table.num_rows, "rows")
    if cluster.in_driver(plan, table.num_rows):
        with actor_threads(plan, cfg.resources.threads_per_worker):
            tables = list(count((rows_block(ctx, block, "cpu") for block in blocks), progress))
        return rows_from_tables(tables, len(ctx.inputs))
    # source bridge matrix + E_s: in the object store once, shared by every actor
    ctx_ref = ray.put(ctx)
    out = ray.data.from_arrow(blocks).map_batches(
        InitRowsUDF,
        fn_constructor_kwargs={"context": [ctx_ref], "threads": cfg.resources.threads_per_worker},
        batch_format="pyarrow",
        **actor_pool_args(plan, None),  # one block per call: blocks are cut by position above
    )
    tables = collect(out, progress)
    return rows_from_tables(tables, len(ctx.inputs))


def count(tables: Iterator[pa.Table], progress: Progress) -> Iterator[pa.Table]:
    """``tables`` computed here, one at a time, counted in ``progress`` as they come; finished at
    the end."""
    for table in tables:
        progress.add(table.num_rows)
        yield table
    progress.finish()


def collect(ds: ray.data.Dataset, progress: Progress) -> list[pa.Table]:
    """Every output block of ``ds`` as it finishes (in any order), counted in ``progress`` (a line
    at least every ``EVERY_S`` seconds, also while the actors start)."""
    tables = []
    with progress.watch():
        for table in arrow_blocks(ds):
            tables.append(table)
            progress.add(table.num_rows)
    progress.finish()
    return tables


def run_init(
    cfg: InitConfig, inputs: dict[str, str] | None = None, *, neutral_symbols: bool = True
) -> InitResult:
    """One initialisation through Ray (inputs checked in the driver first; a finished output is
    skipped). ``neutral_symbols``: see :func:`~sembridge_ray.jobs.init_run.initialise` (an ablation,
    no config key)."""
    cluster.require_reachable()
    cfg = replace(cfg, precision=cluster.resolve_precision(cfg.precision, cfg.resources))
    return initialise(cfg, ray_stages(cfg), inputs, neutral_symbols=neutral_symbols)
