"""The dry run: every cell with its hub ids and a rough compute estimate. Contacts nothing."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sembridge_ray import catalog
from sembridge_ray.placement import ResourceConfig
from sembridge_ray.reproduce.cells import Cell, config_cells

MEASURED_JSON = Path("~/.cache/sembridge_ray/measured.json").expanduser()
"""Written by ``python -m jobs.bench_peers`` (``sembridge_ray.bench.measured`` documents its fields)."""


@dataclass(frozen=True)
class Throughputs:
    """What the estimate divides by, on one A100-class GPU at the paper's shapes, and where the figures come from."""

    bridge_strings_per_s: float
    docs_per_s: float
    """BERT-base SPLADE documents of 256 tokens."""
    train_examples_per_s: float
    """Training pairs of 64 + 256 tokens, BERT-base, incl. the FLOPs regulariser."""
    source: str


GUESSES = Throughputs(3_000, 1_000, 64 / 0.35, "fixed guesses (no measured.json): rough, A100-class, bf16")


def load_throughputs(path: Path = MEASURED_JSON) -> Throughputs:
    """The measured figures of ``path`` times its ``gpu_scale`` (1 for a GPU run; a CPU run writes its scaling
    assumption in ``scaling``); a figure the file lacks keeps its guess; no file: :data:`GUESSES`."""
    if not path.is_file():
        return GUESSES
    data = json.loads(path.read_text())
    scale = float(data.get("gpu_scale", 1.0))
    rates = {
        k: float(data[k]) * scale for k in ("bridge_strings_per_s", "docs_per_s", "train_examples_per_s") if k in data
    }
    missing = sorted({"bridge_strings_per_s", "docs_per_s", "train_examples_per_s"} - set(rates))
    source = f"{data.get('source', path)} on {data.get('device', '?')} ({path})"
    if scale != 1.0:
        source += f"; {data.get('scaling', f'scaled x {scale:g}')}"
    if missing:
        source += f"; guessed: {', '.join(missing)}"
    return replace(GUESSES, **rates, source=source)


def cell_estimate(
    cell: Cell, datasets: Sequence[str], epochs: float, batch: int, rates: Throughputs = GUESSES
) -> dict[str, float]:
    """GPU-seconds per stage of one cell (init, evaluations, fine-tuning)."""
    init = 2 * 60_000 / rates.bridge_strings_per_s  # ~30k source + ~30k target strings (source cached per model)
    evals = sum(2 * catalog.CORPUS_SIZES.get(d, {}).get(cell.language, 0) / rates.docs_per_s for d in datasets)
    train = sum(
        epochs * catalog.TRAIN_QUERIES.get(d, {}).get(cell.language, 0) / rates.train_examples_per_s for d in datasets
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
    rates: Throughputs = GUESSES,
) -> dict[str, Any]:
    rows = []
    total = 0.0
    for cell in cells:
        est = cell_estimate(cell, datasets, epochs, batch, rates)
        gpu_s = sum(est.values()) * gpus_per_cell
        total += gpu_s
        rows.append(
            {
                "cell": cell.name,
                "model": cell.model,
                "language": cell.language,
                "method": cell.method,
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
        "assumptions": {
            "bridge_strings_per_s": round(rates.bridge_strings_per_s, 1),
            "docs_per_s": round(rates.docs_per_s, 1),
            "train_examples_per_s": round(rates.train_examples_per_s, 1),
            "source": rates.source,
            "note": "one A100-class GPU per cell",
        },
    }


def dry_run(cfg: Any) -> dict[str, Any]:
    """The plan of a ReproduceConfig: every cell, its hub ids, and the estimate. Imports no Ray, contacts nothing."""
    if cfg.preset == "demo":  # the miniature builds its target tokenizer itself
        tokenizers = {lang: f"{cfg.output}/assets/target-bpe (built: byte-level BPE)" for lang in cfg.languages}
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
        load_throughputs(),
    )


def concurrency(cfg: Any, gpus: float) -> int:
    """Cells at once: ``max_concurrent`` when set, else the cluster's GPUs / ``gpus_per_cell`` (at least 1)."""
    if cfg.max_concurrent > 0:
        return cfg.max_concurrent
    return max(1, math.floor(gpus / cfg.gpus_per_cell)) if gpus > 0 and cfg.gpus_per_cell > 0 else 1


def cell_resources(cfg: Any, base: ResourceConfig, gpus: float) -> ResourceConfig:
    """A stage's resources inside a cell: on a GPU cluster, ``gpus_per_cell`` GPUs (whole GPUs as one worker each, a
    fraction as one worker with that share); without GPUs, the stage's configured resources."""
    if gpus <= 0 or cfg.gpus_per_cell <= 0:
        return base
    if cfg.gpus_per_cell < 1:
        return replace(base, workers=1, gpus_per_worker=cfg.gpus_per_cell)
    return replace(base, workers=math.floor(cfg.gpus_per_cell), gpus_per_worker=1.0)
