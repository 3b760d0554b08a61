"""A retrieval corpus drawn from a real encoder's statistics (seeded), for benchmarks that pruning
must survive.

The synthetic corpus of :mod:`benchmarks.synthetic` has uniform weights and independent terms: the
worst case for dynamic pruning. Here the bundled SICK + STS sentences are encoded with the bundled
MiniLM SPLADE (:func:`~sembridge_ray.sparse.encode.encode_texts`), each vector cut to its
``doc_max_active_dims`` largest weights (the untrained encoder activates about 4,000 terms per
sentence; the cut gives SPLADE-v2-like sizes), and N documents are resampled from that sample:

- a document's length is drawn from the sample's lengths;
- its terms are drawn with probability ∝ document frequency (with replacement, duplicates merged, so
  lengths come out slightly shorter);
- each term's weight is drawn from that term's own observed weights.

Queries are real: held-out sentences encoded the same way, cut to ``query_max_active_dims``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sembridge_ray.retrieval.index import SparseBatch

log = logging.getLogger(__name__)
CACHE = Path("~/.cache/sembridge_ray/bench").expanduser()


@dataclass(frozen=True, kw_only=True)
class TermStats:
    """What the resampler keeps of the encoded sample: ``lengths`` (n,) active terms per document,
    ``df`` (V,), and every term's observed weights, term-major (``weight_indptr`` (V + 1,),
    ``weights`` (nnz,))."""

    lengths: np.ndarray
    df: np.ndarray
    weight_indptr: np.ndarray
    weights: np.ndarray


def encode_sample(
    texts: list[str], max_active_dims: int, model: str = "minilm-splade", batch: int = 64
) -> SparseBatch:
    """Texts -> their SPLADE vectors (each cut to ``max_active_dims``), cached by texts and cut (the
    encoder is bundled)."""
    import hashlib

    key = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:12]
    path = CACHE / f"{model}-{key}-top{max_active_dims}.npz"
    if path.is_file():
        data = np.load(path)
        return SparseBatch(data["indptr"], data["indices"], data["values"])
    from sembridge_ray.bundled import resolve
    from sembridge_ray.sparse.encode import encode_texts
    from sembridge_ray.sparse.model import load_sparse_encoder

    log.info("encoding %d texts with %s (once; cached in %s)", len(texts), model, path)
    idx, val = encode_texts(
        load_sparse_encoder(resolve(model), max_length=128),
        texts,
        batch,
        max_active_dims=max_active_dims,
    )
    indptr = np.concatenate([[0], np.cumsum([len(i) for i in idx])]).astype(np.int64)
    out = SparseBatch(
        indptr, np.concatenate(idx).astype(np.int32), np.concatenate(val).astype(np.float32)
    )
    CACHE.mkdir(parents=True, exist_ok=True)
    np.savez(path, indptr=out.indptr, indices=out.indices, values=out.values)
    return out


def term_stats(sample: SparseBatch, vocab: int) -> TermStats:
    order = np.argsort(sample.indices, kind="stable")
    df = np.bincount(sample.indices, minlength=vocab).astype(np.int64)
    return TermStats(
        lengths=np.diff(sample.indptr),
        df=df,
        weight_indptr=np.concatenate([[0], np.cumsum(df)]),
        weights=sample.values[order],
    )


def resample(
    stats: TermStats, n: int, rng: np.random.Generator, chunk: int = 100_000
) -> SparseBatch:
    """``n`` documents drawn from ``stats`` (see the module docstring), terms ascending within a
    document."""
    vocab = len(stats.df)
    cdf = np.cumsum(stats.df / stats.df.sum())
    cdf[-1] = 1.0
    indptr, indices, values = [np.zeros(1, np.int64)], [], []
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        lengths = rng.choice(stats.lengths, size=m)
        docs = np.repeat(np.arange(m, dtype=np.int64), lengths)
        terms = np.searchsorted(cdf, rng.random(len(docs)), side="right")
        key = np.unique(docs * vocab + terms)  # merged duplicates; document-major, terms ascending
        docs, terms = key // vocab, key % vocab
        pick = stats.weight_indptr[terms] + (rng.random(len(terms)) * stats.df[terms]).astype(
            np.int64
        )
        indices.append(terms.astype(np.int32))
        values.append(stats.weights[pick])
        indptr.append(indptr[-1][-1] + np.cumsum(np.bincount(docs, minlength=m)))
    return SparseBatch(np.concatenate(indptr), np.concatenate(indices), np.concatenate(values))


def encoder_corpus(
    docs: int,
    queries: int,
    seed: int = 0,
    sample_texts: int = 2000,
    doc_max_active_dims: int = 128,
    query_max_active_dims: int = 32,
) -> tuple[SparseBatch, SparseBatch]:
    """(``docs`` resampled documents, ``queries`` real encoded queries) over BERT's 30,522-term
    vocabulary."""
    from benchmarks.synthetic import BERT_VOCAB
    from sembridge_ray.bundled import bundled_text

    texts = list(dict.fromkeys(bundled_text()))  # distinct sentences, in file order
    sample = encode_sample(texts[:sample_texts], doc_max_active_dims)
    held_out = encode_sample(texts[sample_texts : sample_texts + queries], query_max_active_dims)
    return resample(term_stats(sample, BERT_VOCAB), docs, np.random.default_rng(seed)), held_out
