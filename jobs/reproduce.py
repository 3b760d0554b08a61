"""Reproduce the SemBridge paper's tables: cells of (model, language, method, α), each init -> per dataset
zero-shot eval -> fine-tune -> eval; results.csv, results.md, plots/.

    ray job submit --runtime-env cluster/runtime_env.yaml --working-dir . -- python -m jobs.reproduce \
        --preset paper --output /shared/outputs/paper --gpus-per-cell 1
    python -m jobs.reproduce --preset paper --output ROOT --dry-run      # the plan, contacting nothing
Offline miniature (2 CPUs, ~12 min): python -m jobs.reproduce --preset demo --output outputs/demo
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sembridge_ray.cli import Flag, flag_value, parse_config, run_job
from sembridge_ray.errors import InputError
from sembridge_ray.presets import PRESET_DIR
from sembridge_ray.reproduce.config import ReproduceConfig

FLAGS = [Flag("--preset", "preset"), Flag("--output", "output"), Flag("--dry-run", "dry_run", const="true"),
         Flag("--models", "models"), Flag("--languages", "languages"), Flag("--datasets", "datasets"),
         Flag("--methods", "methods"), Flag("--alphas", "alphas"), Flag("--max-concurrent", "max_concurrent"),
         Flag("--gpus-per-cell", "gpus_per_cell"),
         Flag("--overwrite", "overwrite", const="true")]


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)

    def body() -> int:
        cfg = parse_config(ReproduceConfig, args, flags=FLAGS, preset_dir=PRESET_DIR, prefix="reproduce_",
                           default_preset=flag_value(args, "--preset", "paper"), description=__doc__)
        if not cfg.output:
            raise InputError("--output ROOT is required")
        if cfg.dry_run:  # pure: imports no Ray, contacts nothing
            from sembridge_ray.reproduce.plan import dry_run

            print(json.dumps(dry_run(cfg), indent=2))
            return 0
        from sembridge_ray.distributed.reproduce import run_reproduce

        summary = run_reproduce(cfg)
        print(Path(cfg.output, "results.md").read_text(encoding="utf-8") + "\n" + json.dumps(summary, indent=2))
        return 1 if summary["failures"] else 0

    return run_job(body)


if __name__ == "__main__":
    sys.exit(main())
