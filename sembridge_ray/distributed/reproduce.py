"""Ray side of the reproduction: prepare assets, run cells (inline or as concurrent Ray tasks), tables, plots.

A cell initialises once; then for each dataset it evaluates zero-shot, fine-tunes on the training split and
evaluates again. Every stage has its own output directory with ``_SUCCESS``, so a rerun skips finished stages and
resumes unfinished ones (fine-tuning resumes from its last checkpoint). A failing cell is recorded with its error
and does not stop the others.
"""

from __future__ import annotations

import json
import logging
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import ray

from sembridge_ray import catalog
from sembridge_ray.config import write_config
from sembridge_ray.distributed import cluster
from sembridge_ray.distributed.eval_pipeline import run_evaluate
from sembridge_ray.distributed.init_pipeline import run_init
from sembridge_ray.distributed.train import run_finetune
from sembridge_ray.outputs import atomic_write_json, atomic_write_text, is_complete
from sembridge_ray.reproduce import cells as cellmod
from sembridge_ray.reproduce import compare, demo, plots, results
from sembridge_ray.reproduce.cells import Cell, cell_paths
from sembridge_ray.reproduce.config import ReproduceConfig
from sembridge_ray.reproduce.plan import cell_resources, concurrency

log = logging.getLogger(__name__)
DEMO_MODEL, DEMO_LANGUAGE, DEMO_DATASET = "minilm-splade", "en-bpe", "sick"
SOURCE_EVAL = "source-eval"


@dataclass(frozen=True)
class Assets:
    """Where a cell's inputs come from: model paths, target tokenizers, (eval, train) dataset specs."""

    models: dict[str, str]
    tokenizers: dict[str, str]
    specs: dict[tuple[str, str], tuple[str, str]]  # (dataset, language) -> (eval spec, train spec)


def paper_assets(cfg: ReproduceConfig) -> Assets:
    mirror = f"@{cfg.miracl_mirror}" if cfg.miracl_mirror else ""
    specs = {}
    for lang in cfg.languages:
        specs[("webfaq", lang)] = (f"webfaq:{lang}",) * 2
        specs[("miracl", lang)] = (f"miracl:{lang}{mirror}",) * 2
    models = {m: catalog.SOURCE_MODELS.get(m, m) for m in cfg.models}
    return Assets(models, cfg.tokenizer_per_language(), specs)


def demo_assets(cfg: ReproduceConfig) -> Assets:
    """Build (once) the miniature's source encoder, target tokenizer and data under ``<output>/assets``."""
    root = Path(cfg.output) / "assets"
    beir = root / "sick-beir"
    if not (beir / "corpus.jsonl").is_file():
        demo.build_retrieval_set(beir, cfg.demo.test_pairs)
    sick_train = root / "sick-train-pairs.parquet"
    if not sick_train.is_file():
        demo.write_pairs(demo.sick_pairs(), sick_train)
    source_pairs = root / "source-pairs.parquet"
    if not source_pairs.is_file():
        demo.write_pairs(demo.sick_pairs() + demo.sts_pairs(), source_pairs)
    target = root / "target-bpe"
    if not (target / "tokenizer.json").is_file():
        demo.build_target_tokenizer(target, cfg.demo.target_vocab)
    untrained = root / "minilm-splade-untrained"
    if not (untrained / "config.json").is_file():
        demo.build_minilm_splade(untrained, cfg.demo.mlm_bias)
    source = root / "minilm-splade"
    optim = replace(cfg.finetune.optim, max_steps=cfg.demo.source_steps, batch_size=cfg.demo.source_batch,
                    lr=cfg.demo.source_lr)
    run_finetune(replace(cfg.finetune, model=str(untrained), train=str(source_pairs), output=str(source),
                         optim=optim))
    # The source with its own tokenizer on the same queries: the level a transfer would ideally recover.
    run_evaluate(replace(cfg.evaluate, model=str(source), dataset=str(beir), split=cfg.eval_split,
                         output=str(root / SOURCE_EVAL), cache_dir=str(Path(cfg.output) / "cache" / "eval")))
    return Assets({DEMO_MODEL: str(source)}, {DEMO_LANGUAGE: str(target)},
                  {(DEMO_DATASET, DEMO_LANGUAGE): (str(beir), str(sick_train))})


def run_cell(cfg: ReproduceConfig, cell: Cell, assets: Assets, gpus: float) -> dict[str, Any]:
    """All stages of one cell; finished stages are skipped. Rebuilds the results tables after each stage."""
    paths = cell_paths(Path(cfg.output), cell)
    init = replace(cfg.init, source_model=assets.models[cell.model], target_tokenizer=assets.tokenizers[cell.language],
                   method=cell.method, alpha=cell.alpha if cell.alpha is not None else cfg.init.alpha,
                   output=str(paths.init), resources=cell_resources(cfg, cfg.init.resources, gpus))
    run_init(init)
    refresh(cfg)
    for dataset in cfg.datasets:
        eval_spec, train_spec = assets.specs[(dataset, cell.language)]
        evaluate = replace(cfg.evaluate, dataset=eval_spec, split=cfg.eval_split,
                           cache_dir=str(Path(cfg.output) / "cache" / "eval"),
                           resources=cell_resources(cfg, cfg.evaluate.resources, gpus))
        run_evaluate(replace(evaluate, model=str(paths.model), output=str(paths.eval(dataset, "zero_shot"))))
        refresh(cfg)
        finetune = replace(cfg.finetune, model=str(paths.model), train=train_spec, output=str(paths.finetune(dataset)),
                           resources=cell_resources(cfg, cfg.finetune.resources, gpus))
        run_finetune(finetune)
        run_evaluate(replace(evaluate, model=str(paths.finetune(dataset)), output=str(paths.eval(dataset, "finetuned"))))
        refresh(cfg)
    return {"cell": cell.name, "ok": True}


def refresh(cfg: ReproduceConfig, failures: dict[str, str] | None = None, final: bool = False) -> list[dict[str, Any]]:
    """Rewrite results.csv / results.md (at the end also comparisons.csv and the plots) from the finished stages."""
    out = Path(cfg.output)
    cells = cellmod.config_cells(cfg)
    if failures is None:
        failures = json.loads((out / "failures.json").read_text()) if (out / "failures.json").is_file() else {}
    rows = results.collect(out, cells, cfg.datasets)
    results.write_csv(rows, out / "results.csv")
    text = results.markdown(rows, cfg.languages, failures)
    if final:
        paired = compare.comparisons(out, cells, cfg.datasets)
        results.write_csv(paired, out / "comparisons.csv", compare.COLUMNS)
        text += "\n" + compare.markdown(paired)
        plots.learning_curves(out, cells, cfg.datasets, rows, out / "plots")
        plots.alpha_ablation(rows, out / "plots")
        plots.support_histograms(out, cells, out / "plots")
    source = out / "assets" / SOURCE_EVAL / "metrics.json"
    if is_complete(source.parent):
        ndcg = json.loads(source.read_text(encoding="utf-8"))["nDCG@10"]
        text += f"\nThe source encoder with its own tokenizer (before the swap) scores nDCG@10 {ndcg:.3f} here.\n"
    atomic_write_text(out / "results.md", text)
    return rows


def _guarded(cfg: ReproduceConfig, cell: Cell, assets: Assets, gpus: float) -> dict[str, Any]:
    try:
        return run_cell(cfg, cell, assets, gpus)
    except Exception as err:  # a failing cell is recorded and must not stop the others
        log.error("cell %s failed: %s", cell.name, err)
        return {"cell": cell.name, "ok": False, "error": f"{type(err).__name__}: {err}",
                "traceback": traceback.format_exc(limit=8)}


def run_reproduce(cfg: ReproduceConfig) -> dict[str, Any]:
    """Run every cell (skipping finished stages); returns {"cells": n, "failures": {cell: error}}."""
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    write_config(cfg, out / "config.yaml")
    info = cluster.connect()
    assets = demo_assets(cfg) if cfg.preset == "demo" else paper_assets(cfg)
    cells = cellmod.config_cells(cfg)
    todo = [c for c in cells if not _cell_done(cfg, c)]
    width = concurrency(cfg, info.gpus)
    log.info("%d cells (%d unfinished), %d at a time", len(cells), len(todo), width)
    outcomes = _run_inline(cfg, todo, assets, info.gpus) if width == 1 else _run_tasks(cfg, todo, assets, info.gpus, width)
    failures = {o["cell"]: o["error"] for o in outcomes if not o["ok"]}
    atomic_write_json(out / "failures.json", failures)
    for o in outcomes:
        if not o["ok"]:
            atomic_write_text(out / "cells" / o["cell"] / "error.txt", o["error"] + "\n\n" + o["traceback"])
    refresh(cfg, failures, final=True)
    return {"cells": len(cells), "ran": len(todo), "failures": failures}


def _cell_done(cfg: ReproduceConfig, cell: Cell) -> bool:
    paths = cell_paths(Path(cfg.output), cell)
    stages = [paths.init, *(paths.eval(d, s) for d in cfg.datasets for s in cellmod.STAGES)]
    return all(is_complete(p) for p in stages)


def _run_inline(cfg: ReproduceConfig, cells: list[Cell], assets: Assets, gpus: float) -> list[dict[str, Any]]:
    return [_guarded(cfg, cell, assets, gpus) for cell in cells]


def _run_tasks(cfg: ReproduceConfig, cells: list[Cell], assets: Assets, gpus: float, width: int) -> list[dict[str, Any]]:
    """Cells as Ray tasks, at most ``width`` in flight; each task drives its own actor pools and trainers."""
    task = ray.remote(num_cpus=0, max_retries=0)(_guarded)
    pending, done = list(cells), []
    running: list[Any] = []
    while pending or running:
        while pending and len(running) < width:
            running.append(task.remote(cfg, pending.pop(0), assets, gpus))
        ready, running = ray.wait(running, num_returns=1)
        done.extend(ray.get(ready))
    return done
