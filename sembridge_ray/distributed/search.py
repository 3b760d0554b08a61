"""Exact sparse search on Ray: one actor per term-major shard; the driver merges the shards' top-k lists.

Each shard is put in the object store once and read zero-copy by its actor, which keeps the reference (so the
shard stays pinned while the actor lives). Query batches are put once and sent to every shard; up to ``window``
batches are in flight, so the actors keep working while the driver merges earlier batches.
"""

from __future__ import annotations

import logging
import resource
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import ray

from sembridge_ray.retrieval.index import Shard, SparseBatch, TopK, merge_topk, shard_topk

log = logging.getLogger(__name__)


@ray.remote
class ShardActor:
    """Holds one shard (zero-copy from the object store) and answers top-k queries against it."""

    def __init__(self, refs: list[ray.ObjectRef], threads: int = 1) -> None:
        import torch

        torch.set_num_threads(max(1, threads))  # topk only; the actor's CPU share is what Ray gave it
        self._ref = refs[0]
        self.shard: Shard = ray.get(self._ref)

    def topk(self, queries: SparseBatch, k: int) -> TopK:
        return shard_topk(self.shard, queries, k)

    def stats(self) -> dict[str, Any]:
        """Documents, shard size, and this process's memory: peak resident, and now private (anon) vs shared
        (the shard's object-store pages), from /proc where the OS has it."""
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {"docs": self.shard.n_docs, "shard_mb": self.shard.nbytes / 2**20, "peak_rss_mb": peak_kib / 1024,
                **_proc_memory()}


def _proc_memory() -> dict[str, float]:
    fields = {"RssAnon:": "private_mb", "RssShmem:": "shared_mb"}
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return {}
    return {fields[p[0]]: int(p[1]) / 1024 for p in (line.split() for line in lines) if p and p[0] in fields}


class ShardedIndex:
    """A corpus split into shards held by Ray actors; :meth:`search` is an exact top-k over all of them."""

    def __init__(self, actors: list[Any], n_docs: int) -> None:
        self.actors = actors
        self.n_docs = n_docs

    @classmethod
    def start(cls, shards: Iterable[Shard], num_cpus: float = 1.0) -> ShardedIndex:
        """Put each shard in the object store (the caller may drop it at once) and start its actor."""
        actors, n_docs = [], 0
        for shard in shards:
            n_docs += shard.n_docs
            actor = ShardActor.options(num_cpus=num_cpus)  # type: ignore[attr-defined]
            actors.append(actor.remote([ray.put(shard)], max(1, int(num_cpus))))
        index = cls(actors, n_docs)
        index.stats()  # wait until every actor holds its shard
        return index

    def search(self, queries: SparseBatch, k: int, batch_size: int = 32, window: int = 4) -> TopK:
        """queries (Q, V) -> the exact top-k over every shard: scores (Q, k), global ranks (Q, k)."""
        pending: deque[list[ray.ObjectRef]] = deque()
        merged: list[TopK] = []
        for start in range(0, queries.rows, batch_size):
            batch = ray.put(queries.slice(start, min(start + batch_size, queries.rows)))
            pending.append([actor.topk.remote(batch, k) for actor in self.actors])
            if len(pending) >= window:
                merged.append(merge_topk(ray.get(pending.popleft()), k))
        merged.extend(merge_topk(ray.get(refs), k) for refs in pending)
        if not merged:
            return TopK(np.zeros((0, k), np.float32), np.zeros((0, k), np.int64))
        return TopK(np.concatenate([m.scores for m in merged]), np.concatenate([m.ranks for m in merged]))

    def stats(self) -> list[dict[str, Any]]:
        return ray.get([actor.stats.remote() for actor in self.actors])

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
