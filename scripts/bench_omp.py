"""Time the batched OMP of the ``omp`` init method (``embed_init.omp.omp_weights``) against
scikit-learn's ``OrthogonalMatchingPursuit`` fitted row by row, on random unit anchors (bridge
vectors are unit vectors), the two interleaved so that a load change on shared cores hits both
alike.

    python scripts/bench_omp.py                      # 2,000 targets x 5,000 anchors x 384 dims, k=8, 3 repeats

Prints one JSON line: the median seconds of each, their ratio, the process' peak RSS (``getrusage``:
at the end, and before and after the first batched call, before scikit-learn ran), the threads, and
the largest coefficient difference between the two (and whether they chose the same atoms). Needs
scikit-learn (the ``dev`` extra)."""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
import warnings

import numpy as np
import torch
from sklearn.linear_model import OrthogonalMatchingPursuit

from sembridge_ray.embed_init.omp import omp_weights


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def sklearn_rows(targets: np.ndarray, atoms: np.ndarray, k: int) -> np.ndarray:
    """(n, K) coefficients, one scikit-learn fit per row (``X = atoms.T``, no intercept)."""
    out = np.zeros((len(targets), len(atoms)))
    design = np.asfortranarray(atoms.T)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an early stop on a zero residual
        for row, y in enumerate(targets):
            out[row] = (
                OrthogonalMatchingPursuit(n_nonzero_coefs=k, fit_intercept=False)
                .fit(design, y)
                .coef_
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=2000)
    parser.add_argument("--anchors", type=int, default=5000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    atoms = rng.standard_normal((args.anchors, args.dim))
    atoms /= np.linalg.norm(atoms, axis=1, keepdims=True)
    targets = rng.standard_normal((args.targets, args.dim))
    targets /= np.linalg.norm(targets, axis=1, keepdims=True)
    times: dict[str, list[float]] = {"omp": [], "sklearn": []}
    before_rss, first_rss = peak_rss_mib(), 0.0
    for _ in range(args.repeats):
        start = time.perf_counter()
        weights = omp_weights(torch.from_numpy(targets), torch.from_numpy(atoms), args.k)
        times["omp"].append(time.perf_counter() - start)
        first_rss = first_rss or peak_rss_mib()
        ours = weights.to_dense().numpy()
        start = time.perf_counter()
        theirs = sklearn_rows(targets, atoms, args.k)
        times["sklearn"].append(time.perf_counter() - start)
    omp_s, sklearn_s = statistics.median(times["omp"]), statistics.median(times["sklearn"])
    result = {
        "targets": args.targets,
        "anchors": args.anchors,
        "dim": args.dim,
        "k": args.k,
        "repeats": args.repeats,
        "omp_s": round(omp_s, 3),
        "sklearn_s": round(sklearn_s, 3),
        "speedup": round(sklearn_s / omp_s, 1),
        "omp_runs_s": [round(t, 3) for t in times["omp"]],
        "sklearn_runs_s": [round(t, 3) for t in times["sklearn"]],
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "peak_rss_before_mib": round(before_rss, 1),
        "peak_rss_after_first_omp_mib": round(first_rss, 1),
        "torch_threads": torch.get_num_threads(),
        "max_coef_diff": float(np.abs(ours - theirs).max()),
        "same_support": bool(np.array_equal(ours != 0, np.abs(theirs) > 1e-12)),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
