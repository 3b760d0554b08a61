"""Exact sparse search on Ray: one actor per term-major shard; the driver merges the shards' top-k
lists.

Each shard is put in the object store once and read zero-copy by its actor. Query batches are put
once and sent to every shard; up to ``window`` batches are in flight, so the actors keep working
while the driver merges earlier batches.

Faults: the driver keeps every shard's reference, so a shard actor that dies (OOM, a lost node) is
restarted by Ray (``max_restarts``) and its pending calls are retried (``max_task_retries``); if it
cannot be restarted any more, the driver starts a new actor from the same shard and asks again.
Answers are exact and deterministic, so a disturbed search returns exactly what an undisturbed one
does.

A small corpus is searched in the driver instead (:class:`LocalIndex`: the same batches, shard
answers and merge, so the same top-k), where starting the actors would cost more than the search.
"""

from __future__ import annotations

import logging
import os
import resource
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import ray

from sembridge_ray.retrieval.index import (
    Shard,
    SparseBatch,
    TopK,
    concat_topk,
    merge_topk,
    shard_topk,
)
from sembridge_ray.runtime.progress import Progress

log = logging.getLogger(__name__)


RESTARTS = 3


@ray.remote(max_restarts=RESTARTS, max_task_retries=RESTARTS)
class ShardActor:
    """Holds one shard (zero-copy from the object store) and answers top-k queries against it."""

    def __init__(self, refs: list[ray.ObjectRef[Shard]], threads: int = 1) -> None:
        import torch

        # topk only; the actor's CPU share is what Ray gave it
        torch.set_num_threads(max(1, threads))
        self._ref = refs[0]
        self.shard: Shard = ray.get(self._ref)

    def topk(self, queries: SparseBatch, k: int) -> TopK:
        return shard_topk(self.shard, queries, k)

    def pid(self) -> int:
        return os.getpid()

    def stats(self) -> dict[str, object]:
        return shard_stats(self.shard)


def shard_stats(shard: Shard) -> dict[str, object]:
    """Documents, shard size, and the memory of the process holding it: peak resident, and now
    private (anon) vs shared (an actor's shard is in object-store pages), from /proc where the OS
    has it."""
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "docs": shard.n_docs,
        "shard_mb": shard.nbytes / 2**20,
        "peak_rss_mb": peak_kib / 1024,
        **_proc_memory(),
    }


def _proc_memory() -> dict[str, float]:
    fields = {"RssAnon:": "private_mb", "RssShmem:": "shared_mb"}
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return {}
    return {
        fields[p[0]]: int(p[1]) / 1024
        for p in (line.split() for line in lines)
        if p and p[0] in fields
    }


class ShardedIndex:
    """A corpus split into shards held by Ray actors; :meth:`search` is an exact top-k over all of
    them."""

    def __init__(self, refs: list[ray.ObjectRef[Shard]], n_docs: int, num_cpus: float) -> None:
        self.refs = refs  # held for the index's lifetime: a restarted actor reads its shard again
        self.n_docs = n_docs
        self.num_cpus = num_cpus
        self.actors = [self._actor(ref) for ref in refs]

    def _actor(self, ref: ray.ObjectRef[Shard]) -> ray.actor.ActorHandle[ShardActor]:
        return ShardActor.options(num_cpus=self.num_cpus).remote([ref], max(1, int(self.num_cpus)))  # type: ignore[attr-defined,no-any-return]

    @classmethod
    def start(cls, shards: Iterable[Shard], num_cpus: float = 1.0) -> ShardedIndex:
        """Put each shard in the object store (the caller may drop it at once) and start its
        actor."""
        refs, n_docs = [], 0
        for shard in shards:
            n_docs += shard.n_docs
            refs.append(ray.put(shard))
        index = cls(refs, n_docs, num_cpus)
        index.stats()  # wait until every actor holds its shard
        return index

    def _ask(self, shard: int, method: str, *args: object) -> ray.ObjectRef[object]:
        return getattr(self.actors[shard], method).remote(*args)  # type: ignore[no-any-return]

    def _get(self, refs: list[ray.ObjectRef[object]], method: str, *args: object) -> list[Any]:
        """Every shard's answer; a shard whose actor is gone for good gets a new actor and is asked
        again."""
        out: list[Any] = []
        for shard, ref in enumerate(refs):
            for attempt in range(RESTARTS + 1):
                try:
                    out.append(ray.get(ref))
                    break
                except ray.exceptions.RayActorError as err:
                    if attempt == RESTARTS:
                        raise
                    log.warning(
                        "shard %d: its actor died for good (%s); starting a new one",
                        shard,
                        type(err).__name__,
                    )
                    self.actors[shard] = self._actor(self.refs[shard])
                    ref = self._ask(shard, method, *args)
        return out

    def search(
        self,
        queries: SparseBatch,
        k: int,
        batch_size: int = 32,
        window: int = 4,
        progress: Progress | None = None,
    ) -> TopK:
        """queries (Q, V) -> the exact top-k over every shard: scores (Q, k), global ranks (Q, k);
        ``progress`` counts the queries answered."""
        pending: deque[tuple[ray.ObjectRef[SparseBatch], list[ray.ObjectRef[object]]]] = deque()
        merged: list[TopK] = []
        for start in range(0, queries.rows, batch_size):
            batch = ray.put(queries.slice(start, min(start + batch_size, queries.rows)))
            pending.append(
                (batch, [self._ask(i, "topk", batch, k) for i in range(len(self.actors))])
            )
            if len(pending) >= window:
                batch, refs = pending.popleft()
                merged.append(merge_topk(self._get(refs, "topk", batch, k), k))
                if progress is not None:
                    progress.add(len(merged[-1].scores))
        for batch, refs in pending:
            merged.append(merge_topk(self._get(refs, "topk", batch, k), k))
            if progress is not None:
                progress.add(len(merged[-1].scores))
        return concat_topk(merged, k)

    def stats(self) -> list[dict[str, object]]:
        return self._get([self._ask(i, "stats") for i in range(len(self.actors))], "stats")

    def pids(self) -> list[int]:
        """Each shard actor's process id (fault-injection tests kill them)."""
        return self._get([self._ask(i, "pid") for i in range(len(self.actors))], "pid")

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors, self.refs = [], []


class LocalIndex:
    """The shards held and searched in this process, batch by batch as :meth:`ShardedIndex.search`
    asks its actors and merged alike, so the top-k is the same; the interface of
    :class:`ShardedIndex`."""

    def __init__(self, shards: list[Shard]) -> None:
        self.shards = shards
        self.n_docs = sum(shard.n_docs for shard in shards)

    @classmethod
    def start(cls, shards: Iterable[Shard]) -> LocalIndex:
        return cls(list(shards))

    def search(
        self,
        queries: SparseBatch,
        k: int,
        batch_size: int = 32,
        window: int = 4,
        progress: Progress | None = None,
    ) -> TopK:
        """As :meth:`ShardedIndex.search` (``window`` is unused: nothing is in flight)."""
        merged: list[TopK] = []
        for start in range(0, queries.rows, batch_size):
            batch = queries.slice(start, min(start + batch_size, queries.rows))
            merged.append(merge_topk([shard_topk(shard, batch, k) for shard in self.shards], k))
            if progress is not None:
                progress.add(len(merged[-1].scores))
        return concat_topk(merged, k)

    def stats(self) -> list[dict[str, object]]:
        return [shard_stats(shard) for shard in self.shards]

    def shutdown(self) -> None:
        self.shards = []
