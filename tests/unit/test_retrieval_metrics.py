"""Metrics equal pytrec_eval on hand-made runs (graded qrels, missing queries); hand-computed
sparsity stats."""

from __future__ import annotations

import math

import numpy as np
import pytest
import pytrec_eval

from sembridge_ray.retrieval.metrics import (
    flops_per_pair,
    per_query_metrics,
    per_query_tsv,
    retrieval_metrics,
    sparsity_stats,
    term_counts,
    unknown_judgements,
)

QRELS = {
    "q1": {"a": 2, "b": 1, "c": 0, "z": 1},  # z is not in any run
    "q2": {"x": 1},
    "q3": {"m": 2, "n": 2},  # never retrieved: scores 0
    "q4": {"p": 0},  # judged, nothing relevant
}
RUN = {
    "q1": {"c": 9.0, "b": 5.0, "a": 4.0, "u": 3.5},
    "q2": {f"y{i}": 10.0 - i * 0.01 for i in range(12)} | {"x": 1.0},  # first relevant at rank 13
    "q4": {"p": 1.0},
    "q9": {"a": 1.0},  # not in the qrels: ignored
}


def pytrec_mean(measure: str, qrels: dict, run: dict) -> float:
    per_query = pytrec_eval.RelevanceEvaluator(qrels, {measure}).evaluate(run)
    key = measure.replace(".", "_")
    return sum(per_query.get(q, {}).get(key, 0.0) for q in qrels) / len(qrels)


def test_ndcg_and_recall_equal_pytrec_eval_over_every_qrels_query() -> None:
    got = retrieval_metrics(QRELS, RUN)
    assert got["nDCG@10"] == pytest.approx(pytrec_mean("ndcg_cut.10", QRELS, RUN), abs=1e-12)
    assert got["R@100"] == pytest.approx(pytrec_mean("recall.100", QRELS, RUN), abs=1e-12)
    # by hand, trec_eval's linear gains: q1 ranks c(0) b(1) a(2) u(-), ideal a(2) b(1) z(1); the
    # rest score 0
    dcg = 1 / math.log2(3) + 2 / math.log2(4)
    idcg = 2 + 1 / math.log2(3) + 1 / math.log2(4)
    assert got["nDCG@10"] == pytest.approx((dcg / idcg + 0 + 0 + 0) / 4)


def test_per_query_values_equal_pytrec_eval_and_cover_every_qrels_query() -> None:
    got = per_query_metrics(QRELS, RUN)["nDCG@10"]
    expected = pytrec_eval.RelevanceEvaluator(QRELS, {"ndcg_cut.10"}).evaluate(RUN)
    assert set(got) == set(QRELS)
    for q in QRELS:
        assert got[q] == pytest.approx(expected.get(q, {}).get("ndcg_cut_10", 0.0), abs=1e-12)
    lines = per_query_tsv(per_query_metrics(QRELS, RUN)).splitlines()
    assert lines[0] == "query_id\tnDCG@10\tR@100\tRR@10" and [
        row.split("\t")[0] for row in lines[1:]
    ] == sorted(QRELS)


def test_rr_at_10_is_reciprocal_rank_cut_at_10() -> None:
    top10 = {q: dict(sorted(d.items(), key=lambda x: (-x[1], x[0]))[:10]) for q, d in RUN.items()}
    got = retrieval_metrics(QRELS, RUN)
    assert got["RR@10"] == pytest.approx(pytrec_mean("recip_rank", QRELS, top10), abs=1e-12)
    assert got["RR@10"] == pytest.approx((1 / 2) / 4)  # q2's relevant document is at rank 13


def test_empty_run_scores_zero_and_ties_follow_trec_eval() -> None:
    assert retrieval_metrics(QRELS, {}) == {"nDCG@10": 0.0, "R@100": 0.0, "RR@10": 0.0}
    # trec_eval puts c first (document id descending on equal scores)
    tied = {"q1": {"a": 1.0, "c": 1.0}}
    assert retrieval_metrics(QRELS, tied)["nDCG@10"] == pytest.approx(
        pytrec_mean("ndcg_cut.10", QRELS, tied)
    )


def test_flops_and_active_dims_by_hand() -> None:
    # queries: {0,1}, {1}; documents: {1,2}, {2}, {0,1,2}
    q_df = term_counts(np.array([0, 1, 1]), 3)
    d_df = term_counts(np.array([1, 2, 2, 0, 1, 2]), 4)
    assert q_df.tolist() == [1, 2, 0] and d_df.tolist() == [1, 2, 3, 0]
    # p_q = (1/2, 1, 0), p_d = (1/3, 2/3, 1, 0): 1/6 + 2/3 = 5/6, the mean overlap over the 6 pairs
    assert flops_per_pair(q_df, 2, d_df, 3) == pytest.approx(5 / 6)
    overlaps = [len({0, 1} & d) for d in ({1, 2}, {2}, {0, 1, 2})] + [
        len({1} & d) for d in ({1, 2}, {2}, {0, 1, 2})
    ]
    assert flops_per_pair(q_df, 2, d_df, 3) == pytest.approx(np.mean(overlaps))
    assert sparsity_stats(q_df, 2, d_df, 3) == pytest.approx(
        {"mean_active_dims_query": 1.5, "mean_active_dims_doc": 2.0, "flops_per_pair": 5 / 6}
    )


def test_unknown_judgements_are_counted() -> None:
    assert unknown_judgements(QRELS, {"z", "p"}) == {
        "unknown_qrels_docs": 2,
        "unknown_qrels_judgements": 2,
        "unknown_qrels_relevant": 1,
        "queries_with_unknown_docs": 2,
    }
