"""Development evaluation during fine-tuning: nDCG@10 and sparsity of the weights being trained,
scored exactly as the evaluate job scores a saved model.

Why not Ray Train's validation hook (``ray.train.report(..., validation=...)``, alpha in the
installed Ray): it validates a reported checkpoint in a separate Ray task. That task needs resources
of its own, which the training workers hold on a small cluster (it would run after training, or
fight the workers for the same GPU), and it needs a full checkpoint (model and AdamW state, about
three times the model) at every evaluation. Here the workers evaluate the weights they hold, between
two steps: each encodes its share of the dev corpus and queries (whole staged chunks, as the
evaluate job's encoder pool does), rank 0 searches and scores, and every rank receives the figures.
No rank waits longer than its own share of the encoding plus rank 0's search.

Equality with the evaluate job. A chunk is the evaluate job's ``stage_rows`` texts in corpus order
(queries: sorted ids), encoded whole by ``encode_texts`` in batches of ``encode_batch_size``, by a
SparseEncoder written and loaded the way the job's final model is, at the lengths it is written to
encode with (``query_length``, ``document_length``); the search is the same exact top-k over one
shard, the run goes through the same TREC formatting and ir-measures. So ``jobs.evaluate`` of a
checkpoint exported at an evaluated step gives the nDCG@10 and mean active dimensions recorded at
that step (tests/ray/test_finetune_eval.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from sembridge_ray.data.registry import is_test_split, load_retrieval
from sembridge_ray.data.schema import ID, TEXT
from sembridge_ray.retrieval.index import (
    Shard,
    SparseBatch,
    TopK,
    build_shard,
    concat_topk,
    merge_topk,
    rank_ids,
    shard_topk,
)
from sembridge_ray.retrieval.metrics import mean_metrics, per_query_metrics, term_counts
from sembridge_ray.retrieval.settings import ENCODE_BATCH, QUERY_BATCH, RUN_TAG, STAGE_ROWS, TOP_K
from sembridge_ray.retrieval.store import parse_run, run_lines, sparse_batch
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.sparse.convergence import DEV_DIMS_D, DEV_DIMS_Q, DEV_PRIMARY
from sembridge_ray.sparse.encode import encode_texts, sparse_table
from sembridge_ray.sparse.model import set_max_length

if TYPE_CHECKING:
    from sentence_transformers import SparseEncoder

log = logging.getLogger(__name__)
Rows = tuple[list[np.ndarray], list[np.ndarray]]


@dataclass(frozen=True, kw_only=True)
class DevChunk:
    role: str
    """``document`` or ``query``."""
    ids: list[str]
    texts: list[str]


@dataclass(frozen=True, kw_only=True)
class DevSet:
    """A development set ready for the workers (it travels through Ray's object store)."""

    name: str
    split: str
    chunks: list[DevChunk]
    """The corpus's chunks in corpus order, then the queries' (sorted ids)."""
    qrels: dict[str, dict[str, int]]
    """The judgements scored: every judged query, or the ``eval_max_queries`` sample."""


def load_dev(spec: str, split: str, max_queries: int = 0, seed: int = 0) -> DevSet:
    """Read ``spec``'s ``split`` (the forms of ``--train``) into chunks; ``max_queries`` > 0 keeps a
    seeded sample of the judged queries (the corpus stays whole). A split without judgements is an
    :class:`InputError`."""
    if is_test_split(spec, split):
        raise InputError(
            f"eval_split {split!r} of {spec!r} is what the evaluate job scores as its test: choose recipes on "
            "development data"
        )
    return load_judged(spec, split, max_queries, seed)


def load_judged(spec: str, split: str, max_queries: int = 0, seed: int = 0) -> DevSet:
    """:func:`load_dev` without its refusal of a test split: for a script that reports a recipe
    chosen on the development set (``scripts/sembridge_plus``), never for choosing one."""
    data = load_retrieval(spec, split)
    # MIRACL's public dev: the registry knows which
    if split != "test" and is_test_split(spec, split):
        log.warning(
            "%s split %r is what the evaluate job scores as its test: use it to choose a recipe only when the test "
            "is elsewhere",
            spec,
            split,
        )
    if not data.qrels:
        raise InputError(f"development set {spec!r}: split {data.split!r} has no qrels")
    qrels = {q: dict(d) for q, d in data.qrels.items()}
    if max_queries and len(qrels) > max_queries:
        keep = np.random.default_rng(seed).choice(
            np.array(sorted(qrels)), max_queries, replace=False
        )
        qrels = {q: qrels[q] for q in sorted(keep.tolist())}
    qids = sorted(q for q in qrels if q in data.queries)
    if not any(data.queries[q].strip() for q in qids):
        raise InputError(
            f"development set {spec!r}: no judged query of split {data.split!r} has a text"
        )
    chunks = [
        DevChunk(
            role="document",
            ids=[str(i) for i in t.column(ID).to_pylist()],
            texts=[str(x) for x in t.column(TEXT).to_pylist()],
        )
        for t in data.corpus.batches(STAGE_ROWS)
        if t.num_rows
    ]
    if not (documents := sum(len(c.ids) for c in chunks)):
        raise InputError(f"development set {spec!r}: the corpus is empty")
    chunks += [
        DevChunk(
            role="query",
            ids=qids[i : i + STAGE_ROWS],
            texts=[data.queries[q] for q in qids[i : i + STAGE_ROWS]],
        )
        for i in range(0, len(qids), STAGE_ROWS)
    ]
    log.info(
        "development set %s (%s): %d queries, %d documents", spec, data.split, len(qids), documents
    )
    return DevSet(name=spec, split=data.split, chunks=chunks, qrels=qrels)


Gather = Callable[[dict[int, Rows]], list[dict[int, Rows]]]
"""Every rank's encoded chunks, on rank 0 (the other ranks get []); one process: ``lambda mine:
[mine]``."""


def encode_share(
    model: SparseEncoder,
    dev: DevSet,
    lengths: tuple[int, int],
    precision: str,
    rank: int,
    world: int,
) -> dict[int, Rows]:
    """This rank's chunks (every ``world``-th), encoded as the evaluate job's encoder pool encodes a
    staged file."""
    query_length, doc_length = lengths
    mine: dict[int, Rows] = {}
    for number in range(rank, len(dev.chunks), world):
        chunk = dev.chunks[number]
        set_max_length(model, query_length if chunk.role == "query" else doc_length)
        mine[number] = encode_texts(model, chunk.texts, ENCODE_BATCH, chunk.role, None, precision)
    return mine


def score_queries(
    dev: DevSet, encoded: dict[int, Rows], top_k: int = TOP_K
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """nDCG@10 over ``dev.qrels`` and the mean active dimensions, from every chunk's rows, and the
    per-query measures they average (ir-measures' names)."""
    docs, queries = (
        [(dev.chunks[n], encoded[n]) for n in sorted(encoded) if dev.chunks[n].role == role]
        for role in ("document", "query")
    )
    doc_ids, vectors = _rows(docs)
    ranks, sorted_ids = rank_ids(pa.array(doc_ids, pa.string()))
    shard = build_shard(vectors, ranks, int(vectors.indices.max(initial=-1)) + 1)
    qids, qvec = _rows(queries)
    top = _search(shard, qvec, top_k, QUERY_BATCH)
    run = parse_run(run_lines(qids, top, sorted_ids, RUN_TAG))
    per_query = per_query_metrics(dev.qrels, run)
    figures = {
        DEV_PRIMARY: mean_metrics(per_query)["nDCG@10"],
        DEV_DIMS_Q: float(term_counts(qvec.indices, 0).sum() / len(qids)) if qids else 0.0,
        DEV_DIMS_D: float(term_counts(vectors.indices, 0).sum() / len(doc_ids)),
    }
    return figures, per_query


def evaluate_dev(
    model: SparseEncoder,
    dev: DevSet,
    lengths: tuple[int, int],
    precision: str,
    rank: int,
    world: int,
    gather: Gather,
) -> dict[str, float] | None:
    """Encode this rank's share, gather on rank 0 and score there: the figures on rank 0, None
    elsewhere."""
    parts = gather(encode_share(model, dev, lengths, precision, rank, world))
    if rank != 0:
        return None
    return score_queries(dev, {n: rows for part in parts for n, rows in part.items()})[0]


def _rows(chunks: Sequence[tuple[DevChunk, Rows]]) -> tuple[list[str], SparseBatch]:
    """The ids and CSR rows of chunks, in order (through the same Arrow table the evaluate job
    writes)."""
    ids = [i for chunk, _ in chunks for i in chunk.ids]
    indices = [row for _, rows in chunks for row in rows[0]]
    values = [row for _, rows in chunks for row in rows[1]]
    return ids, sparse_batch(sparse_table(ids, indices, values))


def _search(shard: Shard, queries: SparseBatch, k: int, batch: int) -> TopK:
    """The evaluate job's search on one shard: query batches, each shard's top-k merged (a merge of
    one)."""
    parts = [
        merge_topk([shard_topk(shard, queries.slice(i, min(i + batch, queries.rows)), k)], k)
        for i in range(0, queries.rows, batch)
    ]
    return concat_topk(parts, k)
