"""The baseline a user would keep: BM25 over a tokenizer's pieces (``bm25s``), and the reciprocal-rank
fusion of two runs (``ranx``), each scored as the evaluate job scores a model (ir-measures, every
qrels query).

- **BM25.** Queries and documents are cut into the pieces of a tokenizer (the target language's, so
  BM25 sees the same units the transferred model does), with no special tokens and no truncation:
  BM25 reads whole texts. ``bm25s`` indexes them with Lucene's BM25 (``method="lucene"``):
  ``idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))`` and ``tf / (tf + k1 (1 - b + b dl / avgdl))``
  per term, at ``k1`` 0.9 and ``b`` 0.4 by default (Anserini's defaults, the usual BM25 of the
  BEIR and MIRACL tables). A document that shares no piece with the query scores 0 and is not
  retrieved.
- **Fusion.** Reciprocal-rank fusion (Cormack et al. 2009): a document's score is the sum over the
  runs of ``1 / (k + rank)``, ``k`` = 60, as ``ranx.fuse(method="rrf")`` computes it (see
  :func:`rrf` for why it is computed here). The fused run is cut to ``top_k``.

Both write what an evaluation writes: ``run.trec``, ``per_query.tsv`` and ``metrics.json`` (the
same measures); ``sembridge_ray.recipes.reproduce.baselines`` runs them under the output contract."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sembridge_ray.retrieval.metrics import (
    METRICS,
    PER_QUERY,
    RUN,
    Qrels,
    Run,
    mean_metrics,
    per_query_metrics,
    per_query_tsv,
)
from sembridge_ray.retrieval.store import format_score, read_run
from sembridge_ray.runtime.outputs import atomic_write_json, atomic_write_text

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

RRF_K = 60


def pieces(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> list[list[str]]:
    """Each text as the tokenizer's pieces (ids as strings: a piece is its id), no special tokens,
    whole (no truncation)."""
    # verbose=False: no warning that a text is longer than the model's positions (BM25 has none)
    encoded = tokenizer(list(texts), add_special_tokens=False, truncation=False, verbose=False)
    return [[str(i) for i in row] for row in encoded["input_ids"]]


def bm25_run(
    doc_ids: Sequence[str],
    doc_tokens: list[list[str]],
    query_ids: Sequence[str],
    query_tokens: list[list[str]],
    k1: float,
    b: float,
    top_k: int,
) -> dict[str, dict[str, float]]:
    """{query id: {doc id: BM25 score}} of each query's ``top_k`` documents with a score above 0."""
    import bm25s

    if not doc_ids:
        return {}
    index = bm25s.BM25(k1=k1, b=b, method="lucene")
    index.index(doc_tokens, show_progress=False)
    k = min(top_k, len(doc_ids))
    # an empty query has no term to look up; bm25s needs one token per query
    asked = [tokens or [""] for tokens in query_tokens]
    found, scores = index.retrieve(asked, k=k, show_progress=False, n_threads=1)
    run: dict[str, dict[str, float]] = {}
    for qid, rows, values in zip(query_ids, found, scores, strict=True):
        keep = values > 0
        run[qid] = {
            doc_ids[int(r)]: float(s) for r, s in zip(rows[keep], values[keep], strict=True)
        }
    return run


def rrf(runs: Sequence[Run], k: int = RRF_K, top_k: int = 100) -> dict[str, dict[str, float]]:
    """The reciprocal-rank fusion of ``runs``: per query, each document's sum over the runs of
    ``1 / (k + rank)`` (rank from 1 in the run's order: score descending, ties by doc id), the
    ``top_k`` kept.

    Written here rather than taken from ``ranx.fuse(method="rrf")``, which gives the same scores
    (``tests/unit/test_bm25.py`` checks it against ranx): ranx took 6-16 s to fuse the 2,909 KorQuAD
    test queries (9 s of it reading its fused run back out of numba's typed dicts) plus 4-30 s of
    numba compilation per process; this takes about 0.3 s."""
    fused: dict[str, dict[str, float]] = {}
    for qid in sorted({q for run in runs for q, docs in run.items() if docs}):
        scores: dict[str, float] = {}
        for run in runs:
            for rank, (doc, _) in enumerate(_top(run.get(qid) or {}, len(run.get(qid) or {})), 1):
                scores[doc] = scores.get(doc, 0.0) + 1.0 / (k + rank)
        fused[qid] = dict(_top(scores, top_k))
    return fused


def _top(scores: Mapping[str, float], k: int) -> list[tuple[str, float]]:
    """The ``k`` best (doc, score), ties by doc id (ascending), as the evaluate job's runs."""
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:k]


def write_scored(out: Path, run: Run, qrels: Qrels, tag: str) -> dict[str, float]:
    """``run.trec``, ``per_query.tsv`` and ``metrics.json`` of ``run`` in ``out``; returns the
    metrics."""
    lines = [
        f"{qid} Q0 {doc} {rank} {format_score(float(np.float32(score)))} {tag}\n"
        for qid in sorted(run)
        for rank, (doc, score) in enumerate(_top(run[qid], len(run[qid])), start=1)
    ]
    atomic_write_text(out / RUN, "".join(lines))
    per_query = per_query_metrics(qrels, read_run(out / RUN))
    atomic_write_text(out / PER_QUERY, per_query_tsv(per_query))
    metrics = mean_metrics(per_query) | {
        "num_queries": len(qrels),
        "queries_with_results": sum(1 for q in qrels if run.get(q)),
    }
    atomic_write_json(out / METRICS, metrics)
    return metrics
