"""Sharded exact top-k equals a plain brute force, ties and zero scores included."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import scipy.sparse as sp

from sembridge_ray.retrieval import index
from sembridge_ray.retrieval.index import (
    PAD,
    SparseBatch,
    build_shard,
    concat_topk,
    merge_topk,
    rank_ids,
    score_batch,
    shard_bounds,
    shard_topk,
)
from sembridge_ray.runtime.errors import InputError


def batch(dense: np.ndarray) -> SparseBatch:
    csr = sp.csr_matrix(dense.astype(np.float32))
    return SparseBatch(csr.indptr.astype(np.int64), csr.indices.astype(np.int32), csr.data)


def reference_topk(scores: np.ndarray, ids: list[str], k: int) -> list[list[tuple[float, str]]]:
    """The plainest definition: sort every positive-score document by (score desc, id asc), keep
    k."""
    out = []
    for row in scores:
        ranked = sorted(((-float(s), d) for s, d in zip(row, ids, strict=True) if s > 0))
        out.append([(-s, d) for s, d in ranked[:k]])
    return out


def search(
    dense_docs: np.ndarray, dense_q: np.ndarray, ids: list[str], k: int, shard_size: int
) -> list[list[tuple[float, str]]]:
    ranks, sorted_ids = rank_ids(pa.array(ids))
    docs = batch(dense_docs)
    parts = []
    for start, stop in shard_bounds(len(ids), shard_size, workers=1):
        shard = build_shard(docs.slice(start, stop), ranks[start:stop], dense_docs.shape[1])
        parts.append(shard_topk(shard, batch(dense_q), k))
    top = merge_topk(parts, k)
    names = sorted_ids.to_pylist()
    return [
        [(float(s), names[r]) for s, r in zip(srow, rrow, strict=True) if r != PAD]
        for srow, rrow in zip(top.scores, top.ranks, strict=True)
    ]


def random_sparse(rng: np.random.Generator, rows: int, vocab: int, density: float) -> np.ndarray:
    # weights on a 0.5 grid: float32 sums are exact, so ties are real ties whatever the summation
    # order
    values = rng.integers(1, 7, size=(rows, vocab)) / 2
    return np.where(rng.random((rows, vocab)) < density, values, 0.0)


@pytest.mark.parametrize("shard_size", [1, 3, 7, 40, 0])
@pytest.mark.parametrize("k", [1, 5, 12, 60])
def test_sharded_topk_equals_brute_force_with_ties(shard_size: int, k: int) -> None:
    rng = np.random.default_rng(k * 100 + shard_size)
    docs = random_sparse(rng, 40, 12, 0.25)
    docs[5] = docs[9]  # identical documents: an exact tie broken by id
    docs[13] = 0.0  # an empty document is never returned
    queries = random_sparse(rng, 9, 12, 0.3)
    queries[2] = 0.0  # an empty query retrieves nothing
    ids = [f"d{rng.integers(10**6)}-{i}" for i in range(40)]
    expected = reference_topk(queries @ docs.T, ids, k)
    assert search(docs, queries, ids, k, shard_size) == expected
    assert expected[2] == []


def test_ties_straddling_the_cut_are_resolved_by_id() -> None:
    docs = np.ones((6, 2))  # every document scores the same
    ids = ["f", "b", "e", "a", "d", "c"]
    got = search(docs, np.array([[1.0, 0.0]]), ids, 3, shard_size=2)
    assert got == [[(1.0, "a"), (1.0, "b"), (1.0, "c")]]


def test_scores_equal_scipy_product_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    docs = rng.random((300, 50)) * (rng.random((300, 50)) < 0.2)
    queries = rng.random((7, 50)) * (rng.random((7, 50)) < 0.3)
    shard = build_shard(batch(docs), np.arange(300), 50)
    expected = (
        sp.csr_matrix(queries.astype(np.float32)) @ sp.csr_matrix(docs.astype(np.float32)).T
    ).toarray()
    np.testing.assert_array_equal(score_batch(shard, batch(queries)), expected)


@pytest.mark.parametrize("gather", [1, 8, 40, 1 << 16])
def test_gathered_and_sliced_postings_score_alike(
    gather: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(index, "GATHER", gather)  # small values send long lists down the slice path
    rng = np.random.default_rng(gather)
    docs = rng.random((500, 60)) * (rng.random((500, 60)) < np.linspace(0.01, 0.9, 60))
    queries = rng.random((9, 60)) * (rng.random((9, 60)) < 0.5)
    shard = build_shard(batch(docs), np.arange(500), 60)
    expected = (
        sp.csr_matrix(queries.astype(np.float32)) @ sp.csr_matrix(docs.astype(np.float32)).T
    ).toarray()
    np.testing.assert_array_equal(score_batch(shard, batch(queries)), expected)


def test_query_terms_outside_the_shard_vocabulary_are_ignored() -> None:
    shard = build_shard(batch(np.array([[1.0, 2.0]])), np.array([0]), 2)
    q = SparseBatch(np.array([0, 2]), np.array([1, 5], np.int32), np.array([1.0, 9.0], np.float32))
    assert score_batch(shard, q).tolist() == [[2.0]]


def test_rank_ids_orders_by_code_point_and_rejects_duplicates() -> None:
    ranks, sorted_ids = rank_ids(pa.array(["b", "a#2", "a#10", "B"]))
    assert sorted_ids.to_pylist() == ["B", "a#10", "a#2", "b"]
    assert ranks.tolist() == [3, 2, 1, 0]
    with pytest.raises(InputError, match="'a'"):
        rank_ids(pa.array(["a", "b", "a"]))


def test_shard_bounds_cover_every_document_within_size() -> None:
    assert shard_bounds(10, 4, workers=2) == [(0, 3), (3, 6), (6, 10)]
    assert shard_bounds(10, 0, workers=2) == [(0, 5), (5, 10)]
    assert shard_bounds(1, 0, workers=4) == [(0, 1)]


def test_query_batches_concatenate_to_the_whole_batchs_topk() -> None:
    """Searching the queries batch by batch and concatenating (what both indexes do) gives the
    top-k of searching them at once; no batch at all is an empty (0, k) answer."""
    rng = np.random.default_rng(3)
    docs, queries = random_sparse(rng, 200, 40, 0.2), random_sparse(rng, 7, 40, 0.3)
    shard = build_shard(batch(docs), np.arange(200), 40)
    whole = shard_topk(shard, batch(queries), 5)
    parts = [shard_topk(shard, batch(queries[i : i + 3]), 5) for i in range(0, 7, 3)]
    joined = concat_topk(parts, 5)
    np.testing.assert_array_equal(joined.scores, whole.scores)
    np.testing.assert_array_equal(joined.ranks, whole.ranks)
    empty = concat_topk([], 5)
    assert empty.scores.shape == empty.ranks.shape == (0, 5)


@pytest.mark.parametrize(("batch_size", "window"), [(1, 1), (2, 4), (4, 2), (100, 4)])
def test_the_sharded_index_on_the_in_process_executor_equals_brute_force(
    batch_size: int, window: int
) -> None:
    """What evaluate searches with: shards held by the executor's workers (here this process),
    queries sent in batches with ``window`` of them in flight, merged and joined; ties and an empty
    query as the brute force has them, every query counted into the progress."""
    import logging

    from sembridge_ray.retrieval.sharded import ShardedIndex
    from sembridge_ray.runtime.executor import LocalExecutor
    from sembridge_ray.runtime.progress import Progress

    rng = np.random.default_rng(batch_size * 10 + window)
    docs, queries = random_sparse(rng, 60, 16, 0.25), random_sparse(rng, 9, 16, 0.3)
    docs[7] = docs[31]
    queries[4] = 0.0
    ids = [f"d{i:03d}" for i in range(60)]
    ranks, sorted_ids = rank_ids(pa.array(ids))
    rows = batch(docs)
    shards = (
        build_shard(rows.slice(a, b), ranks[a:b], 16) for a, b in shard_bounds(60, 13, workers=1)
    )
    index = ShardedIndex.start(LocalExecutor(), shards, size=60)
    progress = Progress(logging.getLogger("test"), "search", 9, "queries")
    top = index.search(batch(queries), 5, batch_size=batch_size, window=window, progress=progress)
    names = sorted_ids.to_pylist()
    found = [
        [(float(s), names[r]) for s, r in zip(srow, rrow, strict=True) if r != PAD]
        for srow, rrow in zip(top.scores, top.ranks, strict=True)
    ]
    assert found == reference_topk(queries @ docs.T, ids, 5) and found[4] == []
    assert progress.done == 9
    assert [s["docs"] for s in index.stats()] == [b - a for a, b in shard_bounds(60, 13, workers=1)]
    index.shutdown()
