"""The retrieval benchmark: sharded exact search on Ray vs the same exact search in one process.

Both sides run the same kernel (:func:`~sembridge_ray.retrieval.index.shard_topk`) on the same synthetic data with
the same query batches; the baseline holds the whole corpus as one term-major CSR. A plain scipy sparse product,
``(Q @ D.T).toarray()`` + the same top-k, is timed on a subset of queries for reference.
"""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp

from sembridge_ray.distributed import cluster
from sembridge_ray.distributed.search import ShardedIndex
from sembridge_ray.retrieval.index import SparseBatch, TopK, build_shard, shard_bounds, shard_topk, topk_rows
from sembridge_ray.retrieval.metrics import sparsity_stats, term_counts
from sembridge_ray.retrieval.synthetic import BenchConfig, sparse_vectors, zipf_probs

log = logging.getLogger(__name__)


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _batched(search: Callable[[SparseBatch], TopK], queries: SparseBatch, size: int) -> TopK:
    parts = [search(queries.slice(s, min(s + size, queries.rows))) for s in range(0, queries.rows, size)]
    return TopK(np.concatenate([p.scores for p in parts]), np.concatenate([p.ranks for p in parts]))


def _scipy_product(docs: SparseBatch, ranks: np.ndarray, vocab: int, k: int) -> Callable[[SparseBatch], TopK]:
    doc_t = sp.csr_matrix((docs.values, docs.indices, docs.indptr), shape=(docs.rows, vocab)).T.tocsr()

    def search(q: SparseBatch) -> TopK:
        scores = (sp.csr_matrix((q.values, q.indices, q.indptr), shape=(q.rows, vocab)) @ doc_t).toarray()
        return topk_rows(scores, ranks, k)

    return search


def _single_process(docs: SparseBatch, ranks: np.ndarray, vocab: int, queries: SparseBatch, cfg: BenchConfig
                    ) -> tuple[TopK, float]:
    """The baseline: the whole corpus as one term-major CSR in this process, the same batches and kernel."""
    full = build_shard(docs, ranks, vocab)
    shard_topk(full, queries.slice(0, 1), cfg.top_k)  # warm-up
    return _timed(lambda: _batched(lambda q: shard_topk(full, q, cfg.top_k), queries, cfg.query_batch_size))


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    rng = np.random.default_rng(cfg.seed)
    probs = zipf_probs(cfg.vocab_size, cfg.zipf_exponent, rng)
    (docs, queries), gen_s = _timed(lambda: (sparse_vectors(cfg.docs, cfg.doc_draws, probs, rng),
                                             sparse_vectors(cfg.queries, cfg.query_draws, probs, rng)))
    ranks, vocab, k, size = np.arange(cfg.docs, dtype=np.int64), cfg.vocab_size, cfg.top_k, cfg.query_batch_size
    report: dict[str, Any] = {"docs": cfg.docs, "queries": cfg.queries, "top_k": k, "workers": cfg.workers,
                              "generate_s": round(gen_s, 1)}
    report |= sparsity_stats(term_counts(queries.indices, vocab), cfg.queries, term_counts(docs.indices, vocab),
                             cfg.docs)
    log.info("data: %s", report)

    base, base_s = _single_process(docs, ranks, vocab, queries, cfg)
    log.info("single process: %.1f queries/s", cfg.queries / base_s)
    if cfg.scipy_queries > 0:
        subset = queries.slice(0, min(cfg.scipy_queries, cfg.queries))
        plain, plain_s = _timed(lambda: _batched(_scipy_product(docs, ranks, vocab, k), subset, size))
        report["scipy_product_qps"] = round(subset.rows / plain_s, 2)
        report["scipy_product_identical"] = bool(np.array_equal(plain.ranks, base.ranks[: subset.rows]))

    cluster.connect()
    bounds = shard_bounds(cfg.docs, 0, cfg.workers)
    index, build_s = _timed(lambda: ShardedIndex.start(
        build_shard(docs.slice(a, b), ranks[a:b], vocab) for a, b in bounds))
    index.search(queries.slice(0, 1), k)  # warm-up
    sharded, ray_s = _timed(lambda: index.search(queries, k, size))
    actors = index.stats()
    index.shutdown()
    identical = bool(np.array_equal(sharded.ranks, base.ranks) and np.array_equal(sharded.scores, base.scores))
    return report | {
        "single_process_qps": round(cfg.queries / base_s, 2), "ray_qps": round(cfg.queries / ray_s, 2),
        "speedup": round(base_s / ray_s, 3), "identical_top_k": identical, "ray_index_build_s": round(build_s, 1),
        "actors": [{key: round(v, 1) for key, v in a.items()} for a in actors],
        "driver_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
