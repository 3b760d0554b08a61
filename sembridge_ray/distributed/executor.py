"""The Ray executor (:class:`sembridge_ray.runtime.executor.Executor` on a Ray cluster): pools are
Ray Data actor pools, tasks are Ray tasks. Inputs a pool is not worth starting for
(:func:`cluster.in_driver`) run in this process through a
:class:`~sembridge_ray.runtime.executor.LocalExecutor`, with the workers' thread count, so the
results are the actors' bit for bit."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar, cast

import pyarrow as pa
import ray

from sembridge_ray.distributed import cluster
from sembridge_ray.runtime.executor import BlockFn, LocalExecutor, Pool, Tasks, num_rows
from sembridge_ray.runtime.placement import Placement, Precision, ResourceConfig
from sembridge_ray.runtime.progress import Progress

R = TypeVar("R")


class _WithShared:
    """An actor that builds ``udf(**kwargs, **shared)`` with each shared object read from Ray's
    object store (put there once by the driver, one reference in a list so that Ray Data passes the
    reference rather than the object)."""

    def __init__(
        self, udf: Callable[..., BlockFn], kwargs: dict[str, Any], shared: dict[str, list[Any]]
    ) -> None:
        self.fn = udf(**kwargs, **{k: ray.get(ref[0]) for k, ref in shared.items()})

    def __call__(self, batch: pa.Table) -> pa.Table:
        return self.fn(batch)


class RayExecutor:
    """Connects on first use (:mod:`cluster`); see the module's docstring."""

    def __init__(self) -> None:
        self.local = LocalExecutor()

    def start(self) -> None:
        cluster.require_reachable()

    def gpus(self) -> float:
        return cluster.connect().gpus

    def placement(self, res: ResourceConfig, reserve: bool = True) -> Placement:
        return cluster.placement(res, reserve)

    def precision(self, setting: Precision, res: ResourceConfig, reserve: bool = True) -> Precision:
        return cluster.resolve_precision(setting, res, reserve)

    def map_blocks(
        self,
        pool: Pool,
        blocks: Sequence[pa.Table],
        size: int,
        progress: Progress,
        count: Callable[[pa.Table], int] = num_rows,
    ) -> list[pa.Table]:
        if cluster.in_driver(pool.plan, size):
            return self.local.map_blocks(pool, blocks, size, progress, count)
        if pool.shared:
            shared = {k: [ray.put(v)] for k, v in pool.shared.items()}
            udf: Any = _WithShared
            kwargs: dict[str, Any] = {
                "udf": pool.udf,
                "kwargs": dict(pool.kwargs),
                "shared": shared,
            }
        else:
            udf, kwargs = pool.udf, dict(pool.kwargs)
        plan = pool.plan
        ds = ray.data.from_arrow(list(blocks)).map_batches(
            udf,
            fn_constructor_kwargs=kwargs,
            batch_format="pyarrow",
            batch_size=None,  # one whole block per call: the blocks are cut by the caller
            compute=ray.data.ActorPoolStrategy(size=plan.workers),
            num_cpus=plan.cpus_per_worker,
            num_gpus=plan.gpus_per_worker,
        )
        tables = []
        with progress.watch():  # a line at least every EVERY_S seconds, also while actors start
            for block in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
                tables.append(cast(pa.Table, block))
                progress.add(count(tables[-1]))
        progress.finish()
        return tables

    def map_tasks(
        self, fn: Callable[..., R], calls: Iterable[tuple[object, ...]], spec: Tasks
    ) -> Iterator[R]:
        task = ray.remote(fn).options(num_cpus=spec.cpus, num_gpus=0, max_retries=spec.retries)
        shared = [ray.put(arg) for arg in spec.shared]  # once, whatever the number of calls
        pending, running = list(calls), list[ray.ObjectRef[R]]()
        while pending or running:
            while pending and len(running) < spec.width:
                running.append(task.remote(*shared, *pending.pop(0)))
            ready, running = ray.wait(running, num_returns=1)
            yield from ray.get(ready)
