"""An input replaced by an ``--overwrite`` while an evaluation, an export or a fine-tuning reads it
fails that run (one line, nothing marked complete), and no encoding of the new model is cached under
the old model's key: a later run of each model gets its own vectors and its own scores (issue 33,
point 2; issue 42, point 1: the export)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sembridge_ray.distributed.executor import RayExecutor
from sembridge_ray.publish import scores_of
from sembridge_ray.recipes.evaluate import run as evaluate_driver
from sembridge_ray.recipes.evaluate.config import EvaluateConfig
from sembridge_ray.recipes.export import run as export_driver
from sembridge_ray.recipes.export.config import ExportConfig
from sembridge_ray.recipes.finetune import run as finetune_driver
from sembridge_ray.recipes.finetune.config import FinetuneConfig, OptimConfig
from sembridge_ray.retrieval import encode as encode_step
from sembridge_ray.runtime.identity import InputChanged, path_identity
from sembridge_ray.runtime.outputs import SUCCESS
from sembridge_ray.runtime.placement import ResourceConfig
from sembridge_ray.sparse.encode_files import SparseEncodeUDF
from tests.unit.test_pinned_inputs import init_output, overwrite_swap


def _evaluate(model: Path, dataset: Path, out: Path, cache: Path) -> float:
    cfg = EvaluateConfig(
        model=str(model),
        dataset=str(dataset),
        output=str(out),
        cache_dir=str(cache),
        max_query_length=16,
        max_doc_length=32,
    )
    return float(evaluate_driver.run_evaluate(cfg, executor=RayExecutor()).metrics["nDCG@10"])


def _export(model: Path, dataset: Path, out: Path, cache: Path) -> float:
    cfg = ExportConfig(
        target="opensearch",
        model=str(model),
        dataset=str(dataset),
        output=str(out),
        cache_dir=str(cache),
        max_query_length=16,
        max_doc_length=32,
        resources=ResourceConfig(workers=1),
    )
    report = export_driver.run_export(cfg, executor=RayExecutor()).report
    assert report is not None
    return float(report["ndcg@10_exact"] or 0.0)


ENCODING_JOBS: dict[str, Callable[[Path, Path, Path, Path], float]] = {
    "evaluate": _evaluate,
    "export": _export,
}
"""Every job that fills the shared encode cache (``tests/unit/test_pinned_inputs.py`` checks that
no other does), run on (model, dataset, output, cache): its nDCG@10."""


@pytest.mark.parametrize("job", sorted(ENCODING_JOBS))
def test_a_model_replaced_before_the_encoder_loads_it_fails_the_job_and_poisons_no_cache(
    job: str,
    ray_cluster,
    fixtures_root: Path,
    sick_beir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 33 point 2 for evaluate, issue 42 point 1 for export: the job fails with one line and
    nothing of the new weights is cached under the old model's key, so a later, undisturbed run of
    the model now at that path scores as its own copy does."""
    run = ENCODING_JOBS[job]
    a = init_output(fixtures_root, tmp_path / "a", tmp_path / "bridge-cache")
    b = init_output(fixtures_root, tmp_path / "b", tmp_path / "bridge-cache", alpha=2.0)
    b_copy = init_output(fixtures_root, tmp_path / "b-copy", tmp_path / "bridge-cache", alpha=2.0)
    cache = tmp_path / "encode-cache"
    real = SparseEncodeUDF

    class SwappedFirst(real):  # type: ignore[misc, valid-type]
        """An ``init --overwrite`` of ``a`` finishes between the job's identity and its encoder's
        load."""

        def __init__(self, *args: object, **kwargs: object) -> None:
            if (b / "model").exists():
                overwrite_swap(a, b)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(encode_step, "SparseEncodeUDF", SwappedFirst)
    with pytest.raises(
        InputChanged, match=r"input model .*/a/model changed while this run was reading it"
    ):
        run(a / "model", sick_beir, tmp_path / "first", cache)
    assert not (tmp_path / "first" / SUCCESS).exists()
    assert [p.name for p in cache.glob("*") if not p.name.startswith(".tmp-")] == []
    monkeypatch.setattr(encode_step, "SparseEncodeUDF", real)
    # the model now at a is b's: run there and on its own copy, the same vectors and scores
    now = run(a / "model", sick_beir, tmp_path / "again", cache)
    assert now == run(b_copy / "model", sick_beir, tmp_path / "copy", tmp_path / "c2")
    if job == "evaluate":  # the evaluation names the model now at a: its scores publish with it
        scores = scores_of(path_identity(a / "model"), "", [str(tmp_path / "again")]).own
        assert [e["metrics"]["nDCG@10"] for e in scores] == [round(now, 4)]


def test_a_model_replaced_while_it_trains_fails_the_fine_tuning_unfinished(
    ray_cluster,
    fixtures_root: Path,
    sick_beir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a = init_output(fixtures_root, tmp_path / "a", tmp_path / "bridge-cache")
    b = init_output(fixtures_root, tmp_path / "b", tmp_path / "bridge-cache", alpha=2.0)

    def swapped_after(real: Callable[..., Any]) -> Callable[..., Any]:
        def swapped_while_training(*args: Any, **kwargs: Any) -> Any:
            result = real(*args, **kwargs)  # the workers loaded a's model and trained it
            overwrite_swap(a, b)  # and an --overwrite replaced it meanwhile
            return result

        return swapped_while_training

    # Ray Train's workers, or (one CPU worker on one node) the driver itself
    monkeypatch.setattr(RayExecutor, "train", swapped_after(RayExecutor.train))
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
        finetune_driver.run_finetune(cfg, executor=RayExecutor())
    assert not (tmp_path / "ft" / SUCCESS).exists()
