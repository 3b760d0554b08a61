"""Exact sparse search over term-major shards, each held by a worker of an executor
(:meth:`sembridge_ray.runtime.executor.Executor.hold`: a Ray actor, or this process for a small
corpus); the shards' top-k lists are merged here.

Query batches are sent once to every shard; up to ``window`` batches are in flight, so the workers
keep working while earlier batches are merged. Answers are exact and deterministic, so where the
shards are held changes nothing, and a search disturbed by a worker's death (the executor starts it
again) returns exactly what an undisturbed one does."""

from __future__ import annotations

import os
import resource
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import cast

from sembridge_ray.retrieval.index import (
    Shard,
    SparseBatch,
    TopK,
    concat_topk,
    merge_topk,
    shard_topk,
)
from sembridge_ray.runtime.executor import Asked, Executor, Held
from sembridge_ray.runtime.progress import Progress


class ShardHolder:
    """One shard, as its worker holds it: top-k queries against it, and what it costs."""

    def __init__(self, shard: Shard) -> None:
        self.shard = shard

    def topk(self, queries: SparseBatch, k: int) -> TopK:
        return shard_topk(self.shard, queries, k)

    def pid(self) -> int:
        return os.getpid()

    def stats(self) -> dict[str, object]:
        """Documents, shard size, and the memory of the process holding it: peak resident, and now
        private (anon) vs shared (an actor's shard is in object-store pages), from /proc where the
        OS has it."""
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        fields = {"RssAnon:": "private_mb", "RssShmem:": "shared_mb"}
        try:
            lines = Path("/proc/self/status").read_text().splitlines()
        except OSError:
            lines = []
        return {
            "docs": self.shard.n_docs,
            "shard_mb": self.shard.nbytes / 2**20,
            "peak_rss_mb": peak_kib / 1024,
            **{
                fields[p[0]]: int(p[1]) / 1024
                for p in map(str.split, lines)
                if p and p[0] in fields
            },
        }


class ShardedIndex:
    """A corpus split into shards, each held by a worker; :meth:`search` is an exact top-k over all
    of them."""

    def __init__(self, held: Held) -> None:
        self.held = held

    @classmethod
    def start(
        cls, executor: Executor, shards: Iterable[Shard], size: int, cpus: float = 1.0
    ) -> ShardedIndex:
        """Hand each shard to a worker of ``executor`` with ``cpus`` CPUs (``size`` documents in
        all; a shard may be built as it is taken, and dropped then), and return once every worker
        holds its shard."""
        return cls(executor.hold(ShardHolder, shards, size, cpus))

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
        pending: deque[Asked] = deque()
        merged: list[TopK] = []

        def merge(asked: Asked) -> None:
            merged.append(merge_topk(cast(list[TopK], self.held.answers(asked)), k))
            if progress is not None:
                progress.add(len(merged[-1].scores))

        for start in range(0, queries.rows, batch_size):
            batch = queries.slice(start, min(start + batch_size, queries.rows))
            pending.append(self.held.ask("topk", batch, k))
            if len(pending) >= window:
                merge(pending.popleft())
        while pending:
            merge(pending.popleft())
        return concat_topk(merged, k)

    def stats(self) -> list[dict[str, object]]:
        return cast(list[dict[str, object]], self.held.answers(self.held.ask("stats")))

    def pids(self) -> list[int]:
        """Each shard worker's process id (fault-injection tests kill them)."""
        return cast(list[int], self.held.answers(self.held.ask("pid")))

    def shutdown(self) -> None:
        self.held.shutdown()
