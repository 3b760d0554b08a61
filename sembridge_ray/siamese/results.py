"""From the restarts' predictions to the job's artefacts: pick the best restart by validation MSE,
calibrate it on validation, write the TSVs, and compute every reported metric from the TSVs as
written."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from statsmodels.nonparametric.kernel_regression import KernelReg

from sembridge_ray.runtime.outputs import atomic_write_json, atomic_write_text
from sembridge_ray.siamese import report as rep
from sembridge_ray.siamese.calibration import calibrate, fit_calibrator, search_bandwidth
from sembridge_ray.siamese.config import CalibrationConfig
from sembridge_ray.siamese.loop import RestartResult
from sembridge_ray.siamese.prepare import Prepared
from sembridge_ray.siamese.records import (
    CalibrationRecord,
    EnsembleRecord,
    Metrics,
    Report,
    RestartRecord,
    SplitMetrics,
)

log = logging.getLogger(__name__)


def calibrated(
    cfg: CalibrationConfig, val_pred: np.ndarray, val_gold: np.ndarray, *preds: np.ndarray
) -> tuple[list[np.ndarray], CalibrationRecord, KernelReg | None]:
    """Fit the calibrator on validation only and apply it to ``preds``: (calibrated arrays,
    calibration record, fitted KernelReg or None). With calibration off, predictions pass through
    unchanged."""
    if not cfg.enabled:
        return (
            list(preds),
            {"enabled": False, "bandwidth": None, "loo_mse": None, "n": len(val_pred)},
            None,
        )
    start = time.perf_counter()
    if cfg.bandwidth == "loo":
        bw = search_bandwidth(val_pred, val_gold)
        model = fit_calibrator(val_pred, val_gold, bw.h)
        h, loo, evaluations = bw.h, bw.loo_mse, bw.evaluations
    else:
        model = fit_calibrator(val_pred, val_gold)
        h = float(abs(model.bw[0]))
        # statsmodels returns the objective as a 1-element array, which NumPy 2 no longer turns into
        # a float
        loo = float(np.ravel(model.cv_loo(np.array([h]), model._est_loc_linear))[0])
        evaluations = None
    record: CalibrationRecord = {
        "enabled": True,
        "bandwidth": h,
        "loo_mse": loo,
        "n": len(val_pred),
        "method": cfg.bandwidth,
        "evaluations": evaluations,
        "seconds": round(time.perf_counter() - start, 3),
    }
    return [calibrate(model, p) for p in preds], record, model


def restart_record(r: RestartResult, data: Prepared, cfg: CalibrationConfig) -> RestartRecord:
    """One restart's line in report.json (its own calibration, fitted on its own validation
    predictions)."""
    (test_cal,), cal, _ = calibrated(cfg, r.val_pred, data.val.score, r.test_pred)
    return {
        "seed": r.seed,
        "val_mse": r.val_mse,
        "validation": {"raw": rep.metrics(r.val_pred, data.val.score)},
        "test": {
            "raw": rep.metrics(r.test_pred, data.test.score),
            "calibrated": rep.metrics(test_cal, data.test.score),
        },
        "bandwidth": cal["bandwidth"],
        "best_epoch": r.train.best_epoch,
        "epochs_run": r.train.epochs_run,
        "seconds": round(r.train.seconds + (r.pretrain.seconds if r.pretrain else 0.0), 1),
        "pretrain": None
        if r.pretrain is None
        else {
            "best_epoch": r.pretrain.best_epoch,
            "epochs_run": r.pretrain.epochs_run,
            "best_val_mse": r.pretrain.best_val_mse,
        },
    }


def write_results(
    out: Path,
    data: Prepared,
    results: Sequence[RestartResult],
    calibration: CalibrationConfig,
    *,
    source: str,
    add_ensemble: bool,
    seconds: dict[str, float],
    started: float,
) -> Report:
    """predictions.tsv, val_predictions.tsv, the plots, report.json and report.md; returns the
    report.

    ``source`` names the word vectors for the report; ``add_ensemble`` adds the mean of the restarts
    (ensemble_predictions.tsv). ``seconds`` holds the earlier stages' times; ``started`` (a
    ``time.perf_counter()``) dates the whole job.
    """
    best = min(results, key=lambda r: r.val_mse)
    (val_cal, test_cal), record, model = calibrated(
        calibration, best.val_pred, data.val.score, best.val_pred, best.test_pred
    )
    validation, test = _best_metrics(out, data, best, val_cal, test_cal, calibration.enabled)
    seeds = [restart_record(r, data, calibration) for r in results]
    report: Report = {
        "test": test,
        "validation": validation,
        "calibration": record,
        "data": {**data.counts, "vectors": source},
        "vectors": {"name": source, **data.counts.get("vectors", {})},
        "best_seed": best.seed,
        "seeds": seeds,
        "seed_summary": _seed_summary(seeds, test),
        "ensemble": ensemble(calibration, data, results, out) if add_ensemble else None,
        "paper": rep.PAPER,
        "seconds": seconds,
    }
    _plot_best(out, data, best, test_cal, model)
    seconds["total"] = round(time.perf_counter() - started, 1)  # dates the whole job
    atomic_write_json(out / "report.json", report)
    atomic_write_text(out / "report.md", rep.render_markdown(report))
    return report


def _written(path: Path, pair_ids: Sequence[str], columns: dict[str, np.ndarray]) -> SplitMetrics:
    """Write ``columns`` to the TSV ``path``; their metrics, computed from the file as read back."""
    rep.write_tsv(path, pair_ids, columns)
    return rep.split_metrics(rep.read_tsv(path)[1])


def _best_metrics(
    out: Path,
    data: Prepared,
    best: RestartResult,
    val_cal: np.ndarray,
    test_cal: np.ndarray,
    calibrated: bool,
) -> tuple[SplitMetrics, SplitMetrics]:
    """Write the best restart's val_predictions.tsv and predictions.tsv; (validation, test) metrics
    read back."""
    validation = _written(
        out / "val_predictions.tsv",
        data.val.pair_ids,
        {rep.GOLD: data.val.score, rep.RAW: best.val_pred},
    )
    test = _written(
        out / "predictions.tsv",
        data.test.pair_ids,
        {rep.GOLD: data.test.score, rep.RAW: best.test_pred, rep.CALIBRATED: test_cal},
    )
    if not calibrated:
        test.pop(rep.CALIBRATED)
    else:
        validation[rep.CALIBRATED] = rep.metrics(val_cal, data.val.score)
    return validation, test


def _plot_best(
    out: Path, data: Prepared, best: RestartResult, test_cal: np.ndarray, model: KernelReg | None
) -> None:
    """calibration.png (when calibrated) and scatter.png of the best restart."""
    if model is not None:
        grid = np.linspace(min(best.val_pred.min(), 1.0), max(best.val_pred.max(), 5.0), 200)
        rep.plot_calibration(
            out / "calibration.png", best.val_pred, data.val.score, grid, calibrate(model, grid)
        )
    rep.plot_scatter(
        out / "scatter.png",
        data.test.score,
        {rep.RAW: best.test_pred, **({rep.CALIBRATED: test_cal} if model is not None else {})},
    )


def _seed_summary(seeds: Sequence[RestartRecord], kinds: Iterable[str]) -> dict[str, Metrics]:
    """``test_<kind>_<metric>`` and ``val_mse`` -> mean, std and n over the restarts."""
    summary = {
        f"test_{kind}_{m}": rep.mean_std([s["test"][kind][m] for s in seeds])
        for kind in kinds
        for m in ("pearson", "spearman", "mse")
    }
    summary["val_mse"] = rep.mean_std([s["val_mse"] for s in seeds])
    return summary


def ensemble(
    cfg: CalibrationConfig, data: Prepared, results: Sequence[RestartResult], out: Path
) -> EnsembleRecord:
    """Not the paper's method: the mean of every restart's raw predictions, calibrated on validation
    like a single model; written to ensemble_predictions.tsv."""
    val = np.mean([r.val_pred for r in results], axis=0)
    test = np.mean([r.test_pred for r in results], axis=0)
    (test_cal,), calibration, _ = calibrated(cfg, val, data.val.score, test)
    return {
        "restarts": len(results),
        "test": _written(
            out / "ensemble_predictions.tsv",
            data.test.pair_ids,
            {rep.GOLD: data.test.score, rep.RAW: test, rep.CALIBRATED: test_cal},
        ),
        "validation": {"raw": rep.metrics(val, data.val.score)},
        "calibration": calibration,
    }
