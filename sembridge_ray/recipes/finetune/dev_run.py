"""A Ray Train worker's development evaluation during fine-tuning: the trained weights scored as the
written model would be, every rank's share gathered on rank 0, and the best weights kept there."""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
import torch.distributed as dist

from sembridge_ray.recipes.finetune.config import FinetuneConfig
from sembridge_ray.recipes.finetune.final_model import serving
from sembridge_ray.retrieval.dev import DevSet, Rows, evaluate_dev
from sembridge_ray.runtime.progress import duration
from sembridge_ray.sparse.checkpoints import BestState
from sembridge_ray.sparse.convergence import DEV_DIMS_D, DEV_DIMS_Q, DEV_PRIMARY, collapse
from sembridge_ray.sparse.model import SpladeEncoder, load_sparse_encoder, save_sparse_encoder

if TYPE_CHECKING:
    from sentence_transformers import SparseEncoder
    from transformers import PreTrainedTokenizerBase

# the job's logger, whichever module of it logs
log = logging.getLogger("sembridge_ray.recipes.finetune.run")


@dataclass(kw_only=True)
class DevRun:
    """A worker's development evaluation: a SparseEncoder written and loaded as the final model is
    (so its vectors are the evaluate job's), given the trained weights before each evaluation; rank
    0 also keeps the best weights that are not collapsed."""

    dev: DevSet
    encoder: SpladeEncoder
    model: SparseEncoder
    cfg: FinetuneConfig
    rank: int
    world: int
    best: BestState | None = None

    @classmethod
    def start(
        cls,
        dev: DevSet,
        cfg: FinetuneConfig,
        encoder: SpladeEncoder,
        tokenizer: PreTrainedTokenizerBase,
        rank: int,
        world: int,
        device: str,
        best: BestState | None,
    ) -> DevRun:
        # Rank 0 writes the directory (transformers saves on rank 0 only in a process group) and
        # sends its files to the other ranks, which may be on other nodes.
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "model"
            files: dict[str, bytes] | None = None
            if rank == 0:
                save_sparse_encoder(encoder.mlm, tokenizer, root, serving(cfg))
                files = {
                    str(f.relative_to(root)): f.read_bytes() for f in root.rglob("*") if f.is_file()
                }
            if world > 1:
                box = [files]
                dist.broadcast_object_list(box, src=0)
                for name, data in (box[0] or {}).items() if rank != 0 else ():
                    (root / name).parent.mkdir(parents=True, exist_ok=True)
                    (root / name).write_bytes(data)
            model = load_sparse_encoder(
                str(root), device=device, trust_remote_code=cfg.trust_remote_code
            )
        return cls(
            dev=dev, encoder=encoder, model=model, cfg=cfg, rank=rank, world=world, best=best
        )

    def evaluate(self, step: int) -> dict[str, float]:
        """The dev figures of the current weights (every rank gets rank 0's), and the best kept on
        rank 0."""
        began = time.perf_counter()
        transformer = next(m for m in self.model if hasattr(m, "auto_model"))
        cast(torch.nn.Module, transformer.auto_model).load_state_dict(self.encoder.mlm.state_dict())
        lengths = (self.cfg.query_length, self.cfg.document_length)  # the written model's
        found = evaluate_dev(
            self.model, self.dev, lengths, self.cfg.precision, self.rank, self.world, self._gather
        )
        figures = self._broadcast(found)
        figures["dev_seconds"] = round(time.perf_counter() - began, 3)
        if self.rank == 0:
            self._keep(step, figures)
        return figures

    def _keep(self, step: int, figures: dict[str, float]) -> None:
        vocab_size = int(self.encoder.mlm.config.vocab_size)
        problem = collapse(figures[DEV_DIMS_Q], figures[DEV_DIMS_D], vocab_size)
        score = figures[DEV_PRIMARY]
        if problem is not None:
            log.warning(
                "step %d: the model collapsed (%s); never selected as the best", step, problem
            )
        elif self.best is None or score > self.best["score"]:
            weights = {
                k: v.detach().to("cpu", copy=True) for k, v in self.encoder.state_dict().items()
            }
            self.best = {"step": step, "score": score, "model": weights}
        log.info(
            "step %d: dev nDCG@10 %.4f, dims q %.1f d %.1f (best %.4f at step %s) in %s",
            step,
            score,
            figures[DEV_DIMS_Q],
            figures[DEV_DIMS_D],
            self.best["score"] if self.best else float("nan"),
            self.best["step"] if self.best else "-",
            duration(figures["dev_seconds"]),
        )

    def _gather(self, mine: dict[int, Rows]) -> list[dict[int, Rows]]:
        if self.world == 1:
            return [mine]
        parts: list[dict[int, Rows]] | None = (
            [{} for _ in range(self.world)] if self.rank == 0 else None
        )
        dist.gather_object(mine, parts, dst=0)
        return parts or []

    def _broadcast(self, figures: dict[str, float] | None) -> dict[str, float]:
        box = [figures]
        if self.world > 1:
            dist.broadcast_object_list(box, src=0)
        assert box[0] is not None
        return dict(box[0])
