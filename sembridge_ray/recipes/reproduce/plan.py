"""The dry run: every cell with its hub ids, which of its stages are already complete on disk, and a
rough compute estimate of the rest. Contacts nothing; the estimate divides by the figures file given
(``--figures``), else by built-in figures (``sembridge_ray.recipes.reproduce.figures``). One schema
(``runtime.plans.Plan``) for ``reproduce`` and ``init``."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from sembridge_ray import catalog, languages
from sembridge_ray.embed_init.methods import method
from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.recipes.reproduce import demo
from sembridge_ray.recipes.reproduce.cells import STAGES, Cell, cell_paths, config_cells
from sembridge_ray.recipes.reproduce.config import DEMO_LANGUAGE, ReproduceConfig, ReproduceResult
from sembridge_ray.recipes.reproduce.figures import BUILT_IN, Figures, plan_figures
from sembridge_ray.recipes.reproduce.grid import Identities, require_xling_inputs
from sembridge_ray.recipes.reproduce.grid import plan as grid_plan
from sembridge_ray.runtime.identity import RunIdentity
from sembridge_ray.runtime.manifest import read_manifest
from sembridge_ray.runtime.outputs import read_identity
from sembridge_ray.runtime.plans import Plan, PlannedCell, PlanResult, StageState


def cell_estimate(
    cell: Cell, datasets: Sequence[str], epochs: float, batch: int, figures: Figures = BUILT_IN
) -> dict[str, float]:
    """GPU-seconds per stage of one cell (init, evaluations, fine-tuning)."""
    init = 60_000 / figures.bridge_strings_per_s  # ~30k source + ~30k target strings, encoded once
    sizes = [languages.dataset_size(d, cell.language) for d in datasets]
    evals = sum(2 * size.passages / figures.docs_per_s for size in sizes)
    train = sum(epochs * size.train_queries / batch * figures.seconds_per_step for size in sizes)
    return {"init_s": init, "eval_s": evals, "finetune_s": train}


def cell_stage_outputs(output: Path, cell: Cell, datasets: Sequence[str]) -> dict[str, Path]:
    """Stage name -> its output directory, in run order (``reproduce.stages.cell_stages`` writes
    there; a seed's init and zero-shot evaluation only where its init reads the seed; the fusions
    with BM25 are left out)."""
    out: dict[str, Path] = {}
    for seed in range(cell.seeds):
        paths, own = cell_paths(output, cell, seed), seed == 0 or cell.init_seeded
        prefix = f"seed-{seed}/" if seed else ""
        if own:
            out[f"{prefix}init"] = paths.init
        for d in datasets:
            if own:
                out[f"{prefix}{d}/{STAGES[0]}"] = paths.eval(d, STAGES[0])
            out[f"{prefix}{d}/finetune"] = paths.finetune(d)
            out[f"{prefix}{d}/{STAGES[1]}"] = paths.eval(d, STAGES[1])
    return out


UNKNOWN_TO_A_DRY_RUN = ("precision", "resources.workers")
"""Settings a dry run cannot know as the run will record them (``auto`` precision and the workers a
cell gets are resolved against the cluster): left out when it predicts a refusal."""


def _state(
    path: Path, planned: RunIdentity | None = None, overwrite: bool = False
) -> tuple[StageState, str]:
    """(state, the differing settings when ``refused``). ``refused`` when the output holds a run
    whose recorded settings differ from ``planned``'s, or that was recorded in another identity
    format (unless ``overwrite``: then ``todo``, it is redone); else ``done`` when it is marked
    complete (its ``_SUCCESS`` manifest: a run verifies the checksums before it skips it; a dry run
    reads no artefact), else ``todo``."""
    recorded = read_identity(path)
    if planned is not None and recorded is not None:
        if change := planned.format_change(recorded):
            return ("todo", "") if overwrite else ("refused", change)
        mine, theirs = (
            RunIdentity(
                job=i.job,
                settings={k: v for k, v in i.settings.items() if k not in UNKNOWN_TO_A_DRY_RUN},
            )
            for i in (planned, recorded)
        )
        if changes := mine.differences(theirs):
            return ("todo", "") if overwrite else ("refused", "; ".join(changes[:3]))
    return ("done" if read_manifest(path) is not None else "todo"), ""


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
    identities: Callable[[Cell], dict[str, RunIdentity]] | None = None,
    overwrite: bool = False,
) -> Plan:
    """The plan of ``cells``. ``outputs``: a cell's stages -> their output directories; a stage
    whose output is complete there is ``done``, and the estimate counts only the others.
    ``identities``: a cell's stages -> their planned identities (settings only), to say which stages
    a run without ``overwrite`` would refuse."""
    rows: list[PlannedCell] = []
    total = 0.0
    for cell in cells:
        est = cell_estimate(cell, datasets, epochs, batch, figures)
        planned = identities(cell) if identities is not None else {}
        found = {k: _state(p, planned.get(k), overwrite) for k, p in outputs(cell).items()}
        gpu_s = _todo_seconds(est, found) * gpus_per_cell
        total += gpu_s
        rows.append(
            {  # the cell's hub ids, its stages' states and refusals, and its estimate
                "cell": cell.name,
                "model": cell.model,
                "language": cell.language,
                "method": cell.variant,
                "alpha": cell.alpha_label,
                "target_tokenizer": tokenizers[cell.language],
                "bridge_model": bridge if method(cell.method).uses_bridge else "",
                "datasets": {d: catalog.dataset_hub_ids(d, cell.language) for d in datasets},
                "stages": {k: state for k, (state, _) in found.items()},
                "refusals": {k: why for k, (_, why) in found.items() if why},
                "estimate_gpu_hours": round(gpu_s / 3600, 2),
            }
        )
    concurrent = max(1, max_concurrent)
    states = Counter(s for r in rows for s in r["stages"].values())
    return {
        "job": job,
        "cells": rows,
        "total_cells": len(rows),
        "stages_done": states["done"],
        "stages_todo": states["todo"],
        "stages_refused": states["refused"],
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


def _todo_seconds(est: dict[str, float], found: dict[str, tuple[StageState, str]]) -> float:
    """The estimate's seconds (``cell_estimate``: seed 0's init, evaluations and fine-tunings) of
    the stages not ``done`` or ``refused``, every seed's counted as seed 0's."""
    states = {k: state for k, (state, _) in found.items()}

    def todo(kind: Callable[[str], bool]) -> float:
        """The kind's stages to do, as a share of seed 0's."""
        first = sum(1 for k in states if kind(k) and not k.startswith("seed-"))
        return sum(1 for k, s in states.items() if kind(k) and s == "todo") / max(1, first)

    return (
        est["init_s"] * todo(lambda k: k.rpartition("/")[2] == "init")
        + est["eval_s"] * todo(lambda k: k.endswith(STAGES))
        + est["finetune_s"] * todo(lambda k: k.endswith("/finetune"))
    )


def dry_run(cfg: ReproduceConfig) -> Plan:
    """The plan of a ReproduceConfig: every cell, its hub ids, and the estimate. Imports no Ray,
    contacts nothing."""
    if cfg.assets == "bundled":  # the miniature builds its target tokenizer itself
        built = f"{cfg.output}/assets/target-bpe (built: byte-level BPE)"
        tokenizers = {DEMO_LANGUAGE: built, **cfg.demo_tokenizers()}  # refuses what the run refuses
    elif cfg.assets == "xling":
        require_xling_inputs(cfg)  # refuses what the run refuses
        tokenizers = cfg.xling_tokenizers()
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
        plan_figures(cfg.figures, optim.batch_size),
        lambda cell: cell_stage_outputs(Path(cfg.output), cell, cfg.datasets),
        identities=planned_identities(cfg),
        overwrite=cfg.overwrite,
    )


def planned_identities(cfg: ReproduceConfig) -> Callable[[Cell], dict[str, RunIdentity]]:
    """Each cell's stages -> the identity the run would give them, settings only (inputs named, not
    read: a dry run contacts nothing): the grid the driver runs (``reproduce.grid``), the
    miniature's assets where it would build them."""
    files = {name: Path(cfg.output) / "assets" / asset.path for name, asset in demo.ASSETS.items()}
    planned = grid_plan(
        cfg, 0.0, files=files, identify=Identities(compute=lambda kind, name: f"{kind}:{name}")
    )
    by_cell = {
        c: {s.name: s.cfg.identity(s.job, {}) for s in st} for c, st in planned.cells.items()
    }
    return lambda cell: by_cell.get(cell.name, {})


def concurrency(cfg: ReproduceConfig, gpus: float) -> int:
    """Cells at once: ``max_concurrent`` when set, else the cluster's GPUs / ``gpus_per_cell`` (at
    least 1)."""
    if cfg.max_concurrent > 0:
        return cfg.max_concurrent
    return max(1, math.floor(gpus / cfg.gpus_per_cell)) if gpus > 0 and cfg.gpus_per_cell > 0 else 1


def dry_run_result(cfg: ReproduceConfig) -> ReproduceResult:
    """The reproduce job's dry run: the plan, nothing run (pure: imports no Ray, contacts
    nothing)."""
    cfg.require_inputs()
    return ReproduceResult(
        output=cfg.output,
        cells=0,
        ran=0,
        failures={},
        plan=PlanResult(plan=dry_run(cfg), json=cfg.json),
    )


def init_dry_run(cfg: InitConfig) -> Plan:
    """``init --dry-run``: its one cell in the reproduction's schema (stage ``init``). Contacts
    nothing."""
    cell = Cell(
        model=cfg.source_model,
        language=cfg.language or languages.of_hub_tokenizer(cfg.target_tokenizer),
        method=cfg.method,
        alpha=cfg.weighting.alpha if method(cfg.method).has_alpha else None,
        position_aware=cfg.weighting.position_aware,
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
        plan_figures(cfg.figures, 64),
        lambda _: {"init": Path(cfg.output)},
        job="init",
        identities=lambda _: {"init": cfg.identity("init", {})},
        overwrite=cfg.overwrite,
    )


def init_dry_run_result(cfg: InitConfig) -> PlanResult:
    """The init job's dry run (pure: imports no Ray, contacts nothing, writes nothing)."""
    cfg.require_inputs(" (also with --dry-run)")
    return PlanResult(plan=init_dry_run(cfg), json=cfg.json)
