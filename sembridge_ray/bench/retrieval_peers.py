"""Exact top-k against PISA and Seismic on two corpora (one process, one thread, interleaved repeats).

Corpora: ``synthetic`` (:mod:`sembridge_ray.bench.synthetic`: Zipf terms, uniform weights, adversarial for pruning)
and ``encoder`` (:mod:`sembridge_ray.bench.corpus`: resampled from the bundled MiniLM SPLADE's statistics, real
queries). Sides: the project's term-major scan (:func:`~sembridge_ray.retrieval.index.shard_topk`) and its MaxScore
(:func:`~sembridge_ray.retrieval.index.maxscore_topk`); Seismic's exact scan (``SeismicDataset.batch_search``) and
its approximate index (``SeismicIndex``, recall@10 against the exact answer printed); PISA when a Python binding
can be imported (none is on PyPI for this platform: the line says so).
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from sembridge_ray.retrieval.index import SparseBatch, build_shard, maxscore_topk, shard_topk

Search = Callable[[], list[list[int]]]


def make_corpus(name: str, docs: int, queries: int, seed: int = 0) -> tuple[SparseBatch, SparseBatch]:
    if name == "encoder":
        from sembridge_ray.bench.corpus import encoder_corpus

        return encoder_corpus(docs, queries, seed)
    from sembridge_ray.bench.synthetic import BenchConfig, sparse_vectors, zipf_probs

    cfg = BenchConfig()
    rng = np.random.default_rng(seed)
    probs = zipf_probs(cfg.vocab_size, cfg.zipf_exponent, rng)
    return sparse_vectors(docs, cfg.doc_draws, probs, rng), sparse_vectors(queries, cfg.query_draws, probs, rng)


def project_sides(docs: SparseBatch, queries: SparseBatch, k: int) -> dict[str, Search]:
    shard = build_shard(docs, np.arange(docs.rows, dtype=np.int64), 30522)

    def run(fn: Callable[..., Any]) -> Search:
        return lambda: [[int(r) for r in row if r >= 0] for row in fn(shard, queries, k).ranks]

    return {"project_scan": run(shard_topk), "project_maxscore": run(maxscore_topk)}


def seismic_sides(docs: SparseBatch, queries: SparseBatch, k: int) -> dict[str, Search]:
    import seismic

    data = seismic.SeismicDataset()
    data.add_documents_by_id(
        [str(i) for i in range(docs.rows)],
        docs.indices.astype(np.int64),
        docs.values.astype(np.float32),
        docs.indptr.astype(np.int64),
    )
    qids = np.array([str(i) for i in range(queries.rows)], dtype=seismic.get_seismic_string())
    comps = [
        np.array([str(t) for t in queries.slice(i, i + 1).indices], dtype=seismic.get_seismic_string())
        for i in range(queries.rows)
    ]
    vals = [queries.slice(i, i + 1).values.astype(np.float32) for i in range(queries.rows)]
    index = seismic.SeismicIndex.build_from_dataset(data, num_threads=1)

    def ids(results: list[list[tuple[str, float, str]]]) -> list[list[int]]:
        by_query = {int(row[0][0]): [int(doc) for _, _, doc in row] for row in results if row}  # rows come unordered
        return [by_query.get(i, []) for i in range(queries.rows)]

    return {
        "seismic_exact": lambda: ids(data.batch_search(qids, comps, vals, k=k, num_threads=1)),
        "seismic_approx": lambda: ids(
            index.batch_search(qids, comps, vals, k=k, query_cut=20, heap_factor=0.7, num_threads=1)
        ),
    }


def recall(got: list[list[int]], exact: list[list[int]]) -> float:
    return float(np.mean([len(set(g) & set(e)) / max(1, len(e)) for g, e in zip(got, exact, strict=True)]))


def compare_corpus(name: str, docs: int, queries: int, k: int = 10, repeats: int = 2) -> list[dict[str, Any]]:
    """One JSON-able line per peer on corpus ``name``: queries/s of both sides, ratio, recall@k of approximate ones."""
    d, q = make_corpus(name, docs, queries)
    sides = project_sides(d, q, k)
    notes = {}
    if importlib.util.find_spec("seismic") is not None:
        sides |= seismic_sides(d, q, k)
    else:
        notes["seismic"] = "skipped: pyseismic-lsr is not installed (pip install 'sembridge-ray[bench]')"
    notes["pisa"] = "skipped: no importable PISA Python binding (pip has none for this platform)"
    times: dict[str, list[float]] = {s: [] for s in sides}
    answers: dict[str, list[list[int]]] = {}
    for _ in range(repeats):  # alternate, so load elsewhere hits every side alike
        for side, search in sides.items():
            start = time.perf_counter()
            answers[side] = search()
            times[side].append(time.perf_counter() - start)
    qps = {s: queries / statistics.median(t) for s, t in times.items()}
    exact = answers["project_scan"]
    best = max(("project_scan", "project_maxscore"), key=lambda s: qps[s])
    lines = [
        {
            "comparison": f"retrieval_{name}_{side}",
            "corpus": name,
            "docs": docs,
            "queries": queries,
            "project": {"side": best, "queries_per_s": round(qps[best], 2)},
            "peer": {
                "side": side,
                "queries_per_s": round(qps[side], 2),
                f"recall@{k}": round(recall(answers[side], exact), 4),
            },
            "throughput_ratio": round(qps[best] / qps[side], 3),
            "identical_to_scan": answers[side] == exact,
        }
        for side in sides
        if side != best
    ]
    return lines + [{"comparison": f"retrieval_{name}_{peer}", "note": note} for peer, note in notes.items()]
