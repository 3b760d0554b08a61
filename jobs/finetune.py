"""Fine-tune a SparseEncoder with InfoNCE + FLOPs on Ray Train (DDP); resumes from its newest
complete checkpoint.

    ray job submit --runtime-env cluster/runtime_env.yaml --working-dir . -- python -m jobs.finetune --help
The contract (config, result, flags, presets) is ``sembridge_ray.recipes.finetune.config``; installed, the
same command is ``sembridge finetune``."""

from __future__ import annotations

import sys

from sembridge_ray.cli import run


def main(argv: list[str] | None = None) -> int:
    return run("finetune", argv)


if __name__ == "__main__":
    sys.exit(main())
