"""The five jobs and their typed contracts, one module each, named after the job:

- ``init``: ``sembridge init`` / ``python -m jobs.init_embeddings``; ``InitConfig`` → ``InitResult``; Ray driver
  ``distributed/init.py``
- ``finetune``: ``sembridge finetune`` / ``python -m jobs.finetune``; ``FinetuneConfig`` → ``FinetuneResult``;
  ``distributed/finetune.py``
- ``evaluate``: ``sembridge evaluate`` / ``python -m jobs.evaluate``; ``EvaluateConfig`` → ``EvaluateResult``;
  ``distributed/evaluate.py``
- ``malstm``: ``sembridge malstm`` / ``python -m jobs.malstm``; ``MalstmConfig`` → ``MalstmResult``;
  ``distributed/malstm.py``
- ``reproduce``: ``sembridge reproduce`` / ``python -m jobs.reproduce``; ``ReproduceConfig`` → ``ReproduceResult``;
  ``distributed/reproduce.py``

Each module defines the job's frozen, keyword-only config (which checks its values when built), its result, its
named flags and ``JOB``, the :class:`JobSpec` the command line runs. Presets live in ``sembridge_ray/presets`` as
``<job>_<name>.yaml`` and list only their deltas from the dataclass defaults.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sembridge_ray.config import Config, load_preset, merge

JOBS = ("init", "finetune", "evaluate", "malstm", "reproduce")
PRESET_DIR = Path(__file__).resolve().parent.parent / "presets"


@dataclass(frozen=True, kw_only=True)
class Flag:
    """A named flag mapped onto a config key; ``const`` makes it a switch (``--dry-run`` -> ``dry_run=true``).
    ``aliases`` are older spellings, still accepted."""

    name: str
    key: str
    const: str | None = None
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """What the command line needs to run a job."""

    name: str
    entry: str
    """The checkout entrypoint module (``python -m jobs.<entry>``)."""
    config: type[Config]
    flags: tuple[Flag, ...]
    run: Callable[[Any], Any]
    """config -> result (imports Ray only when called)."""
    report: Callable[[Any], str]
    """result -> what the command prints at the end."""
    summary: str
    """One line for ``sembridge --help``."""
    default_preset: str | None = None
    description: str = ""


def job_spec(name: str) -> JobSpec:
    if name not in JOBS:
        raise KeyError(name)
    return importlib.import_module(f"sembridge_ray.jobs.{name}").JOB  # type: ignore[no-any-return]


def presets(job: str) -> list[str]:
    """The preset names of a job (``<job>_<name>.yaml``)."""
    return sorted(p.stem[len(job) + 1 :] for p in PRESET_DIR.glob(f"{job}_*.yaml"))


def load_preset_file(path: Path) -> Config:
    """Build the config a preset file describes (its job is the file name's prefix before ``_``)."""
    cls = job_spec(Path(path).stem.split("_", 1)[0]).config
    return cls.from_dict(merge(cls().to_dict(), load_preset(Path(path))))
