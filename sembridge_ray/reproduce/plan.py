"""The dry run: every cell with its hub ids, which of its stages are already complete on disk, and a rough compute
estimate of the rest. Contacts nothing; reads the GPU check's measured figures when they exist
(``sembridge_ray.reproduce.figures``). One schema (``jobs.plans.Plan``) for ``reproduce`` and ``init``."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from sembridge_ray import catalog
from sembridge_ray.embed_init.methods import method
from sembridge_ray.jobs.init import InitConfig
from sembridge_ray.jobs.plans import Plan, PlannedCell, PlanResult, StageState
from sembridge_ray.jobs.reproduce import DEMO_LANGUAGE, ReproduceConfig, ReproduceResult
from sembridge_ray.manifest import read_manifest
from sembridge_ray.placement import ResourceConfig
from sembridge_ray.reproduce.cells import STAGES, Cell, cell_paths, config_cells
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


def cell_stage_outputs(output: Path, cell: Cell, datasets: Sequence[str]) -> dict[str, Path]:
    """Stage name -> its output directory, in run order (``reproduce.stages.cell_stages`` writes there)."""
    paths = cell_paths(output, cell)
    out = {"init": paths.init}
    for d in datasets:
        out |= {f"{d}/{STAGES[0]}": paths.eval(d, STAGES[0]), f"{d}/finetune": paths.finetune(d)}
        out[f"{d}/{STAGES[1]}"] = paths.eval(d, STAGES[1])
    return out


def _state(path: Path) -> StageState:
    """``done`` when the stage's output is marked complete (its ``_SUCCESS`` manifest; a run verifies the checksums
    and settings before it skips it: a dry run reads no artefact)."""
    return "done" if read_manifest(path) is not None else "todo"


def plan(
    cells: Sequence[Cell],
    datasets: Sequence[str],
    tokenizers: dict[str, str],
    bridge: str,
    epochs: float,
    batch: int,
    gpus_per_cell: float,
    max_concurrent: int,
    figures: Figures,
    outputs: Callable[[Cell], dict[str, Path]],
    job: str = "reproduce",
) -> Plan:
    """The plan of ``cells``. ``outputs``: a cell's stages -> their output directories; a stage whose output is
    complete there is ``done``, and the estimate counts only the others."""
    rows: list[PlannedCell] = []
    total = 0.0
    for cell in cells:
        est = cell_estimate(cell, datasets, epochs, batch, figures)
        states: dict[str, StageState] = {k: _state(p) for k, p in outputs(cell).items()}
        todo = {
            "init_s": states["init"] == "todo",
            "eval_s": any(states[k] == "todo" for k in states if k.endswith(STAGES)),
            "finetune_s": any(states[k] == "todo" for k in states if k.endswith("/finetune")),
        }
        gpu_s = sum(v for k, v in est.items() if todo[k]) * gpus_per_cell
        total += gpu_s
        rows.append(
            {
                "cell": cell.name,
                "model": cell.model,
                "language": cell.language,
                "method": cell.variant,
                "alpha": cell.alpha_label,
                "target_tokenizer": tokenizers[cell.language],
                "bridge_model": bridge if method(cell.method).uses_bridge else "",
                "datasets": {d: catalog.dataset_hub_ids(d, cell.language) for d in datasets},
                "stages": states,
                "estimate_gpu_hours": round(gpu_s / 3600, 2),
            }
        )
    concurrent = max(1, max_concurrent)
    done = sum(s == "done" for r in rows for s in r["stages"].values())
    return {
        "job": job,
        "cells": rows,
        "total_cells": len(rows),
        "stages_done": done,
        "stages_todo": sum(len(r["stages"]) for r in rows) - done,
        "estimate_gpu_hours": round(total / 3600, 2),
        "estimate_wall_hours_at_concurrency": {
            str(concurrent): round(total / 3600 / concurrent / max(gpus_per_cell, 1e-9), 1)
        },
        "figures_source": figures.source,
        "assumptions": {
            "bridge_strings_per_s": round(figures.bridge_strings_per_s, 1),
            "docs_per_s": round(figures.docs_per_s, 1),
            "seconds_per_step": round(figures.seconds_per_step, 4),
            "note": f"rough; {gpus_per_cell:g} GPU per cell",
        },
    }


def dry_run(cfg: ReproduceConfig) -> Plan:
    """The plan of a ReproduceConfig: every cell, its hub ids, and the estimate. Imports no Ray, contacts nothing."""
    if cfg.assets == "bundled":  # the miniature builds its target tokenizer itself
        built = f"{cfg.output}/assets/target-bpe (built: byte-level BPE)"
        tokenizers = {DEMO_LANGUAGE: built, **cfg.demo_tokenizers()}  # refuses what the run refuses
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
        lambda cell: cell_stage_outputs(Path(cfg.output), cell, cfg.datasets),
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
    return ReproduceResult(
        output=cfg.output, cells=0, ran=0, failures={}, plan=PlanResult(plan=dry_run(cfg), json=cfg.json)
    )


def init_dry_run(cfg: InitConfig) -> Plan:
    """``init --dry-run``: its one cell in the reproduction's schema (stage ``init``). Contacts nothing."""
    cell = Cell(
        model=cfg.source_model,
        language=cfg.language or catalog.language_of(cfg.target_tokenizer),
        method=cfg.method,
        alpha=cfg.alpha if method(cfg.method).has_alpha else None,
        position_aware=cfg.position_aware,
    )
    return plan(
        [cell],
        (),
        {cell.language: cfg.target_tokenizer},
        cfg.bridge_model,
        0.0,
        1,
        1.0,
        1,
        load_figures(64),
        lambda _: {"init": Path(cfg.output)},
        job="init",
    )


def init_dry_run_result(cfg: InitConfig) -> PlanResult:
    """The init job's dry run (pure: imports no Ray, contacts nothing, writes nothing)."""
    if not cfg.source_model or not cfg.target_tokenizer or not cfg.output:
        from sembridge_ray.errors import InputError

        raise InputError("--model, --target-tokenizer and --output are required (also with --dry-run)")
    return PlanResult(plan=init_dry_run(cfg), json=cfg.json)
