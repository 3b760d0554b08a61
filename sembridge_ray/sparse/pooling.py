"""SPLADE pooling: max over tokens of log(1 + relu(MLM logits)), plainly or in sequence chunks with recomputation.

The B × T × V logits are the memory cost of SPLADE training (64 × 256 × 30,522 fp32 is 2 GB, and autograd keeps
several tensors of that size). :func:`splade_pool_chunked` runs the MLM head on T/chunk slices of the hidden states
under ``torch.utils.checkpoint``, keeping only each slice's (B, V) maximum; backward recomputes one slice's logits at
a time. Values and gradients equal :func:`splade_pool` over the full logits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

Head = Callable[[torch.Tensor], torch.Tensor]


def splade_activation(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """logits (B, T, V), mask (B, T) -> log(1 + relu(logits)) with padded positions zeroed, (B, T, V).

    The mask is applied before the relu, as sentence-transformers' ``SpladePooling`` does.
    """
    return torch.log1p(torch.relu(logits * mask.unsqueeze(-1).to(logits.dtype)))


def splade_pool(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """splade_pool(logits (B, T, V), mask (B, T)) -> (B, V): max over tokens of log(1 + relu(logits))."""
    # torch.max (not amax) routes each gradient to one token, as sentence-transformers' SpladePooling does.
    return torch.max(splade_activation(logits, mask), dim=1).values


def _pool_slice(hidden: torch.Tensor, mask: torch.Tensor, head: Head) -> torch.Tensor:
    return splade_pool(head(hidden), mask)


def splade_pool_chunked(hidden: torch.Tensor, mask: torch.Tensor, head: Head, chunk: int) -> torch.Tensor:
    """hidden (B, T, H), mask (B, T), head: (B, t, H) -> (B, t, V)  ->  (B, V) = splade_pool(head(hidden), mask).

    At most one (B, chunk, V) slice of logits (and its activations) is alive at a time, in forward and in backward.
    ``chunk <= 0`` or ``chunk >= T`` runs the head once on the whole sequence (the plain path).
    """
    seq = hidden.shape[1]
    if chunk <= 0 or chunk >= seq:
        return splade_pool(head(hidden), mask)
    pooled: torch.Tensor | None = None
    for start in range(0, seq, chunk):
        part = checkpoint(
            _pool_slice, hidden[:, start : start + chunk], mask[:, start : start + chunk], head, use_reentrant=False
        )  # non-reentrant: composes with DDP hooks and autocast
        # Ties across slices can only happen at 0, where relu passes no gradient, so maximum's split is moot.
        pooled = part if pooled is None else torch.maximum(pooled, part)
    assert pooled is not None
    return pooled
