"""The report, without Ray: the fast twin of tests/ray/test_malstm_job.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from sembridge_ray.data.schema import CALIBRATED, GOLD, RAW
from sembridge_ray.recipes.malstm.config import MalstmConfig
from sembridge_ray.siamese.data import EncodedPairs
from sembridge_ray.siamese.loop import FitResult, RestartResult
from sembridge_ray.siamese.prepare import Prepared
from sembridge_ray.siamese.records import Report
from sembridge_ray.siamese.report import metrics, read_tsv
from sembridge_ray.siamese.results import write_results


def _pairs(n: int, rng: np.random.Generator, prefix: str) -> EncodedPairs:
    ids = np.ones((n, 1), dtype=np.int64)
    lengths = np.ones(n, dtype=np.int64)
    return EncodedPairs(
        pair_ids=tuple(f"{prefix}{i}" for i in range(n)),
        ids_a=ids,
        len_a=lengths,
        ids_b=ids,
        len_b=lengths,
        score=np.round(rng.uniform(1, 5, n), 1),
    )


def _restart(seed: int, data: Prepared, noise: float, rng: np.random.Generator) -> RestartResult:
    def pred(gold: np.ndarray) -> np.ndarray:
        return np.clip(2 + 0.5 * (gold - 3) + rng.normal(0, noise, len(gold)), 1, 5)

    val, test = pred(data.val.score), pred(data.test.score)
    fit = FitResult(
        best_epoch=3,
        best_val_mse=float(np.mean((val - data.val.score) ** 2)),
        epochs_run=5,
        val_curve=(1.0,),
        seconds=0.1,
    )
    return RestartResult(
        seed=seed, val_pred=val, test_pred=test, val_mse=fit.best_val_mse, pretrain=None, train=fit
    )


@pytest.fixture
def data() -> Prepared:
    rng = np.random.default_rng(0)
    return Prepared(
        embeddings=np.zeros((2, 3), np.float32),
        train=_pairs(20, rng, "t"),
        val=_pairs(120, rng, "v"),
        test=_pairs(300, rng, "x"),
        sts_train=None,
        sts_val=None,
        counts={"sick_train": 20, "sick_validation": 120, "sick_test": 300, "augmented": 0},
    )


def _run(tmp_path: Path, data: Prepared, cfg: MalstmConfig) -> Report:
    rng = np.random.default_rng(1)
    results = [_restart(seed, data, noise, rng) for seed, noise in ((0, 0.9), (1, 0.3), (2, 0.6))]
    return write_results(
        tmp_path,
        data,
        results,
        cfg.calibration,
        source=cfg.vectors.source,
        add_ensemble=cfg.ensemble,
        seconds={"prepare": 0.0},
        started=time.perf_counter(),
    )


def test_best_restart_by_validation_mse_and_exact_recomputation(
    tmp_path: Path, data: Prepared
) -> None:
    report = _run(tmp_path, data, MalstmConfig(ensemble=True))
    assert report["best_seed"] == 1  # the least noisy restart has the lowest validation MSE
    test = read_tsv(tmp_path / "predictions.tsv")[1]
    assert report["test"] == {
        RAW: metrics(test[RAW], test[GOLD]),
        CALIBRATED: metrics(test[CALIBRATED], test[GOLD]),
    }
    assert json.loads((tmp_path / "report.json").read_text())["test"] == report["test"]
    assert report["seed_summary"]["test_calibrated_pearson"]["n"] == 3
    ens = read_tsv(tmp_path / "ensemble_predictions.tsv")[1]
    ensemble = report["ensemble"]
    assert ensemble is not None and ensemble["test"][CALIBRATED] == metrics(
        ens[CALIBRATED], ens[GOLD]
    )
    assert {"report.md", "calibration.png", "scatter.png", "val_predictions.tsv"} <= {
        p.name for p in tmp_path.iterdir()
    }


def test_without_calibration_the_calibrated_column_repeats_raw(
    tmp_path: Path, data: Prepared
) -> None:
    report = _run(tmp_path, data, MalstmConfig().with_overrides(["calibration.enabled=false"]))
    test = read_tsv(tmp_path / "predictions.tsv")[1]
    np.testing.assert_array_equal(test[CALIBRATED], test[RAW])
    assert set(report["test"]) == {RAW} and report["calibration"]["bandwidth"] is None
    assert not (tmp_path / "calibration.png").exists()
