"""MaLSTM (Mueller & Thyagarajan, AAAI 2016) on SICK: STS pretraining, restarts as Ray tasks,
calibration.

    ray job submit --runtime-env cluster/runtime_env.yaml --working-dir . -- python -m jobs.malstm --help
The contract (config, result, flags, presets) is ``sembridge_ray.recipes.malstm.config``; installed, the same
command is ``sembridge malstm``."""

from __future__ import annotations

import sys

from sembridge_ray.cli import run


def main(argv: list[str] | None = None) -> int:
    return run("malstm", argv)


if __name__ == "__main__":
    sys.exit(main())
