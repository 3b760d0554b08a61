"""Every setting does what it says, for the jobs that need Ray (``tests/dead_settings.py`` says
how): every key of the evaluate job; and fine-tuning's worker count, which
``tests/unit/test_dead_settings.py`` (one worker, in one process) cannot show. The one-process
fine-tuning there is checked here to be the job with one worker."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file

from sembridge_ray.distributed.executor import RayExecutor
from sembridge_ray.recipes.evaluate.config import EvaluateConfig
from sembridge_ray.recipes.evaluate.run import run_evaluate
from sembridge_ray.recipes.finetune import run as finetune_driver
from sembridge_ray.recipes.finetune.config import FinetuneConfig, OptimConfig
from sembridge_ray.retrieval.sources import resolve_dataset, resolve_model
from sembridge_ray.runtime.config import Config
from sembridge_ray.runtime.executor import LocalExecutor
from sembridge_ray.runtime.placement import ResourceConfig
from tests.dead_settings import Harness, check, copy_input, every_key_is_covered, files_of
from tests.unit.test_dead_settings import tiny_beir


def run_evaluate_job(cfg: Config, out: Path) -> dict[str, Any]:
    assert isinstance(cfg, EvaluateConfig)
    run_evaluate(replace(cfg, output=str(out)), executor=RayExecutor())
    found = files_of(out, skip=("identity.json", "config.yaml", "_SUCCESS", "cache"))
    # how the run went (cache hits, its shard actors' memory) and the inputs as named (compared by
    # content)
    for key in ("cache", "actors", "shards", "model", "dataset"):
        found["metrics.json"].pop(key)
    return found


def evaluate_inputs(cfg: Config) -> dict[str, str]:
    assert isinstance(cfg, EvaluateConfig)
    return {"model": resolve_model(cfg.model)[1], "dataset": resolve_dataset(cfg.dataset)[1]}


def test_every_evaluate_setting_does_what_its_identity_says(
    ray_cluster, fixtures_root: Path, tmp_path: Path
) -> None:
    beir = tiny_beir(tmp_path / "beir")
    harness = Harness(
        job="evaluate",
        cls=EvaluateConfig,
        base={
            "model": str(fixtures_root / "bert-splade"),
            "dataset": str(beir),
            "output": str(tmp_path / "out"),
            "precision": "fp32",
            "cache_dir": str(tmp_path / "cache"),
            "max_query_length": 16,
            "max_doc_length": 16,
        },
        run=run_evaluate_job,
        exempt={
            "overwrite": "how a rerun treats an existing output (tests/unit/test_outputs.py)",
            "output": "where the run writes: each run here writes into a directory of its own",
            "resources": "where the work runs (tests/ray/test_evaluate.py: one actor or several, the same vectors)",
        },
        rounding=("encode_batch_size", "stage_rows"),
        values={
            "precision": "bf16",
            "split": "dev",
            "top_k": 3,
            "doc_max_active_dims": 5,
            "query_max_active_dims": 3,
            # shorter than the texts: a length that truncates nothing changes nothing
            "max_query_length": 4,
            "max_doc_length": 4,
            "encode_batch_size": 3,
            "stage_rows": 5,
            "shard_size": 7,
            "query_batch_size": 2,
        },
        copies={k: copy_input for k in ("model", "dataset")},
        inputs=evaluate_inputs,
    )
    assert every_key_is_covered(harness) == []
    assert check(harness, tmp_path / "runs") == []


def _weights(model: Path) -> dict[str, np.ndarray]:
    return load_file(str(model / "model.safetensors"))


def test_one_ray_train_worker_is_the_local_run_and_two_train_apart(
    ray_cluster, fixtures_root: Path, tmp_path: Path
) -> None:
    """The job on the in-process executor (what the unit dead-setting check trains) is the job with
    one Ray Train worker, to float rounding (the worker's threads sum in another order); two workers
    train apart (each draws its own dropout masks), which is why the worker count is in the
    identity."""
    beir = tiny_beir(tmp_path / "beir")
    cfg = FinetuneConfig(
        model=str(fixtures_root / "bert-splade"),
        train=str(beir),
        max_query_length=12,
        max_doc_length=16,
        precision="fp32",
        optim=OptimConfig(batch_size=4, lr=1e-3),
        resources=ResourceConfig(workers=1),
    )
    here = replace(cfg, output=str(tmp_path / "local"))
    local = _weights(Path(finetune_driver.run_finetune(here, executor=LocalExecutor()).model))
    one = _weights(
        Path(
            finetune_driver.run_finetune(
                replace(cfg, output=str(tmp_path / "one")), executor=RayExecutor()
            ).model
        )
    )
    two_cfg = replace(cfg, output=str(tmp_path / "two"), resources=ResourceConfig(workers=2))
    two = _weights(Path(finetune_driver.run_finetune(two_cfg, executor=RayExecutor()).model))
    assert one.keys() == local.keys() == two.keys()
    for name in one:
        np.testing.assert_allclose(one[name], local[name], rtol=1e-4, atol=1e-6, err_msg=name)
    assert max(float(np.abs(one[n] - two[n]).max()) for n in one) > 1e-4
    assert cfg.identity("finetune", {}).fingerprint != two_cfg.identity("finetune", {}).fingerprint
