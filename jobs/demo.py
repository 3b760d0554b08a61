"""Offline demo: encode real SICK sentences with a tiny SPLADE fixture through a Ray Data actor pool.

    ray job submit --working-dir . -- python -m jobs.demo --output outputs/demo
Smoke (2 CPUs, ~30 s):  python -m jobs.demo --config smoke --output /tmp/demo
"""

from __future__ import annotations

import json
import sys

from sembridge_ray.cli import Flag, parse_config, run_job
from sembridge_ray.demo import DemoConfig
from sembridge_ray.presets import PRESET_DIR

FLAGS = [Flag("--output", "output"), Flag("--model", "model"), Flag("--workers", "resources.workers")]


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        cfg = parse_config(DemoConfig, argv, flags=FLAGS, preset_dir=PRESET_DIR, prefix="demo_", description=__doc__)
        from sembridge_ray.distributed.demo import run_demo

        print(json.dumps(run_demo(cfg), indent=2))
        return 0

    return run_job(body)


if __name__ == "__main__":
    sys.exit(main())
