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
from typing import Any, Generic, TypeVar

from sembridge_ray.config import Config, load_preset, merge

C = TypeVar("C", bound=Config)
R = TypeVar("R")
JOBS = ("init", "finetune", "evaluate", "malstm", "reproduce", "export")
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
class JobSpec(Generic[C, R]):
    """What the command line needs to run a job: its contract (config, flags, report) and where its driver is.

    The driver is named by import path (``module:function``), so a contract imports nothing above the sections it
    composes, and the command line imports a job's driver (and Ray) only when it runs."""

    name: str
    entry: str
    """The checkout entrypoint module (``python -m jobs.<entry>``)."""
    config: type[C]
    flags: tuple[Flag, ...]
    driver: str
    """``module:function`` taking the config and returning the result."""
    report: Callable[[R], str]
    """result -> what the command prints at the end."""
    summary: str
    """One line for ``sembridge --help``."""
    dry_driver: str = ""
    """``module:function`` for a config whose ``dry_run`` is set (a plan, no work), when the job has one."""
    default_preset: str | None = None
    description: str = ""

    def run(self, cfg: C) -> R:
        """Import the job's driver and run ``cfg`` through it."""
        target = self.dry_driver if self.dry_driver and getattr(cfg, "dry_run", False) else self.driver
        module, _, function = target.partition(":")
        driver: Callable[[C], R] = getattr(importlib.import_module(module), function)
        return driver(cfg)


def job_spec(name: str) -> JobSpec[Any, Any]:
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
