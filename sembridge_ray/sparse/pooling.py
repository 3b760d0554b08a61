"""SPLADE pooling: max over tokens of log(1 + relu(MLM logits)); plainly, with a sparse-gradient
autograd function, or in sequence chunks with recomputation (for heads that cannot be split).

The B × T × V logits are the memory cost of SPLADE training (64 × 256 × 30,522 fp32 is 2 GB, and
autograd keeps several tensors of that size). Max pooling has a sparse gradient: only the argmax
token of each (example, term) receives one. :func:`splade_max_pool` exploits that. Its forward runs
the vocabulary projection without autograd (in token slices when a memory budget asks for it) and
keeps only the (B, V) maxima and their positions; its backward builds the sparse (B·T, V) gradient
of the logits and multiplies it into the projection's weight and input (two sparse × dense products:
nnz · H multiply-adds instead of the dense head's B · T · V · H). :func:`splade_pool_chunked` is the
older route (``torch.utils.checkpoint`` per slice: backward recomputes every slice's logits and runs
the dense head backward); it stays for heads :func:`split_head` does not know."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from sembridge_ray.sparse.csr import csr_from_entries

Head = Callable[[torch.Tensor], torch.Tensor]

POOL_BUDGET_BYTES = 256 << 20
"""Logits held at once by :func:`splade_max_pool` when no slice length is given: 32 docs × 256
tokens × 30,522 terms in fp32 is 1 GB, so such a batch runs in 4 slices; a query batch of 32 × 64
tokens runs whole."""


def splade_activation(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """logits (B, T, V), mask (B, T) -> (B, T, V) log(1 + relu(logits)), padded positions zeroed.

    The mask is applied before the relu, as sentence-transformers' ``SpladePooling`` does.
    """
    return torch.log1p(torch.relu(logits * mask.unsqueeze(-1).to(logits.dtype)))


def splade_pool(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """logits (B, T, V), mask (B, T) -> (B, V): max over tokens of log(1 + relu(logits))."""
    # torch.max (not amax) routes each gradient to one token, as sentence-transformers'
    # SpladePooling does.
    return torch.max(splade_activation(logits, mask), dim=1).values


def slice_tokens(
    batch: int, seq: int, vocab: int, itemsize: int, budget: int = POOL_BUDGET_BYTES
) -> int:
    """Tokens per slice so that one (batch, slice, vocab) logits buffer fits ``budget`` bytes (at
    least 1)."""
    return max(1, min(seq, budget // max(1, batch * vocab * itemsize)))


class SpladeMaxPool(torch.autograd.Function):
    """(feats (B, T, H), weight (V, H), bias (V,) | None, mask (B, T), chunk) -> (B, V) SPLADE max
    pooling of ``feats @ weight.T + bias``; saves only the argmax positions and the relu'd logits
    there, (B, V) each."""

    @staticmethod
    def forward(
        ctx: Any,
        feats: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        mask: torch.Tensor,
        chunk: int,
    ) -> torch.Tensor:
        batch, seq, _ = feats.shape
        step = chunk if chunk > 0 else slice_tokens(batch, seq, len(weight), feats.element_size())
        for start in range(0, seq, step):
            # (B, t, V), no graph: inside forward
            logits = F.linear(feats[:, start : start + step], weight, bias)
            # relu(mask · logits) in place: the max of log1p(relu(x)) is log1p of the max of relu(x)
            logits.mul_(mask[:, start : start + step, None].to(logits.dtype)).clamp_(min=0)
            # the first position among equal values, as torch.max over all T
            value, pos = logits.max(dim=1)
            if start == 0:
                best, where = value, pos
            else:  # strictly greater: an earlier slice keeps a tie, as one max over all T would
                later = value > best
                best = torch.where(later, value, best)
                where = torch.where(later, pos + start, where)
        ctx.save_for_backward(feats, weight, where, best)
        ctx.has_bias = bias is not None
        return torch.log1p(best)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        feats, weight, where, best = ctx.saved_tensors
        batch, seq, hidden = feats.shape
        dtype = weight.dtype
        # d log1p(relu(x)) / dx = 1 / (1 + x) where x > 0, else 0 (as autograd's relu at 0)
        coef = torch.where(best > 0, grad / (1 + best), 0.0)
        b, v = coef.nonzero(as_tuple=True)  # (b, v) ascending: b-major
        values = coef[b, v].to(dtype)
        # (nnz,) the token row of each entry in the flattened (B·T, V) gradient
        rows = b * seq + where[b, v]
        grad_feats = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:  # (B·T, V): token-major, terms ascending within a token
            grad_logits = csr_from_entries(rows, v, values, batch * seq, weight.shape[0])
            grad_feats = (grad_logits @ weight).view(batch, seq, hidden).to(feats.dtype)
        if ctx.needs_input_grad[1]:  # (V, B·T): term-major, rows ascending within a term
            grad_logits_t = csr_from_entries(v, rows, values, weight.shape[0], batch * seq)
            grad_weight = grad_logits_t @ feats.reshape(batch * seq, hidden).to(dtype)  # (V, H)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = coef.sum(dim=0).to(dtype)
        return grad_feats, grad_weight, grad_bias, None, None


def splade_max_pool(
    feats: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    mask: torch.Tensor,
    chunk: int = 0,
) -> torch.Tensor:
    """feats (B, T, H), weight (V, H), bias (V,) | None, mask (B, T) -> (B, V) = splade_pool(feats @
    W.T + b, mask).

    Values equal :func:`splade_pool`; so do the gradients (to feats, weight and bias), with ties
    between tokens going to the first position. ``chunk`` > 0 projects that many tokens at a time; 0
    sizes slices to :data:`POOL_BUDGET_BYTES` (the whole sequence when it fits)."""
    return cast(torch.Tensor, SpladeMaxPool.apply(feats, weight, bias, mask, chunk))  # type: ignore[no-untyped-call]


def splade_pool_chunked(
    hidden: torch.Tensor, mask: torch.Tensor, head: Head, chunk: int
) -> torch.Tensor:
    """hidden (B, T, H), mask (B, T), head: (B, t, H) -> (B, t, V)  ->  (B, V) =
    splade_pool(head(hidden), mask).

    At most one (B, chunk, V) slice of logits (and its activations) is alive at a time, in forward
    and in backward. ``chunk <= 0`` or ``chunk >= T`` runs the head once on the whole sequence (the
    plain path)."""
    seq = hidden.shape[1]
    if chunk <= 0 or chunk >= seq:
        return splade_pool(head(hidden), mask)
    parts: Iterator[torch.Tensor] = (
        checkpoint(  # non-reentrant: composes with DDP hooks and autocast
            lambda h, m: splade_pool(head(h), m),
            hidden[:, start : start + chunk],
            mask[:, start : start + chunk],
            use_reentrant=False,
        )
        for start in range(0, seq, chunk)
    )
    # Ties across slices can only happen at 0, where relu passes no gradient, so maximum's split is
    # moot.
    return functools.reduce(torch.maximum, parts)
