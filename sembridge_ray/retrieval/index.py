"""Exact top-k over sparse (SPLADE) vectors, one shard at a time, and the merge of the shards'
lists.

A shard holds n documents *term-major*: the CSR of its (n, V) document matrix transposed, i.e. an
inverted index whose row v lists the documents with term v active and their weights. A query batch
is scored against it with Gustavson's row-by-row sparse × sparse product into a dense (B, n)
accumulator, so the work is Σ_q Σ_{v ∈ q} df(v) multiply-adds: the posting lists the queries touch,
never the whole shard.

Order is total and deterministic: score descending, then document id ascending. Ids enter as
``ranks``: the position of each document's id in the sorted list of all ids (:func:`rank_ids`), so
ties compare integers, and the merge of per-shard lists equals the top-k of the whole corpus. A
document with score 0 (no shared term) is never returned; rows are padded with score 0 and rank -1
(:data:`PAD`). Scores are bit-identical whatever the sharding (:func:`accumulate`)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import scipy.sparse as sp
import torch

from sembridge_ray.runtime.errors import InputError

PAD = -1


class TopK(NamedTuple):
    """Per query, the k best documents: ``scores`` (B, k) float32 descending, ``ranks`` (B, k) int64
    (-1 = pad)."""

    scores: np.ndarray
    ranks: np.ndarray


class SparseBatch(NamedTuple):
    """B sparse vectors in CSR form: ``indptr`` (B + 1,), ``indices`` (nnz,) int32 and ``values``
    (nnz,) float32."""

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray

    @property
    def rows(self) -> int:
        return len(self.indptr) - 1

    def slice(self, start: int, stop: int) -> SparseBatch:
        lo, hi = int(self.indptr[start]), int(self.indptr[stop])
        return SparseBatch(
            self.indptr[start : stop + 1] - lo, self.indices[lo:hi], self.values[lo:hi]
        )


@dataclass(frozen=True, kw_only=True)
class Shard:
    """n documents term-major: postings of term v are ``docs[indptr[v]:indptr[v+1]]`` with
    ``weights``.

    ``indptr`` (V + 1,) int64, ``docs`` (nnz,) int32 local document numbers (ascending within a
    term), ``weights`` (nnz,) float32, ``ranks`` (n,) int64 the global tie-break key of each local
    document."""

    indptr: np.ndarray
    docs: np.ndarray
    weights: np.ndarray
    ranks: np.ndarray

    @property
    def n_docs(self) -> int:
        return len(self.ranks)

    @property
    def vocab_size(self) -> int:
        return len(self.indptr) - 1

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.indptr, self.docs, self.weights, self.ranks))


def build_shard(docs: SparseBatch, ranks: np.ndarray, vocab_size: int) -> Shard:
    """Document-major rows (n, V) -> a term-major :class:`Shard` (the transpose, as an inverted
    index)."""
    if docs.rows != len(ranks):
        raise ValueError(f"{docs.rows} documents but {len(ranks)} ranks")
    # int32 offsets where they fit: scipy would otherwise widen every index of the shard to int64
    indptr = (
        docs.indptr.astype(np.int32) if docs.indptr[-1] < np.iinfo(np.int32).max else docs.indptr
    )
    csc = sp.csr_matrix((docs.values, docs.indices, indptr), shape=(docs.rows, vocab_size)).tocsc()
    csc.sort_indices()  # documents ascending within each posting list, as :class:`Shard` says
    return Shard(
        indptr=csc.indptr.astype(np.int64),
        docs=csc.indices.astype(np.int32, copy=False),
        weights=csc.data.astype(np.float32, copy=False),
        ranks=np.ascontiguousarray(ranks, dtype=np.int64),
    )


def score_batch(shard: Shard, queries: SparseBatch) -> np.ndarray:
    """queries (B, V) sparse × shard (V, n) -> scores (B, n) float32, exactly: the reference path."""
    scores = np.zeros((queries.rows, shard.n_docs), dtype=np.float32)
    for row, (terms, values) in enumerate(_query_terms(shard, queries)):
        accumulate(scores[row], shard, terms, values)
    return scores


GATHER = 1 << 16
"""Postings gathered into one scatter-add: short lists are batched, so the Python loop stays short
even for dense queries; a list longer than a quarter of this is scattered straight from its slice
(no gather copy)."""


def accumulate(acc: np.ndarray, shard: Shard, terms: np.ndarray, values: np.ndarray) -> None:
    """acc (n,) += one query (``terms``, ``values`` from :func:`_query_terms`) × shard (V, n), term
    by term in ascending term order, grouped as :data:`GATHER` says. ``np.add.at`` adds in the given
    order, so every score sums its products in the query's term order whichever shard holds the
    document, and whatever the grouping."""
    starts, stops = shard.indptr[terms], shard.indptr[terms + 1]
    lengths = stops - starts
    long = lengths > GATHER // 4
    cuts = np.flatnonzero(np.diff(np.cumsum(lengths) // GATHER)) + 1
    cuts = np.union1d(cuts, np.concatenate([np.flatnonzero(long), np.flatnonzero(long) + 1]))
    docs, weights = _canonical(shard.docs), _canonical(shard.weights)
    for lo, hi in itertools.pairwise([0, *cuts.tolist(), len(terms)]):
        if hi - lo == 1:
            np.add.at(
                acc, docs[starts[lo] : stops[lo]], weights[starts[lo] : stops[lo]] * values[lo]
            )
        elif hi > lo:
            size = lengths[lo:hi]
            pos = np.repeat(starts[lo:hi] - (np.cumsum(size) - size), size) + np.arange(size.sum())
            np.add.at(acc, docs[pos], weights[pos] * np.repeat(values[lo:hi], size))


def _query_terms(shard: Shard, queries: SparseBatch) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Each query's (terms, values), less the terms outside the shard's vocabulary (they score
    nothing)."""
    for row in range(queries.rows):
        query = queries.slice(row, row + 1)
        terms, values = _canonical(query.indices), _canonical(query.values)
        inside = terms < shard.vocab_size
        yield terms[inside], values[inside]


def _canonical(array: np.ndarray) -> np.ndarray:
    """A zero-copy view with numpy's own dtype object. Unpickled arrays (Ray's object store) carry
    fresh dtype instances (numpy#6422), and with those ``np.add.at`` leaves its fast indexed loop:
    ~30x slower, measured."""
    return array.view(array.dtype.type)


def row_topk(scores: np.ndarray, ranks: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """scores (n,), ranks (n,) -> the min(k, n) best (scores, ranks), unordered; ties at the cut go
    to low ranks.

    ``torch.topk`` finds k + 1 candidates in O(n). Only when the k-th and (k+1)-th values tie (and
    are > 0) is the row redone over every document with at least that score, so the cut is decided
    by rank, not by chance."""
    width = min(k + 1, len(scores))
    values, where = (t.numpy() for t in torch.topk(torch.from_numpy(scores), width))
    if width > k and values[k - 1] == values[k] > 0:
        cand = np.flatnonzero(scores >= values[k - 1])
        where = cand[np.lexsort((ranks[cand], -scores[cand]))]
        values = scores[where]
    keep = min(k, len(scores))
    return values[:keep], ranks[where[:keep]]


def topk_rows(scores: np.ndarray, ranks: np.ndarray, k: int) -> TopK:
    """scores (B, n), ranks (n,) -> the k best per row by (score desc, rank asc), positive scores
    only."""
    rows = [row_topk(row, ranks, k) for row in scores]
    return _stack(rows, len(scores), min(k, scores.shape[1]), k)


def shard_topk(shard: Shard, queries: SparseBatch, k: int) -> TopK:
    """The exact top-k of a query batch within one shard: (B, k) scores and global ranks.

    Query by query into one reused (n,) accumulator: the shard's score memory is 4 bytes per
    document, and the top-k reads a row that is still in cache (a (B, n) block would be page-faulted
    in and read back from memory)."""
    acc = np.empty(shard.n_docs, dtype=np.float32)
    rows = []
    for terms, values in _query_terms(shard, queries):
        acc.fill(0.0)
        accumulate(acc, shard, terms, values)
        rows.append(row_topk(acc, shard.ranks, k))
    return _stack(rows, queries.rows, min(k, shard.n_docs), k)


def _stack(rows: list[tuple[np.ndarray, np.ndarray]], b: int, keep: int, k: int) -> TopK:
    if keep == 0:
        return _sort_pad(np.zeros((b, 0), np.float32), np.zeros((b, 0), np.int64), k)
    return _sort_pad(np.stack([s for s, _ in rows]), np.stack([r for _, r in rows]), k)


def _sort_pad(scores: np.ndarray, ranks: np.ndarray, k: int) -> TopK:
    """Sort each row by (score desc, rank asc), keep k, and pad non-positive scores as (0, -1)."""
    order = np.lexsort((ranks, -scores), axis=1)[:, :k]
    scores, ranks = np.take_along_axis(scores, order, 1), np.take_along_axis(ranks, order, 1)
    empty = scores <= 0
    extra = ((0, 0), (0, k - scores.shape[1]))
    return TopK(
        np.pad(np.where(empty, 0, scores).astype(np.float32), extra),
        np.pad(np.where(empty, PAD, ranks).astype(np.int64), extra, constant_values=PAD),
    )


def merge_topk(parts: list[TopK], k: int) -> TopK:
    """Per-shard top-k lists of the same queries -> the top-k of their union (what one big shard
    would give)."""
    return _sort_pad(
        np.concatenate([p.scores for p in parts], axis=1),
        np.concatenate([p.ranks for p in parts], axis=1),
        k,
    )


def concat_topk(batches: list[TopK], k: int) -> TopK:
    """The top-k of consecutive query batches as one, in their order ((0, k) for none)."""
    if not batches:
        return TopK(np.zeros((0, k), np.float32), np.zeros((0, k), np.int64))
    return TopK(
        np.concatenate([b.scores for b in batches]), np.concatenate([b.ranks for b in batches])
    )


def rank_ids(ids: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, pa.Array]:
    """ids (N,) strings -> (ranks (N,) int64, the ids sorted): ``sorted_ids[ranks[i]] == ids[i]``.

    Strings sort by UTF-8 bytes, i.e. by code point, as Python and trec_eval compare them. A
    duplicate id is an :class:`InputError` naming it."""
    ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    order = pc.sort_indices(ids)
    sorted_ids = ids.take(order)
    if len(sorted_ids) > 1:
        dup = pc.equal(sorted_ids.slice(1), sorted_ids.slice(0, len(sorted_ids) - 1))
        if pc.any(dup).as_py():
            first = pc.index(dup, True).as_py()
            raise InputError(
                f"document id {sorted_ids[first].as_py()!r} appears more than once in the corpus"
            )
    ranks = np.empty(len(ids), dtype=np.int64)
    ranks[order.to_numpy()] = np.arange(len(ids), dtype=np.int64)
    return ranks, sorted_ids


def shard_bounds(n_docs: int, shard_size: int, workers: int) -> list[tuple[int, int]]:
    """Split n documents into contiguous shards of at most ``shard_size`` (0 = one per worker),
    sizes within 1."""
    size = shard_size if shard_size > 0 else math.ceil(n_docs / max(1, workers))
    count = max(1, math.ceil(n_docs / max(1, size)))
    edges = [n_docs * i // count for i in range(count + 1)]
    return list(itertools.pairwise(edges))
