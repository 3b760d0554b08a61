"""The fine-tuning job's frozen config: InfoNCE + FLOPs on a SparseEncoder, batch 64, lr 2e-5, 1 epoch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from sembridge_ray.config import Config, require
from sembridge_ray.errors import InputError
from sembridge_ray.placement import ResourceConfig


@dataclass(frozen=True)
class OptimConfig(Config):
    """AdamW with a linear warm-up then linear decay; the batch is global (split across workers)."""

    lr: float = 2e-5
    warmup_ratio: float = 0.1
    """Fraction of the steps with a linear learning-rate warm-up (then linear decay to 0)."""
    weight_decay: float = 0.0
    clip_norm: float = 1.0
    """Gradient clipping (global L2 norm); 0 disables it."""
    batch_size: int = 64
    """Global batch: each of N workers takes batch_size / N pairs; in-batch negatives span all of them."""
    epochs: int = 1
    max_steps: int | None = None
    """Caps the number of optimiser steps (None = epochs × pairs // batch_size)."""
    bf16: Literal["auto", "on", "off"] = "auto"
    """bf16 autocast: auto = on a CUDA device that supports it; the loss itself is always fp32."""

    def check(self) -> None:
        require(self.lr > 0, "lr", self.lr, "must be > 0")
        require(0 <= self.warmup_ratio < 1, "warmup_ratio", self.warmup_ratio, "must be in [0, 1)")
        require(self.weight_decay >= 0, "weight_decay", self.weight_decay, "must be >= 0")
        require(self.clip_norm >= 0, "clip_norm", self.clip_norm, "must be >= 0 (0 = off)")
        require(self.batch_size >= 1, "batch_size", self.batch_size, "must be >= 1")
        require(self.epochs >= 1, "epochs", self.epochs, "must be >= 1")
        require(self.max_steps is None or self.max_steps >= 1, "max_steps", self.max_steps, "must be >= 1 or null")


@dataclass(frozen=True)
class LossConfig(Config):
    """InfoNCE (dot product, scale 1, in-batch + optional hard negatives) + λ-weighted FLOPs."""

    lambda_q: float = 5e-5
    lambda_d: float = 3e-5
    flops_warmup: float = 1 / 3
    """λq and λd grow quadratically from 0 over this fraction of the steps."""
    anti_collapse: float = 0.0
    """Weight of (1/Σq)² + (1/Σd)² (0 = off); for freshly swapped vocabularies whose vectors empty out."""
    scale: float = 1.0

    def check(self) -> None:
        for key in ("lambda_q", "lambda_d", "anti_collapse"):
            require(getattr(self, key) >= 0, key, getattr(self, key), "must be >= 0")
        require(0 <= self.flops_warmup <= 1, "flops_warmup", self.flops_warmup, "must be in [0, 1]")
        require(self.scale > 0, "scale", self.scale, "must be > 0")


@dataclass(frozen=True)
class FinetuneConfig(Config):
    """Fine-tune a SparseEncoder directory on a retrieval training set with Ray Train (DDP)."""

    model: str = ""
    """SparseEncoder / masked-LM directory (as written by the init job)."""
    train: str = ""
    """webfaq:<lang>, miracl:<lang>[@MIRROR], a BEIR directory, or a .parquet file of pairs."""
    output: str = ""
    """Output directory: the fine-tuned SparseEncoder, metrics.jsonl, config.yaml, checkpoints/, _SUCCESS."""
    split: str = "train"
    hard_negatives: int = 0
    """Judged non-relevant documents per query used as extra negatives (0 = in-batch negatives only)."""
    max_query_length: int = 64
    max_doc_length: int = 256
    pool_chunk: int = 32
    """Tokens per slice of the chunked SPLADE pooling (0 = whole sequence at once: more memory)."""
    seed: int = 0
    """Seeds the pair order (one permutation per epoch) and dropout."""
    checkpoint_every: int = 500
    """Checkpoint every K steps (and at the end)."""
    keep_checkpoints: int = 2
    storage: str = ""
    """Where checkpoints go: a path or a URI Ray supports (s3://, gs://); empty = <output>/checkpoints."""
    max_failures: int = 3
    """Worker-group restarts from the latest checkpoint before the run fails."""
    log_every: int = 10
    report_every_s: float = 10.0
    """Least seconds between metric reports to Ray Train on logged steps (checkpoint steps always report). Ray
    Train V2 takes in one report per 2 s health check, and a faster report blocks the training step until then."""
    overwrite: bool = False
    """Replace an output written with other settings (otherwise such a rerun is refused)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    resources: ResourceConfig = field(default_factory=ResourceConfig)

    # Identified by content (inputs), or changing nothing a run computes: a rerun that differs only in these
    # resumes the same run.
    NOT_IDENTITY: ClassVar[tuple[str, ...]] = (
        "model", "train", "output", "storage", "checkpoint_every", "keep_checkpoints", "max_failures",
        "report_every_s", "overwrite", "resources",
    )

    def check(self) -> None:
        for key in ("max_query_length", "max_doc_length", "checkpoint_every", "log_every", "keep_checkpoints"):
            require(getattr(self, key) >= 1, key, getattr(self, key), "must be >= 1")
        for key in ("hard_negatives", "pool_chunk", "max_failures", "report_every_s"):
            require(getattr(self, key) >= 0, key, getattr(self, key), "must be >= 0")

    def require_inputs(self) -> None:
        """Raise :class:`InputError` naming the first required setting that is missing."""
        for name in ("model", "train", "output"):
            if not getattr(self, name):
                raise InputError(f"--{name} is required")


def plan_steps(rows: int, batch_size: int, epochs: int, max_steps: int | None) -> tuple[int, int]:
    """(steps per epoch, total steps): full global batches only; ``max_steps`` caps the total."""
    per_epoch = rows // batch_size
    total = per_epoch * epochs
    return per_epoch, total if max_steps is None else min(total, max_steps)
