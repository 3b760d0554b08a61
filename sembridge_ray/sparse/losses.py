"""The SPLADE training objective: InfoNCE with in-batch (and optional hard) negatives plus FLOPs
regularisation.

Documents and queries are all-gathered across workers, so the negative pool of every query is the
global batch and FLOPs is taken over the global batch: N workers compute exactly the loss and
gradients of one process on the global batch (DDP averages the gradients; the gather's backward
returns every worker's gradient to each shard). Values equal sentence-transformers'
``SpladeLoss(SparseMultipleNegativesRankingLoss(scale, dot), FlopsLoss)`` on one process
(``tests/unit/test_sparse_losses.py``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sembridge_ray.sparse.collective import Collective, LocalCollective
from sembridge_ray.sparse.regularizers import active_dims, anti_collapse, flops


def infonce(
    queries: torch.Tensor, docs: Sequence[torch.Tensor], offset: int = 0, scale: float = 1.0
) -> torch.Tensor:
    """queries (b, V), docs [positives (B, V), negatives_1 (B, V), …], offset -> scalar loss.

    Query i's positive is row ``offset + i`` of ``docs[0]``; every other row of every ``docs``
    tensor is a negative. Scores are dot products times ``scale`` (1 for SPLADE). With ``b == B``
    and ``offset == 0`` this is the single-process in-batch loss; a worker passes its local queries,
    the gathered documents and its rank · b."""
    candidates = torch.cat(list(docs), dim=0)  # (B · (1 + k), V)
    scores = scale * queries @ candidates.T  # (b, B · (1 + k))
    labels = torch.arange(offset, offset + queries.shape[0], device=queries.device)
    return F.cross_entropy(scores, labels)


@dataclass(frozen=True, kw_only=True)
class RankingBatch:
    """What a ranking loss sees on one worker: its queries, every worker's queries and documents,
    its offset."""

    queries: torch.Tensor
    """(b, V): this worker's queries."""
    all_queries: torch.Tensor
    """(B, V): every worker's queries, in rank order."""
    docs: list[torch.Tensor]
    """[positives (B, V), negatives_1 (B, V), ...]: every worker's documents."""
    offset: int
    """Row of this worker's first query in ``all_queries`` (rank · b)."""
    scale: float


def symmetric_infonce(batch: RankingBatch) -> torch.Tensor:
    """One softmax per query over its scores to every document *and* its positive's scores to every
    query, as sentence-transformers'
    ``SparseMultipleNegativesRankingLoss(directions=("query_to_doc", "doc_to_query"))``
    (``partition_mode="joint"``): the positive is scored from the query side."""
    rows = torch.arange(batch.queries.shape[0], device=batch.queries.device)
    local = rows + batch.offset
    to_docs = batch.scale * batch.queries @ torch.cat(batch.docs, dim=0).T  # (b, B · (1 + k))
    to_queries = batch.scale * (batch.docs[0][local] @ batch.all_queries.T)  # (b, B)
    log_z = torch.logsumexp(torch.cat([to_docs, to_queries], dim=1), dim=1)
    return -(to_docs[rows, local] - log_z).mean()


RANKING_LOSSES: dict[str, Callable[[RankingBatch], torch.Tensor]] = {
    "infonce": lambda b: infonce(b.queries, b.docs, b.offset, b.scale),
    "infonce_symmetric": symmetric_infonce,
}
"""The ranking losses by name (``LossConfig.ranking``). The objective returns the loss under its
name, and the log and the job's report print it under that name: a new loss is one entry here plus
its name and label in ``sparse.config.RANKING_LABELS``."""


@dataclass(frozen=True, kw_only=True)
class LossWeights:
    """The weights of one step (after the warm-up schedule)."""

    lambda_q: float
    lambda_d: float
    anti_collapse: float = 0.0
    scale: float = 1.0
    """Multiplies InfoNCE's dot products (``LossConfig.scale``, sentence-transformers' ``scale``)."""
    ranking: str = "infonce"
    """A :data:`RANKING_LOSSES` name (``LossConfig.ranking``)."""


def splade_objective(
    queries: torch.Tensor,
    docs: Sequence[torch.Tensor],
    weights: LossWeights,
    comm: Collective | None = None,
) -> dict[str, torch.Tensor]:
    """This worker's queries (b, V), docs [positives (b, V), negatives… (b, V)] -> scalar parts.

    ``loss`` = ranking + λq · flops_q + λd · flops_d [+ w · anti_collapse], the ranking loss under
    its :data:`RANKING_LOSSES` name (``infonce``); flops_d covers positives and hard negatives
    together, as ``SpladeLoss`` does. The ranking loss is this worker's share (its queries); the
    other parts are global, as are ``active_dims_q``/``active_dims_d`` (mean non-zeros per vector;
    no gradient)."""
    comm = comm or LocalCollective()
    all_q = comm.gather(queries)
    all_docs = [comm.gather(d) for d in docs]
    doc_pool = torch.cat(all_docs, dim=0)
    batch = RankingBatch(
        queries=queries,
        all_queries=all_q,
        docs=all_docs,
        offset=comm.rank * queries.shape[0],
        scale=weights.scale,
    )
    parts = {
        weights.ranking: RANKING_LOSSES[weights.ranking](batch),
        "flops_q": flops(all_q),
        "flops_d": flops(doc_pool),
    }
    loss = (
        parts[weights.ranking]
        + weights.lambda_q * parts["flops_q"]
        + weights.lambda_d * parts["flops_d"]
    )
    if weights.anti_collapse > 0:
        parts["anti_collapse"] = anti_collapse(all_q, doc_pool)
        loss = loss + weights.anti_collapse * parts["anti_collapse"]
    return {
        "loss": loss,
        **parts,
        "active_dims_q": active_dims(all_q),
        "active_dims_d": active_dims(doc_pool),
    }
