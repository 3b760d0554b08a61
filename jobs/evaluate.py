"""Evaluate a sparse encoder on a retrieval set: Ray Data encoding, exact sharded top-k, ir-measures nDCG@10.

    ray job submit --runtime-env cluster/runtime_env.yaml --working-dir . -- python -m jobs.evaluate \\
        --model /shared/models/splade-ar --dataset miracl:ar --split test --output /shared/out/eval-ar --workers 4
Smoke (2 CPUs, ~1 min):  python -m jobs.evaluate --config smoke --output /tmp/eval_smoke

Writes run.trec, metrics.json (nDCG@10, R@100, RR@10 over every qrels query, plus sparsity statistics),
config.yaml and _SUCCESS. Encodings are cached (cache_dir=...), so re-scoring skips the encoder.
"""

from __future__ import annotations

import json
import sys

from sembridge_ray.cli import Flag, parse_config, run_job
from sembridge_ray.presets import PRESET_DIR
from sembridge_ray.retrieval.config import EvaluateConfig

FLAGS = [Flag("--model", "model"), Flag("--dataset", "dataset"), Flag("--split", "split"),
         Flag("--output", "output"), Flag("--top-k", "top_k"), Flag("--workers", "resources.workers"),
         Flag("--shard-size", "shard_size"), Flag("--doc-top-k", "doc_top_k"),
         Flag("--overwrite", "overwrite", const="true")]


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        cfg = parse_config(EvaluateConfig, argv, flags=FLAGS, preset_dir=PRESET_DIR, prefix="evaluate_",
                           description=__doc__)
        from sembridge_ray.distributed.eval_pipeline import run_evaluate

        metrics = run_evaluate(cfg)
        summary = {k: metrics[k] for k in ("nDCG@10", "R@100", "RR@10", "num_queries", "num_docs")}
        print(json.dumps(summary, indent=2))
        return 0

    return run_job(body)


if __name__ == "__main__":
    sys.exit(main())
