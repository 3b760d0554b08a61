"""Fine-tune a SparseEncoder with InfoNCE + FLOPs on Ray Train (DDP; resumes from its latest checkpoint).

    ray job submit --runtime-env cluster/runtime_env.yaml --working-dir . -- python -m jobs.finetune \
        --config paper --model /shared/init/ar --train webfaq:ar --output /shared/ft/ar --workers 4
Smoke (2 CPUs, ~1 min):
    python -m sembridge_ray.testing --out /tmp/fx
    python -c "from sembridge_ray.data.sick import write_sick_beir as w; from sembridge_ray.resources import \
SICK_DIR; w(SICK_DIR, '/tmp/sick-beir', limit=400)"
    python -m jobs.finetune --config smoke --model /tmp/fx/bert-mlm --train /tmp/sick-beir --output /tmp/ft
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from sembridge_ray.cli import Flag, parse_config, run_job
from sembridge_ray.presets import PRESET_DIR
from sembridge_ray.sparse.config import FinetuneConfig

FLAGS = [Flag("--model", "model"), Flag("--train", "train"), Flag("--output", "output"),
         Flag("--workers", "resources.workers"), Flag("--gpus-per-worker", "resources.gpus_per_worker"),
         Flag("--batch-size", "optim.batch_size"), Flag("--lr", "optim.lr"), Flag("--epochs", "optim.epochs"),
         Flag("--max-steps", "optim.max_steps"), Flag("--lambda-q", "loss.lambda_q"),
         Flag("--lambda-d", "loss.lambda_d"), Flag("--checkpoint-every", "checkpoint_every"),
         Flag("--bf16", "optim.bf16"), Flag("--max-query-length", "max_query_length"),
         Flag("--max-doc-length", "max_doc_length"),
         Flag("--overwrite", "overwrite", const="true")]


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        cfg = parse_config(FinetuneConfig, argv, flags=FLAGS, preset_dir=PRESET_DIR, prefix="finetune_",
                           description=__doc__)
        from sembridge_ray.distributed.train import run_finetune

        result = run_finetune(cfg)
        print(json.dumps(asdict(result), indent=2))
        return 0 if result.ok else 1

    return run_job(body)


if __name__ == "__main__":
    sys.exit(main())
