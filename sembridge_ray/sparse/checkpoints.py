"""Fine-tuning checkpoints that say whether they were written completely, so a restart never waits
for Ray.

Every rank writes its part of a checkpoint (rank 0: the model, optimiser and schedule state and the
metrics so far; every rank: its RNG streams) plus ``complete-rank<r>.json``, the sha256 of each of
its files, last. A checkpoint directory is complete when rank 0's manifest names the world size and
every rank's manifest is there with matching files.

One rule decides where a (re)start resumes, for the driver and every worker alike
(:func:`restore_point`): the newest checkpoint that verifies, whether or not Ray Train had
registered it before the failure, so at most ``checkpoint_every`` steps are recomputed. Before a run
starts, the driver alone makes Ray Train's registry agree (:func:`set_aside_damaged`): a registered
checkpoint that no longer verifies (a truncated or flipped file, a lost directory) is dropped from
the registry and renamed ``step_<n>.damaged-<time>`` with one warning line, so neither Ray nor this
rule picks it again and Ray overwrites nothing that was kept. Checkpoints on object storage are not
verified (that would download them): there the restart restores what Ray Train registered, as
before."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Required, TypedDict, cast

import torch

from sembridge_ray.runtime.executor import is_local
from sembridge_ray.runtime.outputs import atomic_write_text, sha256_file
from sembridge_ray.sparse.loop import RngState, TrainState

log = logging.getLogger(__name__)
STATE, TRAIN_METRICS, PREFIX = "state.pt", "metrics.jsonl", "step_"
BEST, RUN_CONFIG, MANIFEST = "best.pt", "config.json", "complete-rank{}.json"
# Ray Train V2's registry of a run's reported checkpoints (ray.train.v2._internal.constants); Ray
# refuses to start a run whose registry names a directory that is gone
# (CheckpointManagerInitializationError).
REGISTRY = "checkpoint_manager_snapshot.json"
DAMAGED = ".damaged-"


class BestState(TypedDict):
    """The best evaluated weights so far (rank 0's ``best.pt``): what ``select=best`` publishes."""

    step: int
    score: float
    model: dict[str, torch.Tensor]


class RegistryEntry(TypedDict):
    """One reported checkpoint in Ray Train's registry (its other keys are kept as they are)."""

    checkpoint_dir_name: str


class Registry(TypedDict, total=False):
    """The keys of Ray Train's registry (Ray 2.x) that this module reads and edits; the others are
    kept as they are. Another layout fails with a KeyError or TypeError, which
    :func:`set_aside_damaged` catches."""

    checkpoint_results: Required[list[RegistryEntry]]
    checkpoint_report_indices: Required[list[int]]
    latest_checkpoint_result: RegistryEntry | None
    pending_training_results: list[RegistryEntry]
    pending_validation_specs: list[object]
    validated_checkpoint_dir_names: list[str]
    timed_out_validation_checkpoint_dir_names: list[str]
    failed_validation_checkpoint_dir_names: list[str]


NAME_LISTS = (
    "validated_checkpoint_dir_names",
    "timed_out_validation_checkpoint_dir_names",
    "failed_validation_checkpoint_dir_names",
)
"""The registry's lists of checkpoint directory names."""


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def step_of(name: str) -> int | None:
    """The step of a checkpoint directory name (``step_00000008`` -> 8); None for any other name."""
    digits = name[len(PREFIX) :]
    return int(digits) if name.startswith(PREFIX) and digits.isdigit() else None


def write_part(
    directory: Path,
    rank: int,
    world: int,
    rng: Mapping[str, object],
    state: Mapping[str, object] | None = None,
    metrics_text: str | None = None,
    best: BestState | None = None,
    config_text: str | None = None,
) -> None:
    """This rank's files in ``directory``, then its manifest (rank 0 also writes ``state``, the
    metrics, the best evaluated weights so far and the run's config, which makes the checkpoint
    exportable alone). ``rng`` is a :class:`~sembridge_ray.sparse.loop.RngState`, ``state`` a
    ``TrainState``; all are saved as given."""
    directory = Path(directory)
    parts: dict[str, object] = {f"rng-rank{rank}.pt": rng, STATE: state, BEST: best}
    parts |= {RUN_CONFIG: config_text, TRAIN_METRICS: metrics_text}
    for name, part in parts.items():
        if isinstance(part, str):  # the config and the metrics
            (directory / name).write_text(part, encoding="utf-8")
        elif part is not None:
            torch.save(part, directory / name)
    files = [name for name, part in parts.items() if part is not None]
    manifest = {"world": world, "files": {name: sha256_file(directory / name) for name in files}}
    (directory / MANIFEST.format(rank)).write_text(json.dumps(manifest), encoding="utf-8")


def checkpoint_problem(directory: Path) -> str | None:
    """Why ``directory`` is not a complete checkpoint (a missing manifest, a file that fails its
    checksum), or None when every rank's manifest is present and every file it names has its
    checksum."""
    directory = Path(directory)
    if not directory.is_dir():
        return "the directory is missing"
    try:
        world = json.loads((directory / MANIFEST.format(0)).read_text(encoding="utf-8"))["world"]
        for rank in range(int(world)):
            manifest = json.loads((directory / MANIFEST.format(rank)).read_text(encoding="utf-8"))
            for name, digest in manifest["files"].items():
                if sha256_file(directory / name) != digest:
                    return f"{name} does not match its checksum"
    except FileNotFoundError as err:
        return f"{Path(str(err.filename)).name} is missing"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"unreadable ({type(err).__name__}: {err})"
    return None


def checkpoint_dirs(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, directory) of every checkpoint directory under ``run_dir``, complete or not, newest
    first; [] for a path that is not local or not there."""
    root = Path(run_dir)
    if not is_local(run_dir) or not root.is_dir():
        return []
    found = [
        (step, d)
        for d in root.glob(f"{PREFIX}*")
        if (step := step_of(d.name)) is not None and d.is_dir()
    ]
    return sorted(found, reverse=True)


def restore_point(run_dir: str | Path) -> tuple[int, Path] | None:
    """(step, directory) a (re)start restores: the newest checkpoint that verifies; None when there
    is none (a new run) or the storage is not a local path. The driver's ``resumed from`` and every
    worker's restore use it. Checksums are read newest first, only until one checkpoint verifies."""
    return next(
        ((step, d) for step, d in checkpoint_dirs(run_dir) if checkpoint_problem(d) is None), None
    )


def set_aside_damaged(run_dir: str | Path) -> list[Path]:
    """Drop every checkpoint Ray Train registered that does not verify from its registry, then
    rename the directory aside (one warning line each); an unreadable registry is itself set aside
    (the workers then restore by :func:`restore_point` alone). The new paths. Only the driver calls
    it, before the trainer starts.

    Unregistered directories that do not verify are left alone: they are writes a failure
    interrupted, never restored, and Ray writes over them when the run reaches their step again.
    Object storage: nothing is done."""
    root = Path(run_dir)
    registry = root / REGISTRY
    if not is_local(run_dir) or not registry.is_file():
        return []
    try:
        snapshot = json.loads(registry.read_text(encoding="utf-8"))
        names = registered_names(snapshot)
        # the layout is the one this code edits, before anything changes
        without_checkpoints(snapshot, set(names))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        moved = _set_aside(registry)
        log.warning(
            "Ray Train's checkpoint registry %s is unreadable (%s): set aside as %s",
            registry,
            err,
            moved.name,
        )
        return [moved]
    damaged = {
        name: problem for name in names if (problem := checkpoint_problem(root / name)) is not None
    }
    if not damaged:
        return []
    # The registry first: a crash between the two steps leaves a damaged directory nobody names,
    # never a registry naming a directory that is gone.
    atomic_write_text(registry, json.dumps(without_checkpoints(snapshot, set(damaged))))
    moved_paths = []
    for name, problem in sorted(damaged.items()):
        if not (root / name).exists():
            log.warning(
                "checkpoint %s registered by Ray Train is missing: dropped from its registry",
                root / name,
            )
            continue
        moved = _set_aside(root / name)
        moved_paths.append(moved)
        log.warning(
            "checkpoint %s does not verify (%s): set aside as %s", root / name, problem, moved.name
        )
    return moved_paths


def registered_names(snapshot: Mapping[str, object]) -> list[str]:
    """The checkpoint directory names a Ray Train registry holds (reported, latest and pending
    validation)."""
    registry = cast(Registry, snapshot)  # Ray's layout, or a KeyError / TypeError
    entries = [*registry["checkpoint_results"], *registry.get("pending_training_results", [])]
    latest = registry.get("latest_checkpoint_result")
    if latest is not None:
        entries.append(latest)
    return sorted({str(entry["checkpoint_dir_name"]) for entry in entries})


def without_checkpoints(snapshot: Mapping[str, object], names: set[str]) -> dict[str, object]:
    """A Ray Train registry without the checkpoints ``names``; the latest becomes the most recently
    reported of those left (None when none is), as Ray itself would have it had they never been
    reported."""

    def kept(entry: RegistryEntry) -> bool:
        return entry["checkpoint_dir_name"] not in names

    registry = cast(Registry, snapshot)  # Ray's layout, or a KeyError / TypeError
    out = dict(snapshot)
    pairs = zip(registry["checkpoint_results"], registry["checkpoint_report_indices"], strict=True)
    results = [(entry, index) for entry, index in pairs if kept(entry)]
    out["checkpoint_results"] = [entry for entry, _ in results]
    out["checkpoint_report_indices"] = [index for _, index in results]
    latest = registry.get("latest_checkpoint_result")
    if latest is not None and not kept(latest):
        out["latest_checkpoint_result"] = (
            max(results, key=lambda pair: pair[1])[0] if results else None
        )
    pending = zip(
        registry.get("pending_training_results", []),
        registry.get("pending_validation_specs", []),
        strict=True,
    )
    pending_kept = [(entry, spec) for entry, spec in pending if kept(entry)]
    out["pending_training_results"] = [entry for entry, _ in pending_kept]
    out["pending_validation_specs"] = [spec for _, spec in pending_kept]
    for key in NAME_LISTS:
        if key in out:
            out[key] = [name for name in cast(list[str], out[key]) if name not in names]
    return out


def _set_aside(path: Path) -> Path:
    """Rename ``path`` to a visibly named sibling ``<name>.damaged-<UTC time>`` that no glob of
    checkpoints or registry lookup matches; the first free name when one already exists."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}{DAMAGED}{stamp}")
    suffix = 1
    while target.exists():
        suffix += 1
        target = path.with_name(f"{path.name}{DAMAGED}{stamp}-{suffix}")
    path.rename(target)
    return target


def load_part(
    directory: Path, rank: int
) -> tuple[TrainState, RngState | None, list[dict[str, float]]]:
    """(model/optimiser/schedule state, this rank's RNG streams or None, the metrics so far) of a
    checkpoint."""
    directory = Path(directory)
    state = torch.load(directory / STATE, map_location="cpu", weights_only=True)
    # absent when resuming with more workers than before
    rng_path = directory / f"rng-rank{rank}.pt"
    rng = torch.load(rng_path, weights_only=True) if rng_path.is_file() else None
    lines = (directory / TRAIN_METRICS).read_text(encoding="utf-8").splitlines()
    return state, rng, [json.loads(line) for line in lines if line]


def load_best(directory: Path) -> BestState | None:
    """The best evaluated weights a checkpoint carries; None when it has none (no development set,
    or no evaluation that was not collapsed)."""
    path = Path(directory) / BEST
    if not path.is_file():
        return None
    return cast(BestState, torch.load(path, map_location="cpu", weights_only=True))
