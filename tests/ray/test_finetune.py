"""Fine-tuning on Ray Train: a 2-worker CPU run on a BEIR directory, and resume after the driver is
killed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sembridge_ray.distributed.executor import RayExecutor
from sembridge_ray.recipes.evaluate.config import EvaluateConfig
from sembridge_ray.recipes.finetune.config import FinetuneConfig, LossConfig, OptimConfig
from sembridge_ray.runtime.outputs import is_complete
from tests.conftest import REPO

METRIC_KEYS = {
    "step",
    "loss",
    "infonce",
    "flops_q",
    "flops_d",
    "lambda_q",
    "lambda_d",
    "active_dims_q",
    "active_dims_d",
    "lr",
    "examples_per_s",
}


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_two_worker_run_writes_a_sparse_encoder_and_per_step_metrics(
    ray_cluster, fixtures_root, sick_beir, tmp_path
) -> None:
    from sentence_transformers import SparseEncoder

    from sembridge_ray.recipes.finetune.run import run_finetune

    cfg = FinetuneConfig(
        model=str(fixtures_root / "bert-mlm"),
        train=str(sick_beir),
        output=str(tmp_path / "ft"),
        max_query_length=32,
        max_doc_length=64,
        checkpoint_every=2,
        log_every=1,
        optim=OptimConfig(batch_size=8, max_steps=4, lr=1e-4),
        loss=LossConfig(lambda_q=1e-3),
    )
    result = run_finetune(cfg, executor=RayExecutor())
    out = Path(result.output)
    assert result.ok and result.workers == 2 and result.steps == 4 and result.resumed_from is None
    metrics = _metrics(out)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert all(set(m) >= METRIC_KEYS for m in metrics)
    assert all(
        m["flops_q"] > 0 and m["active_dims_d"] > 0 and m["examples_per_s"] > 0 for m in metrics
    )
    model = SparseEncoder(result.model, device="cpu")
    assert model.get_embedding_dimension() == 2000  # right on load, before any encode
    emb = model.encode(["a man is playing a guitar"], convert_to_tensor=True)
    assert emb.shape[-1] == 2000 and emb.to_dense().count_nonzero() > 0
    # the published model encodes documents as the evaluate job scores them (its default
    # max_doc_length)
    from tests.unit.test_published_model import LONG_TEXTS, assert_encodes_as_evaluated

    assert_encodes_as_evaluated(result.model, LONG_TEXTS[:20], EvaluateConfig())
    assert (out / "config.yaml").is_file() and is_complete(out)
    assert sorted(p.name for p in (out / "checkpoints").glob("finetune-*/step_*")) == [
        "step_00000002",
        "step_00000004",
    ]
    again = run_finetune(cfg, executor=RayExecutor())
    assert again.skipped and again.steps == 4


@pytest.mark.slow  # about 1.5 min (four fine-tunings): CI's slow step
def test_one_writer_per_output_then_other_settings_refused_and_overwrite_redone(
    ray_cluster, fixtures_root, sick_beir, tmp_path, capsys
) -> None:
    import yaml

    from jobs import finetune

    out = tmp_path / "ft"
    args = [
        "--config",
        "smoke",
        "--model",
        str(fixtures_root / "bert-mlm"),
        "--train",
        str(sick_beir),
        "--output",
        str(out),
        "--max-steps",
        "4",
        "--checkpoint-every",
        "2",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    env.pop("RAY_ADDRESS", None)
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(
            [sys.executable, "-m", "jobs.finetune", *args, "--lr", "1e-4"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=log,
        )
        deadline = time.time() + 120
        while not (out / ".lock").exists() and first.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert (out / ".lock").exists(), (tmp_path / "first.log").read_text()[-2000:]
        assert finetune.main([*args, "--lr", "3e-4"]) == 2  # refused at once, before any work
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"is locked by pid {first.pid} on host" in err[0]
        assert first.wait(timeout=600) == 0, (tmp_path / "first.log").read_text()[-3000:]
    assert (
        is_complete(out)
        and yaml.safe_load((out / "config.yaml").read_text())["optim"]["lr"] == 1e-4
    )

    assert finetune.main([*args, "--lr", "3e-4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "optim.lr: 0.0001 → 0.0003" in err[0]
    assert finetune.main([*args, "--lr", "3e-4", "--max-steps", "2", "--overwrite"]) == 0
    assert yaml.safe_load((out / "config.yaml").read_text())["optim"]["lr"] == 3e-4 and is_complete(
        out
    )
    runs = list((out / "checkpoints").glob("finetune-*"))
    assert len(runs) == 1 and sorted(p.name for p in runs[0].glob("step_*")) == ["step_00000002"]
    assert [m["step"] for m in _metrics(out)] == [1, 2]


def test_a_cluster_that_fits_fewer_workers_than_asked_is_refused_before_the_output(
    ray_cluster, fixtures_root, sick_beir, tmp_path
) -> None:
    """The worker count is in the run's identity (each rank draws its own dropout masks): a run
    never trains on fewer workers than its identity records."""
    import pytest

    from sembridge_ray.recipes.finetune.run import run_finetune
    from sembridge_ray.runtime.errors import InputError
    from sembridge_ray.runtime.placement import ResourceConfig

    cfg = FinetuneConfig(
        model=str(fixtures_root / "bert-mlm"),
        train=str(sick_beir),
        output=str(tmp_path / "ft"),
        optim=OptimConfig(batch_size=8, max_steps=2),
        resources=ResourceConfig(workers=3),
    )
    with pytest.raises(InputError, match="asks for 3 workers but the cluster fits 2"):
        run_finetune(cfg, executor=RayExecutor())
    assert not (tmp_path / "ft").exists()
    one, two = (
        cfg.identity("finetune", {})
        for cfg in (FinetuneConfig(resources=ResourceConfig(workers=1)), cfg)
    )
    assert one.fingerprint != two.fingerprint
