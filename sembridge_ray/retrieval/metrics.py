"""Retrieval quality with ir-measures (trec_eval semantics) and sparsity statistics of the
encodings.

Quality is averaged over **every query in the qrels**, as ``trec_eval -c`` does: a query with no
retrieved document scores 0, and so does a qrels query with no text to encode. nDCG uses the graded
relevance as its gain. ir-measures sends nDCG@10 and R@100 to pytrec_eval (trec_eval orders tied
scores by document id descending) and RR@10 to the MS MARCO evaluator (ties by document id
ascending, as our run's rank column)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import ir_measures
import numpy as np
from ir_measures import RR, R, nDCG

RUN, METRICS, PER_QUERY = "run.trec", "metrics.json", "per_query.tsv"
"""The files of a scored run (an evaluation, a BM25 run, a fusion): the TREC run, the mean scores
and the scores per query."""

Qrels = Mapping[str, Mapping[str, int]]
Run = Mapping[str, Mapping[str, float]]
PRIMARY = nDCG @ 10
MEASURES = (PRIMARY, R @ 100, RR @ 10)


def per_query_metrics(
    qrels: Qrels, run: Run, measures: Iterable[Any] = MEASURES
) -> dict[str, dict[str, float]]:
    """{measure name: {qrels query id: value}} for every qrels query (0 for a query with no
    retrieved document)."""
    measures = list(measures)
    per_query: dict[str, dict[str, float]] = {str(m): {} for m in measures}
    judged_run = {q: dict(docs) for q, docs in run.items() if q in qrels and docs}
    if judged_run:
        qrels_dict = {q: dict(docs) for q, docs in qrels.items()}
        for metric in ir_measures.iter_calc(measures, qrels_dict, judged_run):
            per_query[str(metric.measure)][metric.query_id] = float(metric.value)
    return {name: {q: values.get(q, 0.0) for q in qrels} for name, values in per_query.items()}


def mean_metrics(per_query: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """{measure: mean over the queries} of :func:`per_query_metrics`' output."""
    return {
        name: (sum(values.values()) / len(values) if values else 0.0)
        for name, values in per_query.items()
    }


def retrieval_metrics(
    qrels: Qrels, run: Run, measures: Iterable[Any] = MEASURES
) -> dict[str, float]:
    """{measure name in ir-measures notation: mean over every qrels query}; missing queries count as
    0."""
    return mean_metrics(per_query_metrics(qrels, run, measures))


def per_query_tsv(per_query: Mapping[str, Mapping[str, float]]) -> str:
    """``query_id`` and one column per measure, a row per qrels query (sorted), for paired
    comparisons."""
    names = list(per_query)
    qids = sorted(next(iter(per_query.values()), {}))
    lines = ["\t".join(["query_id", *names])]
    lines += ["\t".join([q, *(repr(per_query[n][q]) for n in names)]) for q in qids]
    return "\n".join(lines) + "\n"


def term_counts(indices: np.ndarray, vocab_size: int) -> np.ndarray:
    """indices (nnz,) of the active terms of many vectors -> df (V,) int64: how many vectors have
    each term."""
    return np.bincount(indices, minlength=vocab_size).astype(np.int64)


def flops_per_pair(query_df: np.ndarray, n_queries: int, doc_df: np.ndarray, n_docs: int) -> float:
    """Expected multiply-adds per query–document pair, Σ_v p_q(v)·p_d(v) (SPLADE, Paria et al.
    2020).

    query_df (Vq,), doc_df (Vd,): vectors with term v active; p = df / count. The shorter vector is
    zero-padded."""
    if n_queries == 0 or n_docs == 0:
        return 0.0
    size = max(len(query_df), len(doc_df))
    p_q = np.pad(query_df, (0, size - len(query_df))) / n_queries
    p_d = np.pad(doc_df, (0, size - len(doc_df))) / n_docs
    return float(np.dot(p_q, p_d))


def sparsity_stats(
    query_df: np.ndarray, n_queries: int, doc_df: np.ndarray, n_docs: int
) -> dict[str, float]:
    """Mean active dimensions per query and per document, and FLOPs per pair (from the df vectors
    alone)."""
    return {
        "mean_active_dims_query": float(query_df.sum() / n_queries) if n_queries else 0.0,
        "mean_active_dims_doc": float(doc_df.sum() / n_docs) if n_docs else 0.0,
        "flops_per_pair": flops_per_pair(query_df, n_queries, doc_df, n_docs),
    }


def empty_rows(indptr: np.ndarray) -> int:
    """How many rows of a CSR batch (its ``indptr``) have no active dimension."""
    return int(np.count_nonzero(np.diff(indptr) == 0))


def empty_shares(
    empty_queries: int, n_queries: int, empty_docs: int, n_docs: int
) -> dict[str, float]:
    """The share of query and of document vectors that are empty: such a text can match nothing."""
    return {
        "empty_share_query": empty_queries / n_queries if n_queries else 0.0,
        "empty_share_doc": empty_docs / n_docs if n_docs else 0.0,
    }


def unknown_judgements(qrels: Qrels, missing: set[str]) -> dict[str, int]:
    """Counts of qrels entries naming ``missing`` documents (not in the corpus). They are reported,
    and kept: a relevant document the corpus lacks still counts against recall and nDCG, as in
    trec_eval."""
    entries = [(q, d, g) for q, docs in qrels.items() for d, g in docs.items() if d in missing]
    return {
        "unknown_qrels_docs": len({d for _, d, _ in entries}),
        "unknown_qrels_judgements": len(entries),
        "unknown_qrels_relevant": sum(1 for *_, g in entries if g > 0),
        "queries_with_unknown_docs": len({q for q, _, _ in entries}),
    }
