"""A synthetic SPLADE-like corpus for the retrieval benchmark (seeded, no I/O).

Terms are drawn from a Zipf-like law p(v) ∝ 1/rank(v)^s over a shuffled vocabulary, with
replacement, then deduplicated; weights are uniform on [0.05, 3], like log(1 + relu) activations.
With s = 0.8, 130 draws per document and 40 per query this gives about 120 active dimensions per
document, 39 per query, and about 3.8 FLOPs per query–document pair: the range of SPLADE v2 on MS
MARCO."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sembridge_ray.retrieval.index import SparseBatch
from sembridge_ray.runtime.config import Config

BERT_VOCAB = 30522


@dataclass(frozen=True, kw_only=True)
class BenchConfig(Config):
    """``python -m jobs.bench_retrieval``: sharded Ray search vs a single-process brute force on the
    same data."""

    docs: int = 1_000_000
    queries: int = 1000
    vocab_size: int = BERT_VOCAB
    zipf_exponent: float = 0.8
    doc_draws: int = 130
    """Terms drawn per document (with replacement; about 120 distinct)."""
    query_draws: int = 40
    top_k: int = 10
    workers: int = 2
    query_batch_size: int = 32
    repeats: int = 3
    """Timed runs of each side, alternating; the best of each is reported (all are listed)."""
    scipy_queries: int = 100
    """Queries also timed with a plain scipy ``(Q @ D.T).toarray()`` product (0 = skip)."""
    seed: int = 0
    output: str = ""
    """Also write the report as JSON here ("" = print only)."""


def zipf_probs(vocab_size: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """p (V,) ∝ 1 / rank^exponent, ranks shuffled over the vocabulary."""
    p = 1.0 / np.arange(1, vocab_size + 1, dtype=np.float64) ** exponent
    probs: np.ndarray = (p / p.sum())[rng.permutation(vocab_size)]
    return probs


def sparse_vectors(
    rows: int, draws: int, probs: np.ndarray, rng: np.random.Generator, chunk: int = 50_000
) -> SparseBatch:
    """rows vectors of ``draws`` terms drawn from ``probs`` (deduplicated, ascending) with weights
    in [0.05, 3]."""
    cdf = np.cumsum(probs)
    cdf[-1] = 1.0
    indptr, indices = [np.zeros(1, np.int64)], []
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        terms = np.searchsorted(cdf, rng.random((n, draws)), side="right").astype(np.int32)
        terms.sort(axis=1)
        keep = np.ones_like(terms, dtype=bool)
        keep[:, 1:] = terms[:, 1:] != terms[:, :-1]
        indices.append(terms[keep])
        indptr.append(indptr[-1][-1] + np.cumsum(keep.sum(axis=1), dtype=np.int64))
    flat = np.concatenate(indices)
    values = rng.uniform(0.05, 3.0, size=flat.size).astype(np.float32)
    return SparseBatch(np.concatenate(indptr), flat, values)
