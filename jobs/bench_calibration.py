"""Bandwidth search for the MaLSTM calibration: the vectorised exact leave-one-out search against
statsmodels' cv_ls.

Prints one JSON line: both bandwidths, their LOO MSE by statsmodels' own ``cv_loo``, times,
speed-up, peak memory.
    python -m jobs.bench_calibration                          # synthetic scores, n = 4,500
    python -m jobs.bench_calibration --predictions OUT/val_predictions.tsv
"""

from __future__ import annotations

import argparse
import json
import resource
import sys

import numpy as np

from benchmarks.calibration import compare_with_statsmodels, synthetic_scores
from sembridge_ray.data.schema import GOLD, RAW
from sembridge_ray.siamese.report import read_tsv


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--predictions", help="a val_predictions.tsv (pair_ID, gold, raw); default: synthetic"
    )
    parser.add_argument("--n", type=int, default=4500, help="synthetic pairs (default 4,500)")
    args = parser.parse_args(argv)
    if args.predictions:
        cols = read_tsv(args.predictions)[1]
        raw, gold = cols[RAW], cols[GOLD]
    else:
        raw, gold = synthetic_scores(args.n, np.random.default_rng(0))
    result = compare_with_statsmodels(raw, gold)
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps({"source": args.predictions or "synthetic", **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
