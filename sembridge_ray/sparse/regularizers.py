"""Sparsity regularisers for SPLADE training and their schedules (pure functions on tensors).

FLOPs (Paria et al., 2020) is Σ_v (mean_b |w_bv|)²: the expected number of multiplications of a
sparse dot product, relaxed. Its weight λ grows quadratically over the first part of training
(SPLADE's warm-up), so the contrastive term shapes the vectors before sparsity pressure reaches full
strength."""

from __future__ import annotations

import torch

# Keeps anti_collapse finite when every weight of a side is exactly 0 (a collapsed encoder).
ANTI_COLLAPSE_EPS = 1e-6


def flops(reps: torch.Tensor) -> torch.Tensor:
    """flops(reps (N, V)) -> scalar Σ_v (mean_n |reps_nv|)², for SPLADE vectors (reps >= 0).

    SPLADE weights are log(1 + relu(·)) >= 0, so |w| = w. Leaving the abs out keeps the gradient at
    exact zeros equal to sentence-transformers' ``FlopsLoss`` (abs would zero it; relu passes none
    there either way)."""
    return torch.sum(torch.mean(reps, dim=0) ** 2)


def quadratic_warmup(step: int, total_steps: int, fraction: float = 1 / 3) -> float:
    """Weight multiplier at 1-based ``step``: (step / (fraction · total_steps))², capped at 1.

    It reaches 1 at the end of the first ``fraction`` of training; ``fraction <= 0`` disables the
    warm-up."""
    span = fraction * total_steps
    return 1.0 if span <= 0 else min(1.0, (step / span) ** 2)


def anti_collapse(q_reps: torch.Tensor, d_reps: torch.Tensor) -> torch.Tensor:
    """q_reps (Nq, V), d_reps (Nd, V) -> scalar (1/Σq)² + (1/Σd)².

    Σq is the mean L1 mass of a query vector (Σ_v |w_qv| averaged over queries), Σd the same for
    documents. The term is large only when a side's vectors are nearly empty, which FLOPs can cause
    in a freshly swapped vocabulary."""
    mass_q = torch.abs(q_reps).sum(dim=1).mean()
    mass_d = torch.abs(d_reps).sum(dim=1).mean()
    return (1.0 / (mass_q + ANTI_COLLAPSE_EPS)) ** 2 + (1.0 / (mass_d + ANTI_COLLAPSE_EPS)) ** 2


@torch.no_grad()
def active_dims(reps: torch.Tensor) -> torch.Tensor:
    """reps (N, V) -> scalar: the mean number of non-zero dimensions per row."""
    return (reps != 0).sum(dim=1).float().mean()
