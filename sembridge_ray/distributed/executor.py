"""The Ray executor (:class:`sembridge_ray.runtime.executor.Executor` on a Ray cluster): pools are
Ray Data actor pools, tasks are Ray tasks, held objects are Ray actors. Inputs a pool is not worth
starting for (:func:`cluster.in_driver`) run in this process through a
:class:`~sembridge_ray.runtime.executor.LocalExecutor`, with the workers' thread count, so the
results are the actors' bit for bit.

Held objects and faults: each object is put in the object store once and read zero-copy by its
actor, and the executor keeps its reference, so an actor that dies (OOM, a lost node) is restarted
by Ray (``max_restarts``) and its pending calls are retried (``max_task_retries``); if it cannot be
restarted any more, a new actor is started from the same object and asked again. An answer that is
deterministic is therefore the same as an undisturbed one."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import pyarrow as pa
import ray

from sembridge_ray.distributed import cluster, train_run
from sembridge_ray.runtime.executor import (
    Asked,
    BlockFn,
    Held,
    LocalExecutor,
    Pool,
    Tasks,
    Training,
    is_local,
    num_rows,
    use_threads,
)
from sembridge_ray.runtime.placement import Placement, Precision, ResourceConfig
from sembridge_ray.runtime.progress import Progress

log = logging.getLogger(__name__)
R = TypeVar("R")
T = TypeVar("T")
RESTARTS = 3
"""Restarts of a held object's actor by Ray, then new actors started by :class:`_RayHeld`."""


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

    def __reduce__(self) -> tuple[type[RayExecutor], tuple[()]]:
        # a handle on the cluster: a task it is sent to (a reproduction's cell) gets a fresh one,
        # not the in-process worker this one may hold (a loaded bridge model)
        return (RayExecutor, ())

    def start(self) -> None:
        cluster.require_reachable()

    def gpus(self) -> float:
        return cluster.connect().gpus

    def placement(self, res: ResourceConfig, reserve: bool = True) -> Placement:
        return cluster.placement(res, reserve)

    def planned(self, res: ResourceConfig, reserve: bool = True) -> Placement:
        return cluster.expected_placement(res, reserve)

    def precision(self, setting: Precision, res: ResourceConfig, reserve: bool = True) -> Precision:
        return cluster.resolve_precision(setting, res, reserve)

    def train(self, training: Training) -> contextlib.AbstractContextManager[Path | None]:
        """Ray Train (:func:`train_run.fit`, with its restarts), or this process when the one CPU
        worker would be this driver's (``cluster.driver_is_the_worker``) and the checkpoints are on
        a path: the same body, stream, batches, checkpoints and torch thread count without the 20-25
        s it takes to start a Ray Train worker (measured on 2 CPUs: a 12-step fine-tuning of
        SPLADE-tiny took 33 s with Ray Train, 8 s of it training). In this process a failure is not
        restarted (a rerun resumes)."""
        train_run.storage_note(training.storage)
        if is_local(training.run_dir) and cluster.driver_is_the_worker(training.plan):
            return self.local.train(training)
        return train_run.fit(training)

    def resume_step(self, training: Training) -> int | None:
        return train_run.latest_step(training)

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
        udf: Any = pool.udf
        kwargs: dict[str, Any] = dict(pool.kwargs)
        if pool.shared:
            shared = {k: [ray.put(v)] for k, v in pool.shared.items()}
            udf, kwargs = _WithShared, {"udf": pool.udf, "kwargs": kwargs, "shared": shared}
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

    def hold(
        self, holder: Callable[[T], object], objects: Iterable[T], size: int, cpus: float
    ) -> Held:
        if size <= cluster.IN_DRIVER_ROWS:  # held whole, asked here: starting actors costs more
            return self.local.hold(holder, objects, size, cpus)
        held = _RayHeld(holder, [ray.put(obj) for obj in objects], cpus)
        ray.get([actor.ready.remote() for actor in held.actors])  # every actor holds its object
        return held


@ray.remote(max_restarts=RESTARTS, max_task_retries=RESTARTS)
class _Holder:
    """One actor holding ``holder(obj)``, the object read (zero-copy where it can) from the object
    store, with ``threads`` torch threads."""

    def __init__(
        self, holder: Callable[[Any], object], ref: list[ray.ObjectRef[object]], threads: int
    ) -> None:
        use_threads(threads)
        self.held = holder(ray.get(ref[0]))

    def call(self, method: str, *args: object) -> object:
        return getattr(self.held, method)(*args)

    def ready(self) -> bool:
        return True


class _RayHeld:
    """A :class:`~sembridge_ray.runtime.executor.Held` of Ray actors (see the module's docstring)."""

    def __init__(
        self, holder: Callable[[Any], object], refs: list[ray.ObjectRef[object]], cpus: float
    ) -> None:
        self.holder, self.cpus = holder, cpus
        self.refs = refs  # kept: a restarted actor reads its object again
        self.actors = [self._actor(ref) for ref in refs]

    def _actor(self, ref: ray.ObjectRef[object]) -> ray.actor.ActorHandle[_Holder]:
        threads = max(1, int(self.cpus))  # the actor's CPU share
        return _Holder.options(num_cpus=self.cpus).remote(self.holder, [ref], threads)  # type: ignore[attr-defined,no-any-return]

    def ask(self, method: str, *args: object) -> Asked:
        sent = [ray.put(arg) for arg in args]  # once, whatever the number of actors
        return method, sent, [actor.call.remote(method, *sent) for actor in self.actors]

    def answers(self, asked: Asked) -> list[object]:
        method, sent, refs = cast(tuple[str, list[Any], list[Any]], asked)
        out: list[object] = []
        for i, ref in enumerate(refs):
            for attempt in range(RESTARTS + 1):
                try:
                    out.append(ray.get(ref))
                    break
                except ray.exceptions.RayActorError as err:
                    if attempt == RESTARTS:
                        raise
                    log.warning(
                        "held object %d: its actor died for good (%s); starting a new one",
                        i,
                        type(err).__name__,
                    )
                    self.actors[i] = self._actor(self.refs[i])
                    ref = self.actors[i].call.remote(method, *sent)
        return out

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors, self.refs = [], []
