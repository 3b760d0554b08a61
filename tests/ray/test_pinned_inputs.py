"""An input replaced by an ``--overwrite`` while an evaluation or a fine-tuning reads it fails that
run (one line, nothing marked complete), and no encoding of the new model is cached under the old
model's key: a later evaluation of each model gets its own vectors and its own scores (issue 33,
point 2)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sembridge_ray.distributed import evaluate as evaluate_driver
from sembridge_ray.distributed import finetune as finetune_driver
from sembridge_ray.identity import InputChanged
from sembridge_ray.jobs.evaluate import EvaluateConfig
from sembridge_ray.jobs.finetune import FinetuneConfig, OptimConfig
from sembridge_ray.outputs import SUCCESS
from sembridge_ray.placement import ResourceConfig
from tests.unit.test_pinned_inputs import init_output, overwrite_swap


def test_a_model_replaced_before_the_encoder_loads_it_fails_the_evaluation_and_poisons_no_cache(
    ray_cluster,
    fixtures_root: Path,
    sick_beir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a = init_output(fixtures_root, tmp_path / "a", tmp_path / "bridge-cache")
    b = init_output(fixtures_root, tmp_path / "b", tmp_path / "bridge-cache", alpha=2.0)
    b_copy = init_output(fixtures_root, tmp_path / "b-copy", tmp_path / "bridge-cache", alpha=2.0)
    cache = tmp_path / "encode-cache"
    cfg = EvaluateConfig(
        model=str(a / "model"),
        dataset=str(sick_beir),
        output=str(tmp_path / "eval-a"),
        cache_dir=str(cache),
        max_query_length=16,
        max_doc_length=32,
    )
    real = evaluate_driver.SparseEncodeUDF

    class SwappedFirst(real):  # type: ignore[misc, valid-type]
        """An ``init --overwrite`` of ``a`` finishes between the evaluation's identity and its
        encoder's load."""

        def __init__(self, *args: object, **kwargs: object) -> None:
            if (b / "model").exists():
                overwrite_swap(a, b)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(evaluate_driver, "SparseEncodeUDF", SwappedFirst)
    with pytest.raises(
        InputChanged, match=r"input model .*/a/model changed while this run was reading it"
    ):
        evaluate_driver.run_evaluate(cfg)
    assert not (tmp_path / "eval-a" / SUCCESS).exists()
    assert [p.name for p in cache.glob("*") if not p.name.startswith(".tmp-")] == []
    monkeypatch.setattr(evaluate_driver, "SparseEncodeUDF", real)
    # the model now at a is b's: evaluated there and as its own copy, the same vectors and scores
    now = evaluate_driver.run_evaluate(replace(cfg, output=str(tmp_path / "eval-a2")))
    copy = evaluate_driver.run_evaluate(
        replace(
            cfg,
            model=str(b_copy / "model"),
            output=str(tmp_path / "eval-b"),
            cache_dir=str(tmp_path / "c2"),
        )
    )
    assert now.metrics["nDCG@10"] == copy.metrics["nDCG@10"]
    scores = json.loads((a / "model" / "scores.json").read_text())["evaluations"]
    assert [e["metrics"]["nDCG@10"] for e in scores] == [round(now.metrics["nDCG@10"], 4)]


def test_a_model_replaced_while_it_trains_fails_the_fine_tuning_unfinished(
    ray_cluster,
    fixtures_root: Path,
    sick_beir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a = init_output(fixtures_root, tmp_path / "a", tmp_path / "bridge-cache")
    b = init_output(fixtures_root, tmp_path / "b", tmp_path / "bridge-cache", alpha=2.0)
    real = finetune_driver._fit

    def swapped_while_training(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)  # the workers loaded a's model and trained it
        overwrite_swap(a, b)  # and an --overwrite replaced it meanwhile
        return result

    monkeypatch.setattr(finetune_driver, "_fit", swapped_while_training)
    cfg = FinetuneConfig(
        model=str(a / "model"),
        train=str(sick_beir),
        output=str(tmp_path / "ft"),
        max_query_length=16,
        max_doc_length=32,
        optim=OptimConfig(batch_size=4, max_steps=2),
        resources=ResourceConfig(workers=1),
    )
    with pytest.raises(
        InputChanged, match=r"input model .*/a/model changed while this run was reading it"
    ):
        finetune_driver.run_finetune(cfg)
    assert not (tmp_path / "ft" / SUCCESS).exists()
