"""The MaLSTM calibration's bandwidth search against statsmodels' own (``jobs.bench_calibration``
runs it): synthetic scores shaped like an uncalibrated MaLSTM's, and both searches timed on the same
scores with statsmodels' leave-one-out error as the oracle."""

from __future__ import annotations

import time
import tracemalloc

import numpy as np

from sembridge_ray.siamese.calibration import fit_calibrator, search_bandwidth


def synthetic_scores(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(raw (n,), gold (n,)): gold on 1-5 and a compressed, bent, noisy raw score, like an
    uncalibrated MaLSTM."""
    gold = np.clip(rng.normal(3.5, 1.0, n), 1, 5)
    raw = np.clip(2.5 + 0.5 * (gold - 3) + 0.2 * np.sin(3 * gold) + rng.normal(0, 0.4, n), 1, 5)
    return raw, gold


def compare_with_statsmodels(raw: np.ndarray, gold: np.ndarray) -> dict[str, float | int | bool]:
    """Both searches on the same scores: times, bandwidths, and each bandwidth's LOO MSE by
    statsmodels' own ``cv_loo`` (the oracle), plus the fast search's peak traced allocation."""
    t0 = time.perf_counter()
    theirs = abs(float(fit_calibrator(raw, gold).bw[0]))
    t1 = time.perf_counter()
    ours = search_bandwidth(raw, gold)
    t2 = time.perf_counter()
    tracemalloc.start()
    search_bandwidth(raw, gold)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    oracle = fit_calibrator(raw, gold, 1.0)
    loo_theirs, loo_ours = (
        float(oracle.cv_loo(np.array([h]), oracle._est_loc_linear)[0]) for h in (theirs, ours.h)
    )
    return {
        "n": len(raw),
        "statsmodels_seconds": round(t1 - t0, 3),
        "ours_seconds": round(t2 - t1, 3),
        "speedup": round((t1 - t0) / (t2 - t1), 1),
        "bandwidth_statsmodels": theirs,
        "bandwidth_ours": ours.h,
        "loo_mse_statsmodels": loo_theirs,
        "loo_mse_ours": loo_ours,
        "ours_no_worse": loo_ours <= loo_theirs,
        "ours_evaluations": ours.evaluations,
        "ours_peak_alloc_mb": round(peak / 2**20, 1),
    }
