"""The export job's checkpoint export (``--target sentence-transformers``): one fine-tuning
checkpoint written as the SparseEncoder directory the fine-tuning would have published from those
weights. A checkpoint records the fine-tuning's config (``run_config.json``), which says how."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from sembridge_ray.recipes.export.config import ExportConfig, ExportResult
from sembridge_ray.recipes.finetune.config import FinetuneConfig
from sembridge_ray.recipes.finetune.final_model import card_provenance, write_model
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.sparse.checkpoints import RUN_CONFIG, checkpoint_problem, load_best, load_part
from sembridge_ray.sparse.finite import require_finite
from sembridge_ray.sparse.model import load_mlm


def checkpoint_model(
    cfg: ExportConfig, new_output: Path | None = None
) -> Callable[[Path], ExportResult]:
    """Check and read checkpoint ``cfg.checkpoint`` (each refusal one line, before anything is
    written; ``new_output``, when given, must not exist); returns what writes it, as the
    SparseEncoder directory ``jobs.finetune`` would have published from those weights, at a path
    that must not exist."""
    ckpt = Path(cfg.checkpoint)
    if (problem := checkpoint_problem(ckpt)) is not None:
        raise InputError(f"checkpoint {str(ckpt)!r} does not verify: {problem}")
    if not (ckpt / RUN_CONFIG).is_file():
        raise InputError(
            f"checkpoint {str(ckpt)!r} has no {RUN_CONFIG} (written by an older version): rerun to export"
        )
    if new_output is not None and (new_output.exists() or new_output.is_symlink()):
        raise InputError(f"output {str(new_output)!r} exists: choose a new directory")
    run_cfg = FinetuneConfig.from_dict(json.loads((ckpt / RUN_CONFIG).read_text(encoding="utf-8")))
    state, _, history = load_part(ckpt, 0)
    weights, step = state["model"], int(state["step"])
    if cfg.select == "best":
        kept = load_best(ckpt)
        if kept is None:
            raise InputError(
                f"checkpoint {str(ckpt)!r} carries no best weights (no development set, or all collapsed)"
            )
        weights, step = kept["model"], int(kept["step"])
    require_finite(weights, f"the weights of step {step} in {ckpt}")
    mlm, tokenizer = load_mlm(run_cfg.model, run_cfg.trust_remote_code)
    final = next((m for m in reversed(history) if int(m["step"]) <= step and "loss" in m), {})
    card = card_provenance(run_cfg, step, final, history, step)

    def write(out: Path) -> ExportResult:
        try:
            write_model(out, weights, mlm, tokenizer, run_cfg, card, new=True)
        except FileExistsError:
            raise InputError(
                f"output {str(out)!r} was written meanwhile by another export: choose a new one"
            ) from None
        return ExportResult(output=str(out), step=step, checkpoint=str(ckpt))

    return write
