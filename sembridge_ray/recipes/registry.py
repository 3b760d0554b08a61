"""The job registry: a job's name -> its run, ``run(cfg, inputs, executor=...)`` (``inputs``: the
identities of its inputs as the caller planned them; ``None`` identifies them anew), or, for a job
that needs no workers, ``run(cfg, inputs)``.

A job that runs other jobs' stages looks them up here by the name its stage records (the
reproduction's ``Stage.job``) and imports no other job's driver: the registry is the one module that
knows every job a stage may name, so adding a stage's job is one entry here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sembridge_ray.recipes.evaluate.run import run_evaluate
from sembridge_ray.recipes.finetune.run import run_finetune
from sembridge_ray.recipes.init.run import run_init
from sembridge_ray.recipes.reproduce.baselines import run_bm25, run_fusion
from sembridge_ray.runtime.executor import Executor


class Outcome(Protocol):
    """What every job's run returns: at least whether a finished output was skipped."""

    @property
    def skipped(self) -> bool: ...


Run = Callable[..., Outcome]
"""``(cfg, inputs[, executor=...]) -> its result``: each job takes its own config type."""

RUNS: dict[str, Run] = {"init": run_init, "finetune": run_finetune, "evaluate": run_evaluate}
"""The jobs whose work runs on an executor's workers."""
IN_PROCESS: dict[str, Run] = {"bm25": run_bm25, "fusion": run_fusion}
"""The jobs that run in the calling process (a BM25 index, a fusion of two runs)."""


def run(job: str, cfg: object, inputs: dict[str, str] | None, executor: Executor) -> Outcome:
    """Run job ``job`` with ``cfg`` (its config) and ``inputs``, its workers on ``executor``."""
    if job in IN_PROCESS:
        return IN_PROCESS[job](cfg, inputs)
    return RUNS[job](cfg, inputs, executor=executor)
