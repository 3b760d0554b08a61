"""Parity: a target's top-k against the project's exact sparse search on the same vectors.

The exact answer is :func:`sembridge_ray.retrieval.index.shard_topk` over the exported document
vectors (scores descending, ties by document id). A target's list is *identical up to ties* for a
query when the exact scores of the documents it returned, sorted, equal the exact top-k scores
(relative 1e-5: engines sum in their own order, in float32): it may order tied documents otherwise,
or pick others among those tied at the cut, and nothing else. ``overlap@10`` is the plain mean share
of the exact top-10 the target returned; nDCG@10 of both runs is computed with ir-measures on the
queries' judgements, each run ranked as it came back."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from ir_measures import nDCG

from sembridge_ray.data.registry import load_retrieval
from sembridge_ray.data.retrieval import RetrievalData
from sembridge_ray.data.schema import ID
from sembridge_ray.export.base import Hits, Vectors
from sembridge_ray.export.report import ParityReport
from sembridge_ray.retrieval.index import PAD, build_shard, rank_ids, shard_topk
from sembridge_ray.retrieval.metrics import retrieval_metrics
from sembridge_ray.runtime.errors import InputError

log = logging.getLogger(__name__)

K = 10
RTOL = 1e-5


@dataclass(frozen=True, kw_only=True)
class Parity:
    queries: int
    overlap_at_10: float
    """Mean over the queries of |target top-10 ∩ exact top-10| / |exact top-10| (queries with an
    empty exact list count 1 when the target's is empty too)."""
    identical_up_to_ties: float
    """Share of the queries whose target list equals the exact one up to ties (see the module
    docstring)."""
    ndcg_at_10_exact: float | None
    ndcg_at_10_target: float | None

    def report(self) -> ParityReport:
        return ParityReport(
            {
                "queries": self.queries,
                "overlap@10": round(self.overlap_at_10, 6),
                "identical_up_to_ties": round(self.identical_up_to_ties, 6),
                "ndcg@10_exact": _rounded(self.ndcg_at_10_exact),
                "ndcg@10_target": _rounded(self.ndcg_at_10_target),
            }
        )


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def matrix(vectors: Vectors, width: int) -> sp.csr_matrix:
    rows = vectors.rows
    return sp.csr_matrix(
        (rows.values.astype(np.float64), rows.indices, rows.indptr), shape=(rows.rows, width)
    )


def width_of(*vectors: Vectors) -> int:
    return max((int(v.rows.indices.max(initial=-1)) + 1 for v in vectors), default=0)


def exact_topk(docs: Vectors, queries: Vectors, k: int = K) -> Hits:
    """The project's exact top-k document ids per query (positive scores only, ties by id)."""
    import pyarrow as pa

    ranks, sorted_ids = rank_ids(pa.array(docs.ids, pa.string()))
    shard = build_shard(docs.rows, ranks, width_of(docs, queries))
    top = shard_topk(shard, queries.rows, k)
    names = sorted_ids.to_pylist()
    return [[names[r] for r in row if r != PAD] for row in top.ranks]


def parity(
    docs: Vectors,
    queries: Vectors,
    got: Hits,
    qrels: Mapping[str, Mapping[str, int]] | None = None,
    k: int = K,
    exact: Hits | None = None,
) -> Parity:
    """Compare ``got`` (a target's top-k per query of ``queries``) with the exact search over
    ``docs``."""
    exact = exact_topk(docs, queries, k) if exact is None else exact
    if len(got) != len(exact):
        raise ValueError(f"{len(got)} result lists for {len(exact)} queries")
    width = width_of(docs, queries)
    # exact float64 scores, sparse
    scores = (matrix(queries, width) @ matrix(docs, width).T).tocsr()
    position = {d: i for i, d in enumerate(docs.ids)}
    overlap, same = [], []
    for q, (want, have) in enumerate(zip(exact, got, strict=True)):
        row = scores.getrow(q).toarray().ravel()
        have = [d for d in have[:k] if d in position and row[position[d]] > 0]
        overlap.append(len(set(want) & set(have)) / len(want) if want else float(not have))
        a, b = (np.sort([row[position[d]] for d in ids])[::-1] for ids in (want, have))
        same.append(len(a) == len(b) and bool(np.allclose(a, b, rtol=RTOL, atol=0.0)))
    ndcg_exact, ndcg_target = (
        None if qrels is None else ndcg(qrels, queries.ids, run) for run in (exact, got)
    )
    return Parity(
        queries=len(exact),
        overlap_at_10=float(np.mean(overlap)) if overlap else 1.0,
        identical_up_to_ties=float(np.mean(same)) if same else 1.0,
        ndcg_at_10_exact=ndcg_exact,
        ndcg_at_10_target=ndcg_target,
    )


def ndcg(qrels: Mapping[str, Mapping[str, int]], qids: list[str], hits: Hits) -> float:
    """nDCG@10 of a ranked run (the order as returned: scores are 1/(rank + 1)) over every qrels
    query."""
    run = {
        q: {d: 1.0 / (r + 1) for r, d in enumerate(row)} for q, row in zip(qids, hits, strict=True)
    }
    return retrieval_metrics(qrels, run, [nDCG @ 10])[str(nDCG @ 10)]


def judged(named: str, spec: str, split: str) -> tuple[RetrievalData, list[str]]:
    """Split ``split`` of dataset ``spec`` (``named`` as the user gave it) and the queries a parity
    is scored on: the judged ones with a text (none: refused), judged against documents at least
    one of which is relevant and in the corpus. None of those relevant (grade > 0) in the corpus:
    refused, as nDCG@10 would be 0 for any ranking and a target held to an nDCG tolerance would pass
    whatever it returned; some missing: a warning (both runs count them as never found)."""
    data = load_retrieval(spec, split)
    qids = sorted(q for q in data.qrels if data.queries.get(q, "").strip())
    if not qids:
        raise InputError(f"dataset {named!r}: split {data.split!r} has no judged query with a text")
    relevant = {d for q in qids for d, grade in data.qrels[q].items() if grade > 0}
    corpus = {d for batch in data.corpus.batches(100_000) for d in batch.column(ID).to_pylist()}
    missing = relevant - corpus
    if len(missing) == len(relevant):
        why = f"none of the {len(relevant)} is in the corpus" if relevant else "every grade is 0"
        raise InputError(
            f"dataset {named!r}: split {data.split!r}: no document judged relevant to its "
            f"{len(qids)} queries to score them with ({why}): nDCG@10 would be 0 whatever the "
            "target returned"
        )
    if missing:
        log.warning(
            "%d of the %d documents judged relevant are not in the corpus: nDCG@10 counts them as "
            "never found (the exact search's and the target's alike)",
            len(missing),
            len(relevant),
        )
    return data, qids
