"""The init job through Ray Data equals the in-process result bit for bit; reruns skip; the job's
CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import ray.data
from safetensors.torch import load_file

from jobs import init_embeddings
from sembridge_ray.distributed import cluster
from sembridge_ray.distributed.executor import RayExecutor
from sembridge_ray.embed_init import bridge
from sembridge_ray.embed_init.config import MethodName
from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.recipes.init.run import initialise, run_init
from sembridge_ray.runtime.placement import ResourceConfig


@pytest.mark.parametrize(
    ("src", "tgt", "method", "options"),
    [
        ("roberta-mlm", "tok-unigram", "sembridge", {}),
        ("bert-mlm", "tok-bytebpe", "focus", {}),
        # SemBridge+'s options: a transform fit on every row before the batches, a blend and a refit
        # row by row in them
        (
            "bert-mlm",
            "tok-bytebpe",
            "sembridge",
            {"bridge_space": "abtt", "fvt_weight": 0.5, "lsq_ridge": 0.5},
        ),
    ],
)
def test_ray_pipeline_equals_in_process_bit_for_bit(
    ray_cluster: cluster.ClusterInfo,
    fixtures_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    src: str,
    tgt: str,
    method: MethodName,
    options: dict[str, Any],
) -> None:
    # actor pools, however small the fixture vocabularies
    monkeypatch.setattr(cluster, "IN_DRIVER_ROWS", 0)
    cfg = InitConfig(
        source_model=str(fixtures_root / src),
        target_tokenizer=str(fixtures_root / tgt),
        bridge_model=str(fixtures_root / "bridge"),
        method=method,
        rows_batch_size=200,
        bridge_batch_size=64,
        cache_dir=str(tmp_path / "cache-ray"),
        resources=ResourceConfig(workers=2),
    ).with_settings(**options)
    via_ray = run_init(replace(cfg, output=str(tmp_path / "ray")), executor=RayExecutor())
    local = initialise(
        replace(cfg, output=str(tmp_path / "local"), cache_dir=str(tmp_path / "cache-local"))
    )
    assert not via_ray.skipped
    a, b = (
        load_file(tmp_path / "ray" / "model" / "model.safetensors"),
        load_file(Path(local.output) / "model" / "model.safetensors"),
    )
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    assert pq.read_table(tmp_path / "ray" / "provenance.parquet").equals(
        pq.read_table(Path(local.output) / "provenance.parquet")
    )
    assert run_init(
        replace(cfg, output=str(tmp_path / "ray")), executor=RayExecutor()
    ).skipped  # complete: skipped


@pytest.mark.parametrize("workers", [1, 2])
def test_stages_in_the_driver_equal_the_actor_pools(
    ray_cluster: cluster.ClusterInfo,
    fixtures_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    workers: int,
) -> None:
    """Where ``cluster.in_driver`` says so (a small vocabulary; one worker on this one-node cluster,
    whatever the input) the bridge encoding and the weights run in the driver, the bridge model
    loaded once for both vocabularies, and the model and provenance are the actor pools' bit for
    bit."""
    cfg = InitConfig(
        source_model=str(fixtures_root / "bert-mlm"),
        target_tokenizer=str(fixtures_root / "tok-bytebpe"),
        bridge_model=str(fixtures_root / "bridge"),
        rows_batch_size=200,
        bridge_batch_size=64,
        resources=ResourceConfig(workers=workers, threads_per_worker=1),
    )
    with monkeypatch.context() as mp:
        mp.setattr(cluster, "in_driver", lambda plan, rows: False)
        pools = run_init(
            replace(cfg, output=str(tmp_path / "pools"), cache_dir=str(tmp_path / "c1")),
            executor=RayExecutor(),
        )
    loaded: list[object] = []
    load = bridge.BridgeEncodeUDF.__init__

    def counted(self: bridge.BridgeEncodeUDF, *args: Any, **kwargs: Any) -> None:
        loaded.append(kwargs.get("device"))
        load(self, *args, **kwargs)

    monkeypatch.setattr(bridge.BridgeEncodeUDF, "__init__", counted)
    monkeypatch.setattr(
        ray.data, "from_arrow", lambda *a, **k: pytest.fail("an actor pool started")
    )
    if workers == 1:
        # one worker on one node: the driver, whatever the size
        monkeypatch.setattr(cluster, "IN_DRIVER_ROWS", 0)
    here = run_init(
        replace(cfg, output=str(tmp_path / "driver"), cache_dir=str(tmp_path / "c2")),
        executor=RayExecutor(),
    )
    assert loaded == ["cpu"]  # once, for the source and the target vocabularies
    a, b = (load_file(Path(r.output) / "model" / "model.safetensors") for r in (pools, here))
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    assert pq.read_table(Path(pools.output) / "provenance.parquet").equals(
        pq.read_table(Path(here.output) / "provenance.parquet")
    )


def test_job_cli_smoke_and_bad_input(
    ray_cluster: cluster.ClusterInfo,
    fixtures_root: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [
        "--model",
        str(fixtures_root / "bert-mlm"),
        "--target-tokenizer",
        str(fixtures_root / "tok-wordpiece"),
        "--bridge-model",
        str(fixtures_root / "bridge"),
        "--output",
        str(tmp_path / "out"),
        "--alpha",
        "2",
        f"cache_dir={tmp_path / 'cache'}",
        "samples=3",
        "--workers",
        "1",
    ]
    assert init_embeddings.main(args) == 0
    printed = capsys.readouterr().out
    assert "top-3 source tokens" in printed
    assert json.loads((tmp_path / "out" / "init_report.json").read_text())["alpha"] == 2.0
    bad = [
        a.replace(str(fixtures_root / "bert-mlm"), str(tmp_path / "missing-model")).replace(
            "/out", "/out2"
        )
        for a in args
    ]
    assert init_embeddings.main(bad) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing-model" in err[0]
    assert not (tmp_path / "out2" / "_SUCCESS").exists()
