"""The fine-tuning job's frozen config: InfoNCE + FLOPs on a SparseEncoder, batch 64, lr 2e-5, 1 epoch."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Literal

from sembridge_ray.config import Config
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
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    resources: ResourceConfig = field(default_factory=ResourceConfig)

    def validate(self) -> None:
        """Raise :class:`InputError` naming the first missing or impossible setting."""
        for name in ("model", "train", "output"):
            if not getattr(self, name):
                raise InputError(f"--{name} is required")
        positive = {"optim.batch_size": self.optim.batch_size, "optim.epochs": self.optim.epochs,
                    "checkpoint_every": self.checkpoint_every, "log_every": self.log_every,
                    "keep_checkpoints": self.keep_checkpoints, "max_query_length": self.max_query_length,
                    "max_doc_length": self.max_doc_length}
        if self.optim.max_steps is not None:
            positive["optim.max_steps"] = self.optim.max_steps
        for key, value in positive.items():
            if value < 1:
                raise InputError(f"{key} must be at least 1, got {value}")


# Settings that change nothing a run computes: a rerun that differs only in these resumes the same run.
_NOT_TRAJECTORY = ("output", "storage", "checkpoint_every", "keep_checkpoints", "max_failures", "log_every",
                   "report_every_s", "resources")


def run_name(cfg: FinetuneConfig) -> str:
    """The Ray Train run name: a digest of every setting that shapes the trajectory (same command = same run)."""
    data = {k: v for k, v in cfg.to_dict().items() if k not in _NOT_TRAJECTORY}
    return "finetune-" + hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def plan_steps(rows: int, batch_size: int, epochs: int, max_steps: int | None) -> tuple[int, int]:
    """(steps per epoch, total steps): full global batches only; ``max_steps`` caps the total."""
    per_epoch = rows // batch_size
    total = per_epoch * epochs
    return per_epoch, total if max_steps is None else min(total, max_steps)
