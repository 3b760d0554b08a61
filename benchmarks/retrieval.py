"""The retrieval benchmark: sharded exact search on Ray vs the same exact search in one process.

Both sides run the same kernel (:func:`~sembridge_ray.retrieval.index.shard_topk`) on the same
synthetic data with the same query batches; the baseline holds the whole corpus as one term-major
CSR. A plain scipy CSR brute force, ``(Q @ D.T).toarray()`` + the same top-k, is timed on a subset
of queries (``speedup_vs_scipy``)."""

from __future__ import annotations

import functools
import logging
import resource
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp

from benchmarks.synthetic import BenchConfig, sparse_vectors, zipf_probs
from sembridge_ray.distributed import cluster
from sembridge_ray.distributed.executor import RayExecutor
from sembridge_ray.retrieval.index import (
    SparseBatch,
    TopK,
    build_shard,
    shard_bounds,
    shard_topk,
    topk_rows,
)
from sembridge_ray.retrieval.metrics import sparsity_stats, term_counts
from sembridge_ray.retrieval.sharded import ShardedIndex

log = logging.getLogger(__name__)


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _batched(search: Callable[[SparseBatch], TopK], queries: SparseBatch, size: int) -> TopK:
    parts = [
        search(queries.slice(s, min(s + size, queries.rows))) for s in range(0, queries.rows, size)
    ]
    return TopK(np.concatenate([p.scores for p in parts]), np.concatenate([p.ranks for p in parts]))


def _scipy_product(
    docs: SparseBatch, ranks: np.ndarray, vocab: int, k: int
) -> Callable[[SparseBatch], TopK]:
    doc_t = sp.csr_matrix(
        (docs.values, docs.indices, docs.indptr), shape=(docs.rows, vocab)
    ).T.tocsr()

    def search(q: SparseBatch) -> TopK:
        scores = (
            sp.csr_matrix((q.values, q.indices, q.indptr), shape=(q.rows, vocab)) @ doc_t
        ).toarray()
        return topk_rows(scores, ranks, k)

    return search


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Generate the data, time both sides ``cfg.repeats`` times, alternating, and report the best of
    each."""
    rng = np.random.default_rng(cfg.seed)
    probs = zipf_probs(cfg.vocab_size, cfg.zipf_exponent, rng)
    (docs, queries), gen_s = _timed(
        lambda: (
            sparse_vectors(cfg.docs, cfg.doc_draws, probs, rng),
            sparse_vectors(cfg.queries, cfg.query_draws, probs, rng),
        )
    )
    ranks, vocab = np.arange(cfg.docs, dtype=np.int64), cfg.vocab_size  # ids sort as their numbers
    report: dict[str, Any] = {
        "docs": cfg.docs,
        "queries": cfg.queries,
        "top_k": cfg.top_k,
        "workers": cfg.workers,
        "generate_s": round(gen_s, 1),
    }
    report |= sparsity_stats(
        term_counts(queries.indices, vocab), cfg.queries, term_counts(docs.indices, vocab), cfg.docs
    )
    log.info("data: %s", report)
    full = build_shard(docs, ranks, vocab)
    cluster.connect()
    index, build_s = _timed(
        lambda: ShardedIndex.start(
            RayExecutor(),
            (
                build_shard(docs.slice(a, b), ranks[a:b], vocab)
                for a, b in shard_bounds(cfg.docs, 0, cfg.workers)
            ),
            size=cfg.docs,
        )
    )
    sides = {
        "single_process": lambda q: shard_topk(full, q, cfg.top_k),
        "ray": lambda q: index.search(q, cfg.top_k, cfg.query_batch_size),
    }
    times: dict[str, list[float]] = {name: [] for name in sides}
    tops: dict[str, TopK] = {}
    for warm_up in sides.values():
        warm_up(queries.slice(0, 1))
    for _ in range(cfg.repeats):  # alternate, so a burst of load elsewhere hits both sides alike
        for name, search in sides.items():
            size = cfg.query_batch_size if name == "single_process" else cfg.queries
            tops[name], seconds = _timed(functools.partial(_batched, search, queries, size))
            times[name].append(seconds)
            log.info("%s: %.1f queries/s", name, cfg.queries / seconds)
    actors = index.stats()
    index.shutdown()
    best = {name: min(t) for name, t in times.items()}
    identical = all(
        np.array_equal(getattr(tops["ray"], f), getattr(tops["single_process"], f))
        for f in TopK._fields
    )
    report |= {
        "single_process_qps": round(cfg.queries / best["single_process"], 2),
        "ray_qps": round(cfg.queries / best["ray"], 2),
        "speedup": round(best["single_process"] / best["ray"], 3),
        "identical_top_k": identical,
        "runs_s": {name: [round(t, 2) for t in ts] for name, ts in times.items()},
        "ray_index_build_s": round(build_s, 1),
        "actors": [{key: round(v, 1) for key, v in a.items()} for a in actors],
    }
    report |= _scipy_reference(docs, ranks, queries, tops["single_process"], cfg)
    if "scipy_product_qps" in report:  # the baseline: single-process scipy CSR brute force
        report["speedup_vs_scipy"] = round(report["ray_qps"] / report["scipy_product_qps"], 3)
    return report | {
        "driver_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    }


def _scipy_reference(
    docs: SparseBatch, ranks: np.ndarray, queries: SparseBatch, expected: TopK, cfg: BenchConfig
) -> dict[str, Any]:
    """Queries/s of a plain ``(Q @ D.T).toarray()`` + the same top-k, on the first
    ``cfg.scipy_queries``."""
    if cfg.scipy_queries <= 0:
        return {}
    subset = queries.slice(0, min(cfg.scipy_queries, cfg.queries))
    search = _scipy_product(docs, ranks, cfg.vocab_size, cfg.top_k)
    plain, seconds = _timed(lambda: _batched(search, subset, cfg.query_batch_size))
    return {
        "scipy_product_qps": round(subset.rows / seconds, 2),
        "scipy_product_identical": bool(np.array_equal(plain.ranks, expected.ranks[: subset.rows])),
    }
