"""Evaluate a sparse encoder on a retrieval set: Ray Data encoding, exact sharded top-k, ir-measures
nDCG@10.

    ray job submit --runtime-env cluster/runtime_env.yaml --working-dir . -- python -m jobs.evaluate --help
The contract (config, result, flags, presets) is ``sembridge_ray.recipes.evaluate.config``; installed, the
same command is ``sembridge evaluate``."""

from __future__ import annotations

import sys

from sembridge_ray.cli import run


def main(argv: list[str] | None = None) -> int:
    return run("evaluate", argv)


if __name__ == "__main__":
    sys.exit(main())
