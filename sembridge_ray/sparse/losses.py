"""The SPLADE training objective: InfoNCE with in-batch (and optional hard) negatives plus FLOPs regularisation.

Documents and queries are all-gathered across workers, so the negative pool of every query is the global batch and
FLOPs is taken over the global batch: N workers compute exactly the loss and gradients of one process on the
global batch (DDP averages the gradients; the gather's backward returns every worker's gradient to each shard).
Values equal sentence-transformers' ``SpladeLoss(SparseMultipleNegativesRankingLoss(scale, dot), FlopsLoss)``
on one process (``tests/unit/test_sparse_losses.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sembridge_ray.sparse.collective import Collective, LocalCollective
from sembridge_ray.sparse.regularizers import active_dims, anti_collapse, flops


def infonce(queries: torch.Tensor, docs: Sequence[torch.Tensor], offset: int = 0, scale: float = 1.0) -> torch.Tensor:
    """queries (b, V), docs [positives (B, V), negatives_1 (B, V), …], offset -> scalar cross-entropy.

    Query i's positive is row ``offset + i`` of ``docs[0]``; every other row of every ``docs`` tensor is a negative.
    Scores are dot products times ``scale`` (1 for SPLADE). With ``b == B`` and ``offset == 0`` this is the
    single-process in-batch loss; a worker passes its local queries, the gathered documents and its rank · b.
    """
    candidates = torch.cat(list(docs), dim=0)  # (B · (1 + k), V)
    scores = scale * queries @ candidates.T  # (b, B · (1 + k))
    labels = torch.arange(offset, offset + queries.shape[0], device=queries.device)
    return F.cross_entropy(scores, labels)


@dataclass(frozen=True, kw_only=True)
class LossWeights:
    """The weights of one step (after the warm-up schedule)."""

    lambda_q: float
    lambda_d: float
    anti_collapse: float = 0.0
    scale: float = 1.0
    """Multiplies InfoNCE's dot products (``LossConfig.scale``; sentence-transformers' ``scale``)."""


def splade_objective(
    queries: torch.Tensor, docs: Sequence[torch.Tensor], weights: LossWeights, comm: Collective | None = None
) -> dict[str, torch.Tensor]:
    """queries (b, V), docs [positives (b, V), negatives… (b, V)] on this worker -> loss parts (scalars).

    ``loss`` = infonce + λq · flops_q + λd · flops_d [+ w · anti_collapse]; flops_d covers positives and hard
    negatives together, as ``SpladeLoss`` does. ``infonce`` is this worker's share (its queries); the other parts
    are global, as are ``active_dims_q``/``active_dims_d`` (mean non-zeros per vector; no gradient).
    """
    comm = comm or LocalCollective()
    all_q = comm.gather(queries)
    all_docs = [comm.gather(d) for d in docs]
    doc_pool = torch.cat(all_docs, dim=0)
    parts = {
        "infonce": infonce(queries, all_docs, offset=comm.rank * queries.shape[0], scale=weights.scale),
        "flops_q": flops(all_q),
        "flops_d": flops(doc_pool),
    }
    loss = parts["infonce"] + weights.lambda_q * parts["flops_q"] + weights.lambda_d * parts["flops_d"]
    if weights.anti_collapse > 0:
        parts["anti_collapse"] = anti_collapse(all_q, doc_pool)
        loss = loss + weights.anti_collapse * parts["anti_collapse"]
    return {"loss": loss, **parts, "active_dims_q": active_dims(all_q), "active_dims_d": active_dims(doc_pool)}
