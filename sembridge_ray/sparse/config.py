"""The sections of a fine-tuning config the training loop reads: the optimiser and its schedule, the
loss."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sembridge_ray.runtime.config import Config, require


@dataclass(frozen=True, kw_only=True)
class OptimConfig(Config):
    """AdamW with a linear warm-up then linear decay; the batch is global (split across workers)."""

    lr: float = 2e-5
    """Peak learning rate of AdamW."""
    warmup_ratio: float = 0.1
    """Fraction of the steps with a linear learning-rate warm-up (then linear decay to 0)."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay."""
    clip_norm: float = 1.0
    """Gradient clipping (global L2 norm); 0 disables it."""
    batch_size: int = 64
    """GLOBAL batch (all workers together, not per device): each of N workers takes batch_size / N
    pairs, and in-batch negatives span all of them."""
    epochs: int = 1
    """Passes over the training pairs (one permutation each, seeded)."""
    max_steps: int | None = None
    """Caps the number of optimiser steps (None = epochs × pairs // batch_size)."""
    embedding_warmup_steps: int = 0
    """The first K steps train only the vocabulary-sized parameters (input and output embeddings,
    decoder bias), at ``lr × embedding_warmup_lr_scale``, the rest frozen; then every parameter
    trains on the usual warm-up and decay over the remaining steps (TokAlign's first stage, for
    freshly swapped vocabularies). 0 = off."""
    embedding_warmup_lr_scale: float = 10.0
    """With ``embedding_warmup_steps``: the vocabulary parameters' learning rate during it, as a
    multiple of lr."""

    def check(self) -> None:
        warm_lr = self.lr * self.embedding_warmup_lr_scale
        for key, ok, rule in (  # checked in this order: the first broken rule is the error
            ("lr", self.lr > 0, "must be > 0"),
            ("lr", self.lr <= 1, "must be <= 1 (AdamW diverges at once beyond)"),
            ("warmup_ratio", 0 <= self.warmup_ratio < 1, "must be in [0, 1)"),
            ("weight_decay", self.weight_decay >= 0, "must be >= 0"),
            ("clip_norm", self.clip_norm >= 0, "must be >= 0 (0 = off)"),
            ("batch_size", self.batch_size >= 1, "must be >= 1"),
            ("epochs", self.epochs >= 1, "must be >= 1"),
            ("max_steps", self.max_steps is None or self.max_steps >= 1, "must be >= 1 or null"),
            ("embedding_warmup_steps", self.embedding_warmup_steps >= 0, "must be >= 0"),
            ("embedding_warmup_lr_scale", self.embedding_warmup_lr_scale > 0, "must be > 0"),
            (
                "embedding_warmup_lr_scale",
                not self.embedding_warmup_steps or warm_lr <= 1,
                f"with lr {self.lr:g} the warm-up's learning rate is {warm_lr:g}; lr x scale must be <= 1, as lr alone",
            ),
        ):
            require(ok, key, getattr(self, key), rule)


RankingName = Literal["infonce", "infonce_symmetric"]
"""The ranking losses of ``sparse.losses.RANKING_LOSSES`` (a test keeps the lists equal)."""
RANKING_LABELS: dict[str, str] = {"infonce": "InfoNCE", "infonce_symmetric": "symmetric InfoNCE"}
"""How a model card names each ranking loss."""


@dataclass(frozen=True, kw_only=True)
class LossConfig(Config):
    """A ranking loss (InfoNCE: dot product, scale 1, in-batch + optional hard negatives) +
    λ-weighted FLOPs."""

    ranking: RankingName = "infonce"
    """The ranking loss: ``infonce`` (query -> documents, SPLADE's), or ``infonce_symmetric`` (one
    softmax over query -> documents and document -> queries, sentence-transformers'
    ``SparseMultipleNegativesRankingLoss`` with ``directions=("query_to_doc", "doc_to_query")``)."""

    lambda_q: float = 5e-5
    """Weight of the FLOPs regulariser on queries."""
    lambda_d: float = 3e-5
    """Weight of the FLOPs regulariser on documents."""
    flops_warmup: float = 1 / 3
    """λq and λd grow quadratically from 0 over this fraction of the steps."""
    anti_collapse: float = 0.0
    """Weight of (1/Σq)² + (1/Σd)² (0 = off); for freshly swapped vocabularies whose vectors empty
    out."""
    scale: float = 1.0
    """Multiplies the dot products in InfoNCE (1 = plain dot product, as SPLADE)."""

    def check(self) -> None:
        for key in ("lambda_q", "lambda_d", "anti_collapse"):
            require(getattr(self, key) >= 0, key, getattr(self, key), "must be >= 0")
        require(0 <= self.flops_warmup <= 1, "flops_warmup", self.flops_warmup, "must be in [0, 1]")
        require(self.scale > 0, "scale", self.scale, "must be > 0")
