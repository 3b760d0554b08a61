"""BM25 over a tokenizer's pieces and the reciprocal-rank fusion of two runs, each against an
independent computation: Lucene's BM25 formula and RRF's sum, by hand on hand-made inputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sembridge_ray.recipes.reproduce.baselines import BM25Config, FusionConfig, run_bm25, run_fusion
from sembridge_ray.retrieval.bm25 import bm25_run, pieces, rrf
from sembridge_ray.retrieval.store import read_run
from sembridge_ray.runtime.outputs import is_complete

DOCS = {
    "d1": "the cat sat on the mat",
    "d2": "a dog and a cat",
    "d3": "the dog barked at the dog next door",
    "d4": "birds sing",
}
QUERIES = {"q1": "cat on a mat", "q2": "the dog", "q3": "fish"}


def lucene_bm25(
    query: list[str], doc: list[str], corpus: list[list[str]], k1: float, b: float
) -> float:
    """Lucene's BM25 (``BM25Similarity`` since Lucene 8): a query term counts once per occurrence."""
    n, avgdl = len(corpus), sum(map(len, corpus)) / len(corpus)
    score = 0.0
    for term in query:
        tf = doc.count(term)
        if tf:
            df = sum(term in d for d in corpus)
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            score += idf * tf / (tf + k1 * (1 - b + b * len(doc) / avgdl))
    return score


@pytest.mark.parametrize(("k1", "b"), [(0.9, 0.4), (1.2, 0.75), (2.0, 0.0)])
def test_bm25_scores_and_ranks_as_lucenes_formula_by_hand(k1: float, b: float) -> None:
    split = {k: v.split() for k, v in DOCS.items()}
    corpus = list(split.values())
    run = bm25_run(
        list(split), corpus, list(QUERIES), [q.split() for q in QUERIES.values()], k1, b, top_k=3
    )
    for qid, text in QUERIES.items():
        expected = {d: lucene_bm25(text.split(), toks, corpus, k1, b) for d, toks in split.items()}
        kept = sorted((d for d in expected if expected[d] > 0), key=lambda d: -expected[d])[:3]
        assert sorted(run[qid]) == sorted(kept)  # no document without a shared term
        for doc in kept:
            assert run[qid][doc] == pytest.approx(expected[doc], rel=1e-5)
    assert run["q3"] == {}  # nothing shares "fish"


def test_pieces_are_the_tokenizers_ids_without_specials_or_truncation(fixtures_root: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(fixtures_root / "tok-wordpiece"))
    text = " ".join(["cat"] * 600)  # longer than any model length
    (found,) = pieces(tok, [text])
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert found == [str(i) for i in ids] and len(found) >= 600 > tok.model_max_length
    assert str(tok.cls_token_id) not in found


def test_rrf_fuses_as_the_sum_of_reciprocal_ranks_by_hand() -> None:
    a = {"q1": {"d1": 9.0, "d2": 5.0, "d3": 1.0}, "q2": {"d4": 2.0}}
    b = {"q1": {"d3": 0.9, "d1": 0.2}, "q2": {}, "q3": {"d2": 1.0}}
    fused = rrf([a, b], k=60, top_k=2)
    by_hand = {
        "q1": {"d1": 1 / 61 + 1 / 62, "d3": 1 / 63 + 1 / 61, "d2": 1 / 62},
        "q2": {"d4": 1 / 61},
        "q3": {"d2": 1 / 61},
    }
    for qid, scores in by_hand.items():
        top = sorted(scores, key=lambda d: (-scores[d], d))[:2]
        assert list(fused[qid]) == top
        for doc in top:
            assert fused[qid][doc] == pytest.approx(scores[doc], rel=1e-12)


QRELS = {"q1": {"d1": 1}, "q2": {"d3": 1}, "q3": {"d4": 1}}


def test_rrf_gives_ranx_fuse_scores_on_random_runs() -> None:
    import numpy as np
    from ranx import Run, fuse

    rng = np.random.default_rng(0)
    runs = []
    for _ in range(3):  # distinct scores: no ties, whose order ranx leaves open
        runs.append(
            {
                f"q{q}": {
                    f"d{d}": float(s)
                    for d, s in zip(
                        rng.choice(60, 20, replace=False),
                        rng.permutation(20) + rng.random(20),
                        strict=True,
                    )
                }
                for q in range(25)
            }
        )
    ours = rrf(runs, k=60, top_k=60)
    theirs = fuse(
        [Run(r, name=f"r{i}") for i, r in enumerate(runs)], method="rrf", params={"k": 60}
    )
    for qid, docs in ours.items():
        expected = dict(theirs[qid])
        assert docs.keys() == expected.keys()
        for doc, score in docs.items():
            assert score == pytest.approx(expected[doc], rel=1e-12)


def _beir(root: Path) -> Path:
    """``DOCS``, ``QUERIES`` and ``QRELS`` (test) in the BEIR layout."""
    (root / "qrels").mkdir(parents=True)
    docs = [{"_id": k, "text": v} for k, v in DOCS.items()]
    queries = [{"_id": k, "text": v} for k, v in QUERIES.items()]
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    lines = [f"{q}\t{d}\t{g}\n" for q, docs in QRELS.items() for d, g in docs.items()]
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(lines))
    return root


def test_the_bm25_stage_writes_a_scored_run_under_the_output_contract(
    fixtures_root: Path, tmp_path: Path
) -> None:
    from sembridge_ray.retrieval.metrics import retrieval_metrics

    beir, tok = _beir(tmp_path / "beir"), fixtures_root / "tok-wordpiece"
    cfg = BM25Config(tokenizer=str(tok), dataset=str(beir), output=str(tmp_path / "bm25"))
    result = run_bm25(cfg, {"tokenizer": "t", "dataset": "d"})
    out = Path(result.output)
    assert is_complete(out) and not result.skipped
    metrics = json.loads((out / "metrics.json").read_text())
    scored = retrieval_metrics(QRELS, read_run(out / "run.trec"))
    assert metrics["nDCG@10"] == pytest.approx(scored["nDCG@10"]) and metrics["nDCG@10"] > 0
    assert run_bm25(cfg, {"tokenizer": "t", "dataset": "d"}).skipped  # finished: skipped
    fused = FusionConfig(
        runs=(str(out), str(out)), dataset=str(beir), output=str(tmp_path / "fused")
    )
    done = run_fusion(fused, {"a": "x", "b": "y"})
    # a run fused with itself keeps its order
    original, again = read_run(out / "run.trec"), read_run(Path(done.output) / "run.trec")
    for qid, docs in original.items():
        assert list(again[qid]) == sorted(docs, key=lambda d: (-docs[d], d))
