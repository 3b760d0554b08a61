"""Initialise a target-language sparse encoder with SemBridge (or a baseline), as a Ray Data job.

    ray job submit --runtime-env cluster/runtime_env.yaml --working-dir . -- python -m jobs.init_embeddings \
        --source-model naver/splade-v3 --target-tokenizer monologg/kobigbird-bert-base --bridge-model BAAI/bge-m3 \
        --output /shared/init/splade-v3-ko
    python -m jobs.init_embeddings --grid paper --output ROOT [--dry-run]
Smoke (2 CPUs, ~30 s):  python -m jobs.init_embeddings --config smoke --output /tmp/init-smoke
"""

from __future__ import annotations

import json
import sys

from sembridge_ray.cli import Flag, parse_config, run_job
from sembridge_ray.embed_init.config import InitConfig
from sembridge_ray.presets import PRESET_DIR

FLAGS = [Flag("--source-model", "source_model"), Flag("--target-tokenizer", "target_tokenizer"),
         Flag("--bridge-model", "bridge_model"), Flag("--output", "output"), Flag("--alpha", "alpha"),
         Flag("--method", "method"), Flag("--bias", "bias"), Flag("--match", "match"), Flag("--seed", "seed"),
         Flag("--grid", "grid"), Flag("--dry-run", "dry_run", const="true"), Flag("--workers", "resources.workers"),
         Flag("--trust-remote-code", "trust_remote_code", const="true"),
         Flag("--overwrite", "overwrite", const="true")]


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        cfg = parse_config(InitConfig, argv, flags=FLAGS, preset_dir=PRESET_DIR, prefix="init_", description=__doc__)
        from sembridge_ray.distributed import init_pipeline as pipe
        from sembridge_ray.embed_init.report import sample_table

        if cfg.grid:
            cells = pipe.grid_cells(cfg)
            if cfg.dry_run:
                print(json.dumps(pipe.grid_plan(cells), indent=2))
                return 0
            failures = pipe.run_grid(cfg)
            print(json.dumps({"cells": len(cells), "failures": failures}, indent=2))
            return 1 if failures else 0
        report = pipe.run_init(cfg).report
        print(sample_table(report["samples"]))
        print(json.dumps({k: report[k] for k in ("kinds", "match_rules", "support_histogram", "timings")}))
        return 0

    return run_job(body)


if __name__ == "__main__":
    sys.exit(main())
