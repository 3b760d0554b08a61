"""Fine-tuning checkpoints that say whether they were written completely, so a restart never waits for Ray.

Every rank writes its part of a checkpoint (rank 0: the model, optimiser and schedule state and the metrics so far;
every rank: its RNG streams) plus ``complete-rank<r>.json``, the sha256 of each of its files, last. A checkpoint
directory is complete when rank 0's manifest names the world size and every rank's manifest is there with
matching files. A restart restores the newest complete checkpoint it finds in the run's storage, whether or not
Ray Train had registered it before the failure: at most ``checkpoint_every`` steps are recomputed.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from sembridge_ray.outputs import sha256_file

log = logging.getLogger(__name__)
STATE, METRICS, PREFIX = "state.pt", "metrics.jsonl", "step_"


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def write_part(
    directory: Path,
    rank: int,
    world: int,
    rng: dict[str, Any],
    state: dict[str, Any] | None = None,
    metrics_text: str | None = None,
) -> None:
    """This rank's files in ``directory``, then its manifest (rank 0 also writes ``state`` and the metrics)."""
    directory = Path(directory)
    files = {f"rng-rank{rank}.pt": lambda p: torch.save(rng, p)}
    if state is not None:
        files[STATE] = lambda p: torch.save(state, p)
    if metrics_text is not None:
        files[METRICS] = lambda p: p.write_text(metrics_text, encoding="utf-8")
    for name, write in files.items():
        write(directory / name)
    manifest = {"world": world, "files": {name: sha256_file(directory / name) for name in files}}
    (directory / f"complete-rank{rank}.json").write_text(json.dumps(manifest), encoding="utf-8")


def is_complete_checkpoint(directory: Path) -> bool:
    """Every rank's manifest is present and every file it names has its checksum."""
    try:
        world = int(json.loads((Path(directory) / "complete-rank0.json").read_text(encoding="utf-8"))["world"])
        for rank in range(world):
            manifest = json.loads((Path(directory) / f"complete-rank{rank}.json").read_text(encoding="utf-8"))
            for name, digest in manifest["files"].items():
                if sha256_file(Path(directory) / name) != digest:
                    return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


def complete_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, directory) of every complete checkpoint under ``run_dir``, newest first; [] for a non-local path."""
    root = Path(run_dir)
    if "://" in str(run_dir) or not root.is_dir():
        return []
    found = []
    for directory in root.glob(f"{PREFIX}*"):
        step = directory.name[len(PREFIX) :]
        if step.isdigit() and directory.is_dir() and is_complete_checkpoint(directory):
            found.append((int(step), directory))
    return sorted(found, reverse=True)


def load_part(directory: Path, rank: int) -> tuple[dict[str, Any], dict[str, Any] | None, list[dict[str, Any]]]:
    """(model/optimiser/schedule state, this rank's RNG streams or None, the metrics so far) of a checkpoint."""
    directory = Path(directory)
    state = torch.load(directory / STATE, map_location="cpu", weights_only=True)
    rng_path = directory / f"rng-rank{rank}.pt"  # absent when resuming with more workers than before
    rng = torch.load(rng_path, weights_only=True) if rng_path.is_file() else None
    lines = (directory / METRICS).read_text(encoding="utf-8").splitlines()
    return state, rng, [json.loads(line) for line in lines if line]
