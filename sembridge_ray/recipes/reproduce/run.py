"""Ray side of the reproduction: plan every stage, check them all against what is on disk, then run
the cells (inline or as concurrent Ray tasks) and write the tables and plots.

A cell initialises once; then for each dataset it evaluates zero-shot, fine-tunes on the training
split (scored on the development set as it trains, where there is one: the demo's SICK trial split,
or ``finetune.eval``) and evaluates again. Each source model is scored once on that development set,
the level its transfers' dev curves are drawn against. Every stage has its own output directory
under the output contract (:mod:`sembridge_ray.runtime.outputs`): before any work, every planned stage is
compared with what its directory holds, and stages whose settings changed are listed and refused
unless ``--overwrite``. A rerun then skips finished stages and resumes unfinished ones (fine-tuning
from its last checkpoint). A cell whose inputs are missing, or that fails, is recorded with its
error and does not stop the others."""

from __future__ import annotations

import json
import logging
import time
import traceback
from dataclasses import replace
from pathlib import Path

from sembridge_ray.recipes import registry
from sembridge_ray.recipes.reproduce import demo, results
from sembridge_ray.recipes.reproduce.config import CellOutcome, ReproduceConfig, ReproduceResult
from sembridge_ray.recipes.reproduce.grid import Plan, plan, require_xling_inputs, xling_asset_names
from sembridge_ray.recipes.reproduce.plan import concurrency
from sembridge_ray.recipes.reproduce.stages import Stage, cell_resources
from sembridge_ray.runtime import progress
from sembridge_ray.runtime.config import write_config
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.executor import Executor, LocalExecutor, Tasks
from sembridge_ray.runtime.locks import OutputLock
from sembridge_ray.runtime.outputs import atomic_write_json, atomic_write_text, conflict, is_done

log = logging.getLogger(__name__)


def resolved_precisions(cfg: ReproduceConfig, gpus: float, executor: Executor) -> ReproduceConfig:
    """Each stage job's ``precision`` as its workers will run it (``executor.precision``), so the
    planned identities are the ones the stages record."""
    sections = {}
    for name in ("init", "finetune", "evaluate"):
        section = getattr(cfg, name)
        res = cell_resources(cfg, section.resources, gpus)
        sections[name] = replace(section, precision=executor.precision(section.precision, res))
    return replace(cfg, **sections)


def check_plan(cfg: ReproduceConfig, planned: Plan) -> None:
    """Refuse, listing them, when stages on disk were run with other settings (unless
    ``overwrite``)."""
    changed = [
        f"{cell}/{stage.name} ({detail})"
        for cell, stage in planned.all_stages()
        if (detail := conflict(stage.output, stage.identity)) is not None
    ]
    if changed and not cfg.overwrite:
        shown = "; ".join(changed[:6]) + (
            f"; and {len(changed) - 6} more" if len(changed) > 6 else ""
        )
        raise InputError(
            f"{len(changed)} finished or started stages have other settings: {shown}; rerun with "
            "--overwrite to redo them (and what depends on them), or choose another --output"
        )
    if changed:
        log.warning("--overwrite: %d stages with other settings will be redone", len(changed))


TIMINGS = "timings.jsonl"
"""One line per stage a run did (or skipped): its cell, name, job, wall seconds and whether it was
skipped; ``benchmarks/grid_time.py`` reads where a grid's time went."""


def run_stage(stage: Stage, executor: Executor, root: Path, cell: str = "") -> None:
    """Run one stage on ``executor`` (skipped when finished); its wall time is appended to
    ``root/timings.jsonl``."""
    start = time.perf_counter()
    with progress.stage(log, f"{cell + '/' if cell else ''}{stage.name}") as note:
        result = registry.run(stage.job, stage.cfg, stage.inputs, executor)
        note["status"] = "skipped (finished before)" if result.skipped else "done"
    line = {
        "cell": cell,
        "stage": stage.name,
        "job": stage.job,
        "seconds": round(time.perf_counter() - start, 2),
        "skipped": bool(result.skipped),
    }
    # one short append per stage: whole lines even from cells running as parallel tasks
    with open(root / TIMINGS, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


def run_cell(
    cfg: ReproduceConfig, name: str, stages: list[Stage], executor: Executor
) -> CellOutcome:
    """All stages of one cell in order, on ``executor``; finished ones are skipped. Rebuilds the
    results tables after each."""
    for stage in stages:
        run_stage(stage, executor, Path(cfg.output), name)
        if stage.job == "evaluate" or stage.name == "init":
            results.rebuild(cfg)
    return CellOutcome(cell=name, ok=True)


def _guarded_stage(stage: Stage, executor: Executor, root: Path) -> None:
    """A source model's development score, or a BM25 baseline: a reference line, so its failure is
    logged, not fatal (the cells whose fusions read a BM25 run record their own failure)."""
    try:
        run_stage(stage, executor, root)
    except Exception as err:  # the cells do not depend on it
        log.error("%s failed (its reference line is not drawn): %s", stage.name, err)


def _guarded(
    cfg: ReproduceConfig, name: str, stages: list[Stage], executor: Executor
) -> CellOutcome:
    try:
        return run_cell(cfg, name, stages, executor)
    except Exception as err:  # a failing cell is recorded and must not stop the others
        log.error("cell %s failed: %s", name, err)
        return CellOutcome(
            cell=name,
            ok=False,
            error=f"{type(err).__name__}: {err}",
            traceback=traceback.format_exc(limit=8),
        )


def run_reproduce(cfg: ReproduceConfig, *, executor: Executor) -> ReproduceResult:
    """Plan and check every stage, then run every cell (skipping finished stages), each stage on
    ``executor``."""
    cfg.require_inputs()
    out = Path(cfg.output)
    executor.start()
    out.mkdir(parents=True, exist_ok=True)
    with OutputLock(out):
        if cfg.assets in ("bundled", "xling"):  # before Ray starts: a refusal costs a second
            names = xling_asset_names(cfg) if cfg.assets == "xling" else None
            demo.check_assets(out / "assets", cfg.demo, cfg.overwrite, names)
        if cfg.assets == "xling":
            require_xling_inputs(cfg)
        gpus = executor.gpus()
        cfg = resolved_precisions(cfg, gpus, executor)
        planned = plan(cfg, gpus)
        check_plan(cfg, planned)
        write_config(cfg, out / "config.yaml")
        for stage in planned.assets:
            run_stage(stage, executor, out)
        for stage in planned.sources + planned.baselines:
            _guarded_stage(stage, executor, out)
        todo = [
            (c, s)
            for c, s in planned.cells.items()
            if not all(is_done(x.output, x.identity) for x in s)
        ]
        width = concurrency(cfg, gpus)
        log.info(
            "%d cells (%d unfinished, %d not runnable), %d at a time",
            len(planned.cells) + len(planned.failures),
            len(todo),
            len(planned.failures),
            width,
        )
        cells = progress.Progress(log, "cells", len(todo), "finished", every_s=float("inf"))
        outcomes = _run_cells(cfg, todo, width, cells, executor)
        cells.finish()
        failures = _record_failures(out, planned, outcomes)
        results.rebuild(cfg, failures, final=True)
    return ReproduceResult(
        output=str(out),
        cells=len(planned.cells) + len(planned.failures),
        ran=len(todo),
        failures=failures,
    )


def _record_failures(out: Path, planned: Plan, outcomes: list[CellOutcome]) -> dict[str, str]:
    """``failures.json`` (cell -> error) and each failed cell's ``error.txt`` (with its traceback)."""
    failures = dict(planned.failures) | {o.cell: o.error for o in outcomes if not o.ok}
    atomic_write_json(out / "failures.json", failures)
    for name, error in failures.items():
        detail = next((o.traceback for o in outcomes if o.cell == name), "")
        atomic_write_text(out / "cells" / name / "error.txt", error + "\n\n" + detail)
    return failures


def _run_cells(
    cfg: ReproduceConfig,
    cells: list[tuple[str, list[Stage]]],
    width: int,
    count: progress.Progress,
    executor: Executor,
) -> list[CellOutcome]:
    """Cells as ``executor``'s tasks, at most ``width`` in flight (each drives its own actor pools
    and trainers); one at a time in this process when ``width`` is 1."""
    runner = executor if width > 1 else LocalExecutor()
    calls = [(cfg, name, stages, executor) for name, stages in cells]
    done: list[CellOutcome] = []
    for outcome in runner.map_tasks(_guarded, calls, Tasks(cpus=0, width=width)):
        done.append(outcome)
        # the window was full, or held every cell left, until this one finished
        _count(count, outcome, running=min(width, len(cells) - len(done) + 1) - 1)
    return done


def _count(count: progress.Progress, outcome: CellOutcome, running: int) -> None:
    """One line per finished cell: how it ended, then done / running / left and the ETA."""
    log.info("cell %s %s", outcome.cell, "finished" if outcome.ok else f"FAILED: {outcome.error}")
    count.add()
    if count.done < count.total:
        log.info(
            "%s; %d running, %d waiting", count.line(), running, count.total - count.done - running
        )
