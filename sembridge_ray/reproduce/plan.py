"""The dry run: every cell with its hub ids and a rough compute estimate. Contacts nothing; reads the GPU check's
measured figures when they exist (``sembridge_ray.reproduce.figures``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from sembridge_ray import catalog
from sembridge_ray.jobs.reproduce import Plan, PlannedCell, ReproduceConfig, ReproduceResult
from sembridge_ray.placement import ResourceConfig
from sembridge_ray.reproduce.cells import Cell, config_cells
from sembridge_ray.reproduce.figures import BUILT_IN, Figures, load_figures


def cell_estimate(
    cell: Cell, datasets: Sequence[str], epochs: float, batch: int, figures: Figures = BUILT_IN
) -> dict[str, float]:
    """GPU-seconds per stage of one cell (init, evaluations, fine-tuning)."""
    init = 2 * 60_000 / figures.bridge_strings_per_s  # ~30k source + ~30k target strings
    evals = sum(2 * catalog.CORPUS_SIZES.get(d, {}).get(cell.language, 0) / figures.docs_per_s for d in datasets)
    train = sum(
        epochs * catalog.TRAIN_QUERIES.get(d, {}).get(cell.language, 0) / batch * figures.seconds_per_step
        for d in datasets
    )
    return {"init_s": init, "eval_s": evals, "finetune_s": train}


def plan(
    cells: Sequence[Cell],
    datasets: Sequence[str],
    tokenizers: dict[str, str],
    bridge: str,
    epochs: float,
    batch: int,
    gpus_per_cell: float,
    max_concurrent: int,
    figures: Figures = BUILT_IN,
) -> Plan:
    rows: list[PlannedCell] = []
    total = 0.0
    for cell in cells:
        est = cell_estimate(cell, datasets, epochs, batch, figures)
        gpu_s = sum(est.values()) * gpus_per_cell
        total += gpu_s
        rows.append(
            {
                "cell": cell.name,
                "model": cell.model,
                "language": cell.language,
                "method": cell.variant,
                "alpha": cell.alpha_label,
                "target_tokenizer": tokenizers[cell.language],
                "bridge_model": bridge,
                "datasets": {d: catalog.dataset_hub_ids(d, cell.language) for d in datasets},
                "estimate_gpu_hours": round(gpu_s / 3600, 2),
            }
        )
    concurrent = max(1, max_concurrent)
    return {
        "cells": rows,
        "total_cells": len(rows),
        "estimate_gpu_hours": round(total / 3600, 1),
        "estimate_wall_hours_at_concurrency": {str(concurrent): round(total / 3600 / concurrent / gpus_per_cell, 1)},
        "figures_source": figures.source,
        "assumptions": {
            "bridge_strings_per_s": round(figures.bridge_strings_per_s, 1),
            "docs_per_s": round(figures.docs_per_s, 1),
            "seconds_per_step": round(figures.seconds_per_step, 4),
            "note": "rough; one GPU per cell",
        },
    }


def dry_run(cfg: ReproduceConfig) -> Plan:
    """The plan of a ReproduceConfig: every cell, its hub ids, and the estimate. Imports no Ray, contacts nothing."""
    if cfg.assets == "bundled":  # the miniature builds its target tokenizer itself
        named = cfg.named_tokenizers()  # the one parser: a malformed item is refused here too
        built = f"{cfg.output}/assets/target-bpe (built: byte-level BPE)"
        tokenizers = {lang: named.get(lang, built) for lang in cfg.languages}
    else:
        tokenizers = cfg.tokenizer_per_language()
    optim = cfg.finetune.optim
    return plan(
        config_cells(cfg),
        cfg.datasets,
        tokenizers,
        cfg.init.bridge_model,
        optim.epochs,
        optim.batch_size,
        cfg.gpus_per_cell,
        cfg.max_concurrent or 1,
        load_figures(optim.batch_size),
    )


def concurrency(cfg: ReproduceConfig, gpus: float) -> int:
    """Cells at once: ``max_concurrent`` when set, else the cluster's GPUs / ``gpus_per_cell`` (at least 1)."""
    if cfg.max_concurrent > 0:
        return cfg.max_concurrent
    return max(1, math.floor(gpus / cfg.gpus_per_cell)) if gpus > 0 and cfg.gpus_per_cell > 0 else 1


def cell_resources(cfg: ReproduceConfig, base: ResourceConfig, gpus: float) -> ResourceConfig:
    """A stage's resources inside a cell: on a GPU cluster, ``gpus_per_cell`` GPUs (whole GPUs as one worker each, a
    fraction as one worker with that share); without GPUs, the stage's configured resources."""
    if gpus <= 0 or cfg.gpus_per_cell <= 0:
        return base
    if cfg.gpus_per_cell < 1:
        return replace(base, workers=1, gpus_per_worker=cfg.gpus_per_cell)
    return replace(base, workers=math.floor(cfg.gpus_per_cell), gpus_per_worker=1.0)


def dry_run_result(cfg: ReproduceConfig) -> ReproduceResult:
    """The reproduce job's dry run: the plan, nothing run (pure: imports no Ray, contacts nothing)."""
    cfg.require_inputs()
    return ReproduceResult(output=cfg.output, cells=0, ran=0, failures={}, plan=dry_run(cfg))
