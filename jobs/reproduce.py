"""Reproduce the SemBridge paper's tables (or its offline miniature, --preset demo) as a grid of
cells.

    ray job submit --runtime-env cluster/runtime_env.yaml --working-dir . -- python -m jobs.reproduce --help
The contract (config, result, flags, presets) is ``sembridge_ray.recipes.reproduce.config``; installed, the
same command is ``sembridge reproduce``."""

from __future__ import annotations

import sys

from sembridge_ray.cli import run


def main(argv: list[str] | None = None) -> int:
    return run("reproduce", argv)


if __name__ == "__main__":
    sys.exit(main())
