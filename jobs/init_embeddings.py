"""Initialise a target-language sparse encoder with SemBridge (or a baseline), as a Ray Data job.

    ray job submit --runtime-env cluster/runtime_env.yaml --working-dir . -- python -m jobs.init_embeddings \
        --model naver/splade-v3 --target-tokenizer monologg/kobigbird-bert-base --bridge-model BAAI/bge-m3 \
        --output /shared/init/splade-v3-ko

The contract (config, result, flags, presets) is ``sembridge_ray.recipes.init.config``; installed, the same
command is ``sembridge init``. """

from __future__ import annotations

import sys

from sembridge_ray.cli import run


def main(argv: list[str] | None = None) -> int:
    return run("init", argv)


if __name__ == "__main__":
    sys.exit(main())
